"""A picture of a run: held-out accuracy and sampled reward per step, and where each step's wall time went.
Written as PNG beside the run's metrics (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from posttrain.tracking import read_metrics

PHASES = ("generate", "reward", "reference", "train", "sync", "other")


def suite_curve(metrics: list[dict], suite: str = "run_reward") -> list[tuple[int, float, float]]:
    """(step, mean, standard error) of the in-loop evaluator's score on a suite, step 0 (the base model) included,
    in step order; the last record of a step wins (a resumed run may evaluate a step twice)."""
    got = {m["step"]: (m[f"eval/{suite}/mean"], m.get(f"eval/{suite}/se", 0.0))
           for m in metrics if f"eval/{suite}/mean" in m}
    return [(step, *got[step]) for step in sorted(got)]


def plot_run(run_dir: str | Path, out: str | Path | None = None, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir)
    steps = [m for m in metrics if "time/step" in m]
    evals = [(m["step"], m["eval/heldout_accuracy"]) for m in metrics if "eval/heldout_accuracy" in m]
    suite = suite_curve(metrics)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    if steps:
        xs = [m["step"] for m in steps]
        window = 10
        rewards = [m["reward_mean"] for m in steps]
        smooth = [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1])
                  for i in range(len(rewards))]
        ax1.plot(xs, smooth, color="tab:blue", alpha=0.7, label=f"sampled reward (mean of last {window} steps)")
    if evals:
        ax1.plot([s for s, _ in evals], [a for _, a in evals], "o-", color="tab:red", label="held-out accuracy (greedy)")
    if suite:
        xs, means, ses = zip(*suite)
        ax1.errorbar(xs, means, yerr=[1.96 * se for se in ses], fmt="s-", color="tab:green", capsize=3,
                     label="held-out reward, in-loop eval (greedy, 95% CI)")
    ax1.set_xlabel("GRPO step")
    ax1.set_ylim(0, 1)
    ax1.grid(alpha=0.3)
    ax1.legend(loc="upper left", fontsize=8)
    ax1.set_title(title or f"{run_dir.name}: learning")
    if steps:
        totals = [sum(m[f"time/{p}"] for m in steps) / len(steps) for p in PHASES]
        left = 0.0
        for phase, t in zip(PHASES, totals):
            ax2.barh([0], [t], left=left, label=f"{phase} {t * 1000:.0f} ms")
            left += t
        ax2.set_yticks([])
        ax2.set_xlabel("seconds per step (mean)")
        ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=8)
        ax2.set_title("where a step's wall time goes")
    fig.tight_layout()
    out = Path(out) if out else run_dir / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
