"""The README's performance section from benchmarks/results/perf.json: a markdown table with the targets, the
matched settings side by side, and docs/perf.png (step time vs TRL, the step split, sync time against model size,
reward curves of synchronous vs one-step-off rollout). Called by benchmarks/perf.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PLOT = ROOT / "docs" / "perf.png"
KEYS = ("generate", "reward", "reference", "train", "sync", "other")


def _f(x, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" ✅" if ok else " ❌")


def table(res: dict) -> str:
    trl = res.get("trl", {}).get("sizes", {})
    roll = res.get("rollout", {})
    sizes = list(trl) or list(roll)
    rows = ["| | " + " | ".join(f"{s} ({trl.get(s, {}).get('params', 0) / 1e6:.1f}M params)" for s in sizes) + " |",
            "|---|" + "---|" * len(sizes)]

    def row(name, fn):
        rows.append(f"| {name} | " + " | ".join(fn(s) for s in sizes) + " |")

    def pt(s):
        runs = trl.get(s, {}).get("posttrain", [])
        return runs[0] if runs else {}

    row("posttrain median step (s)", lambda s: _f(trl.get(s, {}).get("posttrain_median_step_s")))
    row("TRL GRPOTrainer median step (s)", lambda s: _f(trl.get(s, {}).get("trl_median_step_s")))
    row("**step ratio posttrain / TRL** (target ≤ 0.25 on 80m)",
        lambda s: _f(trl.get(s, {}).get("ratio")) + _mark(trl[s]["ratio"] <= 0.25 if s == "80m" and s in trl else None))
    row("tokens/s end to end, posttrain / TRL", lambda s: f"{_f(pt(s).get('tokens_per_s'), '{:.0f}')} / "
        f"{_f((trl.get(s, {}).get('trl') or [{}])[0].get('tokens_per_s'), '{:.0f}')}")
    row("mean completion length, posttrain / TRL (tokens)", lambda s: f"{_f(pt(s).get('completion_mean_length'), '{:.1f}')} / "
        f"{_f((trl.get(s, {}).get('trl') or [{}])[0].get('completion_mean_length'), '{:.1f}')}")
    row("**rollout: posttrain in the loop / raw vLLM `LLM.generate`** (target ≥ 90%)",
        lambda s: (f"{_f(roll.get(s, {}).get('posttrain_rollout_tokens_per_s'), '{:.0f}')} / "
                   f"{_f(roll.get(s, {}).get('raw_vllm_tokens_per_s'), '{:.0f}')} tok/s = "
                   f"{_f(100 * roll[s]['share_of_raw'] if roll.get(s, {}).get('share_of_raw') else None, '{:.0f}')}%"
                   + _mark(roll[s]['share_of_raw'] >= 0.9 if roll.get(s, {}).get('share_of_raw') else None)))
    row("**loop overhead: `other` share of the step** (target ≤ 5%)",
        lambda s: _f(100 * pt(s)["split_share"]["other"], "{:.1f}%") + _mark(pt(s)["split_share"]["other"] <= 0.05)
        if pt(s) else "—")
    row("**weight sync: share of the step** (target ≤ 5%), median s",
        lambda s: (_f(100 * pt(s)["split_share"]["sync"], "{:.1f}%") + _mark(pt(s)["split_share"]["sync"] <= 0.05)
                   + f", {pt(s)['sync_median_s']:.3f} s") if pt(s) else "—")
    sync = res.get("sync", {})
    row("sync through Ray, trainer actor to engine actor (median s): safetensors bytes / array payload (of which "
        "engine load)",
        lambda s: f"{sync[s]['ray_safetensors_s']:.3f} / {sync[s]['ray_arrays_s']:.3f} ({sync[s]['engine_load_s']:.3f})"
        f", {sync[s]['bytes'] / 1e6:.0f} MB" if s in sync and "ray_arrays_s" in sync[s] else "—")
    row("step split (median s): " + " / ".join(KEYS),
        lambda s: " / ".join(_f(pt(s)["split_median_s"][k], "{:.2f}") for k in KEYS) if pt(s) else "—")
    out = "\n".join(rows)
    a = res.get("async")
    if a:
        modes = [m for m in ("sync", "async", "sync_1thread", "async_1thread") if m in a]
        cols = {"sync": "synchronous", "async": "one-step-off", "sync_1thread": "synchronous, 1 torch thread",
                "async_1thread": "one-step-off, 1 torch thread"}
        out += ("\n\n| built-in task, demo batch, SFT start | " + " | ".join(cols[m] for m in modes) + " |\n|---|"
                + "---|" * len(modes) + "\n"
                + "| median step (s), steps 3+ | " + " | ".join(f"{a[m]['median_step_s']:.3f}" for m in modes) + " |\n"
                + f"| train reward, first → last {a['k']} steps | " + " | ".join(
                    f"{a[m]['reward_first_k']:.3f} → {a[m]['reward_last_k']:.3f}" for m in modes) + " |\n"
                + f"| held-out accuracy before → after {a['steps']} steps | " + " | ".join(
                    f"{100 * a[m]['heldout_before']:.1f}% → {100 * a[m]['heldout_after']:.1f}%" for m in modes) + " |\n"
                + "| staleness (max) | " + " | ".join(str(max(a[m]["staleness"])) for m in modes) + " |\n"
                + f"\n**Async speedup: {a['speedup']:.2f}×** (best synchronous / best one-step-off median step: "
                + " / ".join(a.get("speedup_modes", ["sync", "async"])) + ").")
    if res.get("trl", {}).get("matched_settings"):
        out += "\n\n| matched setting | posttrain | TRL GRPOTrainer |\n|---|---|---|\n" + "\n".join(
            f"| {m['setting']} | {m['posttrain']} | {m['trl']} |" for m in res["trl"]["matched_settings"])
    m = res.get("machine", {})
    if m:
        v = m["versions"]
        trl_v = next((r["trl"][0]["versions"]["trl"] for r in trl.values() if r.get("trl")), "—")
        out += (f"\n\nMachine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; torch {v['torch']}, vllm "
                f"{v['vllm']}, transformers {v['transformers']}, ray {v['ray']}, trl {trl_v}. GPU: {m['gpu']}.")
    return out


def plot(res: dict, path: Path = PLOT) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    trl = res.get("trl", {}).get("sizes", {})
    a = res.get("async")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    bottom = {s: 0.0 for s in trl}
    xs = list(range(len(trl)))
    for k in KEYS:
        vals = [trl[s]["posttrain"][0]["split_median_s"][k] if trl[s]["posttrain"] else 0 for s in trl]
        ax.bar([x - 0.2 for x in xs], vals, 0.4, bottom=[bottom[s] for s in trl], label=f"posttrain: {k}")
        for s, v in zip(trl, vals):
            bottom[s] += v
    ax.bar([x + 0.2 for x in xs], [trl[s]["trl_median_step_s"] for s in trl], 0.4, color="grey", label="TRL step")
    ax.set_xticks(xs, [f"{s} ({trl[s]['params'] / 1e6:.0f}M)" for s in trl])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per step (log)")
    ax.set_title("step: posttrain split vs TRL GRPOTrainer")
    ax.legend(fontsize=7)
    ax = axes[1]
    params = [trl[s]["params"] / 1e6 for s in trl]
    ax.plot(params, [trl[s]["posttrain"][0]["sync_median_s"] for s in trl], "o-", label="weight sync (s)")
    ax.plot(params, [trl[s]["posttrain_median_step_s"] for s in trl], "s--", label="whole step (s)")
    sync = res.get("sync", {})
    if all("ray_arrays_s" in sync.get(s, {}) for s in trl):
        ax.plot(params, [sync[s]["ray_safetensors_s"] for s in trl], "^:", label="sync with safetensors bytes (s)")
        ax.plot(params, [sync[s]["engine_load_s"] for s in trl], "v:", label="of which engine load (s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters (M)")
    ax.set_title("weight sync against model size")
    ax.legend(fontsize=8)
    ax = axes[2]
    if a:
        for mode in [m for m in ("sync", "async", "sync_1thread", "async_1thread") if m in a]:
            c = a[mode]["reward_curve"]
            ax.plot(range(1, len(c) + 1), c, label=f"{mode}: {a[mode]['median_step_s']:.2f} s/step")
        ax.set_xlabel("step")
        ax.set_ylabel("train reward (mean)")
        ax.set_title(f"one-step-off vs synchronous ({a['speedup']:.2f}× faster)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(res: dict) -> str:
    """Writes docs/perf.png and the README block between the perf markers; returns the markdown."""
    md = table(res)
    if res.get("trl", {}).get("sizes"):
        plot(res)
        md += "\n\n![performance](docs/perf.png)"
    block = f"<!-- perf:start -->\n{md}\n<!-- perf:end -->"
    text = README.read_text()
    if "<!-- perf:start -->" in text:
        text = re.sub(r"<!-- perf:start -->.*?<!-- perf:end -->", lambda _m: block, text, flags=re.S)
        README.write_text(text)
    return md
