"""Every algorithm of the family from the same SFT start, seed, batch and step count, side by side: training reward
of the first and last steps, held-out greedy accuracy before and after, and mean step time. Writes
benchmarks/results/algorithms.json and prints a markdown table (the one in README.md and docs/algorithms.md).

    PYTHONPATH=src python benchmarks/algorithms.py --model runs/demo/sft-model          # all algorithms
    PYTHONPATH=src python benchmarks/algorithms.py --model DIR --algorithms grpo,ppo --steps 30

DPO has no rollout: it trains on `steps` batches of verifier-labelled pairs (chosen = the answer, rejected = a
one-digit near miss) from the task's training split, and reports held-out accuracy before and after only.
tests/test_algorithm_runs.py runs the same functions with the test's budget.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # benchmarks/common.py, also when a test loads this file by its path
    sys.path.append(str(HERE))
from common import machine, md_table, run_posttrain, write_json  # noqa: E402

ONLINE = ("grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo")
ALGORITHMS = ONLINE + ("dpo",)


def run_overrides(name: str, model_dir: str, runs_dir: str, steps: int, seed: int, engine: str) -> list[str]:
    """One comparable short run: the algorithm's preset, everything else shared (batch, lr, steps, seed, task)."""
    return [
        f"name={name}", f"runs_dir={runs_dir}", f"model.path={model_dir}", f"seed={seed}", f"algorithm.name={name}",
        # the demo's batch and peak lr (lr 1e-3 collapsed every algorithm within 5 steps here: reward 0.16 -> ~0.05)
        "algorithm.prompts_per_step=32", "algorithm.group_size=8", "algorithm.lr=3e-4",
        "algorithm.lr_schedule=constant", f"train.steps={steps}", f"rollout.engine={engine}",
        "task.heldout_size=200", "eval.every=0", "checkpoint.every=0", "logging.progress=false",
        "ray.num_cpus=4",  # one Ray session shared by every run: room for the largest role set (PPO's)
    ]


def window_means(values: list[float], k: int) -> tuple[float, float]:
    """Mean of the first k and of the last k values."""
    return sum(values[:k]) / k, sum(values[-k:]) / k


PROBE_SAMPLES = 8  # completions per held-out problem in the paired probe (temperature 1)


def probe_rewards(model_dir: str, cfg, problems) -> list[float]:
    """Mean sampled reward per held-out problem: PROBE_SAMPLES completions at temperature 1 with fixed seeds
    (HfEngine in this process). Two models probed on the same problems draw with the same seeds (common random
    numbers), so where their policies agree their samples agree too and the paired difference is low-noise."""
    from posttrain.models.loading import PromptEncoder, load_tokenizer
    from posttrain.rewards.verifier import score_one
    from posttrain.rollout.engine import SamplingSpec
    from posttrain.rollout.hf_engine import HfEngine
    from posttrain.rollout.sampler import prompt_seeds
    from posttrain.tasks import load_task

    task = load_task(cfg.task, cfg.seed)
    encoder = PromptEncoder(load_tokenizer(model_dir), cfg.model.chat_template)
    prompts = [encoder.encode(p.prompt) for p in problems]
    spec = SamplingSpec(n=PROBE_SAMPLES, max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0)
    groups = HfEngine(model_dir).generate(prompts, spec, prompt_seeds(10_000 + cfg.seed, len(prompts)))
    return [sum(score_one(task, p, encoder.decode_completion(c.token_ids)).reward for c in g) / len(g)
            for p, g in zip(problems, groups)]


def paired_gain(before: list[float], after: list[float]) -> dict:
    """Mean per-problem gain after - before, its standard error (problems as the unit) and the ratio."""
    from posttrain.evals.stats import mean_se

    d = mean_se([a - b for a, b in zip(after, before)])
    return {"probe_before": sum(before) / len(before), "probe_after": sum(after) / len(after),
            "probe_gain": d.mean, "probe_gain_se": d.se, "probe_z": d.mean / d.se if d.se > 0 else 0.0}


def final_model(run_dir: Path) -> str:
    return str(max((Path(run_dir) / "checkpoints").glob("step_*")) / "model")


_probe_cache: dict = {}


def probe_gain(cfg, start_model: str, trained_model: str) -> dict:
    """The paired probe on the task's held-out problems: the start model's rewards are computed once per start."""
    from posttrain.tasks import load_task

    problems = load_task(cfg.task, cfg.seed).heldout
    key = (start_model, cfg.task.model_dump_json(), cfg.seed, cfg.rollout.max_new_tokens)
    if key not in _probe_cache:
        _probe_cache[key] = probe_rewards(start_model, cfg, problems)
    return paired_gain(_probe_cache[key], probe_rewards(trained_model, cfg, problems))


def run_online(name: str, model_dir: str, runs_dir: str, steps: int, seed: int, engine: str, k: int,
               extra: tuple[str, ...] = (), probe: bool = True) -> dict:
    """One run of an online algorithm; `extra` overrides go last (the test's objective); `probe`: measure the
    paired held-out probe (start vs final model)."""
    run = run_posttrain([*run_overrides(name, model_dir, runs_dir, steps, seed, engine), *extra])
    cfg, summary, wall, metrics = run.cfg, run.summary, run.train_seconds, run.steps
    first, last = window_means([m["reward_mean"] for m in metrics], k)
    return {
        "algorithm": name, "steps": steps, "reward_first_k": first, "reward_last_k": last, "k": k,
        "reward_curve": [round(m["reward_mean"], 4) for m in metrics],
        "heldout_before": summary["heldout_accuracy_before"], "heldout_after": summary["heldout_accuracy_after"],
        "mean_step_seconds": summary["mean_step_seconds"], "run_wall_seconds": wall,
        **(probe_gain(cfg, model_dir, final_model(cfg.run_dir)) if probe else {}), "needs": needs(name),
    }


def run_dpo_bench(model_dir: str, runs_dir: str, steps: int, seed: int) -> dict:
    from posttrain.config import load_config
    from posttrain.tasks import load_task
    from posttrain.training.dpo import pairs_from_task, run_dpo, write_pairs

    base = run_overrides("dpo", model_dir, runs_dir, steps, seed, "hf")
    cfg = load_config(None, base)
    task = load_task(cfg.task, cfg.seed)
    pairs = write_pairs(pairs_from_task(task.train, 4096, seed), Path(runs_dir) / "dpo-pairs.jsonl")
    cfg = load_config(None, [*base, f"dpo.pairs={pairs}", "algorithm.dpo_beta=0.1"])
    t0 = time.perf_counter()
    s = run_dpo(cfg, log=lambda m: None)
    return {
        "algorithm": "dpo", "steps": steps, "pairs": s["pairs"], "heldout_before": s["heldout_accuracy_before"],
        "heldout_after": s["heldout_accuracy_after"], "mean_step_seconds": s["mean_step_seconds"],
        "run_wall_seconds": time.perf_counter() - t0, "needs": needs("dpo"),
    }


def needs(name: str) -> dict:
    from posttrain.config.algorithm_presets import GROUP_ALGORITHMS

    return {"critic": name == "ppo", "groups": name in GROUP_ALGORITHMS,
            "reference": "loss KL" if name in ("grpo", "dr_grpo", "rloo") else "reward KL" if name in (
                "ppo", "reinforce_pp") else "required" if name == "dpo" else "none",
            "online_rollout": name != "dpo"}


def markdown_table(rows: list[dict]) -> str:
    return md_table(
        ["algorithm", "train reward first→last k steps", "held-out acc before → after", "mean step (s)"],
        [[r["algorithm"],
          f"{r['reward_first_k']:.3f} → {r['reward_last_k']:.3f}" if "reward_first_k" in r else "— (offline)",
          f"{100 * r['heldout_before']:.1f}% → {100 * r['heldout_after']:.1f}%", f"{r['mean_step_seconds']:.3f}"]
         for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="SFT-warm-started model directory (the common start)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--k", type=int, default=5, help="steps averaged at each end of the reward curve")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine", default="hf", choices=("hf", "vllm"))
    ap.add_argument("--runs-dir", default="runs/bench-algorithms")
    ap.add_argument("--out", default=str(HERE / "results" / "algorithms.json"))
    args = ap.parse_args(argv)

    from posttrain.config import RayConfig
    from posttrain.orchestration.runtime import start_ray, stop_ray

    names = [n for n in args.algorithms.split(",") if n]
    rows = []
    start_ray(RayConfig(num_cpus=4), 4)
    try:
        for name in names:
            print(f"== {name}", file=sys.stderr, flush=True)
            row = (run_dpo_bench(args.model, args.runs_dir, args.steps, args.seed) if name == "dpo"
                   else run_online(name, args.model, args.runs_dir, args.steps, args.seed, args.engine, args.k))
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        stop_ray()
    result = {"machine": machine(), "seed": args.seed,
              "steps": args.steps, "engine": args.engine, "batch": "32 prompts x 8 samples", "rows": rows}
    write_json(args.out, result)
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
