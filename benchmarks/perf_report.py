"""docs/performance.md's generated block from benchmarks/results/perf.json: a markdown table with the targets, the
matched settings side by side, and docs/perf.png (step time vs TRL, the step split, sync time against model size,
reward curves of synchronous vs one-step-off rollout). Called by benchmarks/perf.py; `make readme`
(scripts/sync_readme.py) rewrites the block from the committed JSON without redrawing the plot."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
RESULTS = ROOT / "benchmarks" / "results" / "perf.json"
PLOT = ROOT / "docs" / "perf.png"
KEYS = ("generate", "reward", "reference", "train", "sync", "other")


def _f(x, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" ✅" if ok else " ❌")


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    return None if not xs else (xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2)


def split_median(row: dict, field: str = "split_median_s") -> dict:
    """posttrain's step split (or share) per phase: the median over the rounds."""
    runs = row.get("posttrain", [])
    return {k: _median([r[field][k] for r in runs]) for k in KEYS} if runs else {}


def side_median(row: dict, side: str, key: str):
    return _median([r.get(key) for r in row.get(side, [])])


def workloads(res: dict) -> dict:
    return res.get("trl", {}).get("workloads", {})


def ratio_cell(row: dict) -> str:
    if not row.get("round_ratios"):
        return "—"
    rounds = " / ".join(f"{x:.2f}" for x in row["round_ratios"])
    return f"**{row['ratio']:.2f}** [{row['ratio_min']:.2f}–{row['ratio_max']:.2f}] (rounds: {rounds})"


def workload_table(name: str, wl: dict, res: dict) -> str:
    sizes = wl["sizes"]
    rows = [f"**Workload `{name}`**: {wl['description']}. {wl.get('rounds', '?')} alternating rounds, "
            f"{wl.get('steps', '?')} measured steps per run; measured on {wl.get('machine', 'an unrecorded machine')}.", "",
            "| | " + " | ".join(f"{s} ({sizes[s]['params'] / 1e6:.1f}M params)" for s in sizes) + " |",
            "|---|" + "---|" * len(sizes)]

    def row(label, fn):
        rows.append(f"| {label} | " + " | ".join(fn(s) for s in sizes) + " |")

    row("posttrain median step (s)", lambda s: _f(sizes[s].get("posttrain_median_step_s")))
    row("TRL GRPOTrainer median step (s)", lambda s: _f(sizes[s].get("trl_median_step_s")))
    row("**step ratio posttrain / TRL**: median [range] over rounds (target ≤ 0.25 on 80m)",
        lambda s: ratio_cell(sizes[s]) + _mark(sizes[s]["ratio"] <= 0.25 if s == "80m" and "ratio" in sizes[s] else None))
    row("tokens/s end to end, posttrain / TRL", lambda s: f"{_f(side_median(sizes[s], 'posttrain', 'tokens_per_s'), '{:.0f}')}"
        f" / {_f(side_median(sizes[s], 'trl', 'tokens_per_s'), '{:.0f}')}")
    row("mean completion length, posttrain / TRL (tokens)",
        lambda s: f"{_f(side_median(sizes[s], 'posttrain', 'completion_mean_length'), '{:.1f}')} / "
        f"{_f(side_median(sizes[s], 'trl', 'completion_mean_length'), '{:.1f}')}")
    row("step split (median s): " + " / ".join(KEYS),
        lambda s: " / ".join(_f(split_median(sizes[s]).get(k), "{:.2f}") for k in KEYS) if sizes[s].get("posttrain") else "—")
    if name != "addition":
        return "\n".join(rows)
    roll, sync = res.get("rollout", {}), res.get("sync", {})
    row("**rollout: posttrain in the loop / raw vLLM `LLM.generate`** (target ≥ 90%)",
        lambda s: (f"{_f(roll.get(s, {}).get('posttrain_rollout_tokens_per_s'), '{:.0f}')} / "
                   f"{_f(roll.get(s, {}).get('raw_vllm_tokens_per_s'), '{:.0f}')} tok/s = "
                   f"{_f(100 * roll[s]['share_of_raw'] if roll.get(s, {}).get('share_of_raw') else None, '{:.0f}')}%"
                   + _mark(roll[s]['share_of_raw'] >= 0.9 if roll.get(s, {}).get('share_of_raw') else None)))
    row("**loop overhead: `other` share of the step** (target ≤ 5%)",
        lambda s: _f(100 * split_median(sizes[s], "split_share")["other"], "{:.1f}%")
        + _mark(split_median(sizes[s], "split_share")["other"] <= 0.05) if sizes[s].get("posttrain") else "—")
    row("**weight sync: share of the step** (target ≤ 5%), median s",
        lambda s: (_f(100 * split_median(sizes[s], "split_share")["sync"], "{:.1f}%")
                   + _mark(split_median(sizes[s], "split_share")["sync"] <= 0.05)
                   + f", {split_median(sizes[s])['sync']:.3f} s") if sizes[s].get("posttrain") else "—")
    row("sync through Ray, trainer actor to engine actor (median s): safetensors bytes / array payload (of which "
        "engine load)",
        lambda s: f"{sync[s]['ray_safetensors_s']:.3f} / {sync[s]['ray_arrays_s']:.3f} ({sync[s]['engine_load_s']:.3f})"
        f", {sync[s]['bytes'] / 1e6:.0f} MB" if s in sync and "ray_arrays_s" in sync[s] else "—")
    return "\n".join(rows)


def table(res: dict) -> str:
    t = res.get("trl", {})
    parts = [workload_table(name, wl, res) for name, wl in workloads(res).items()]
    if parts:
        parts.insert(0, "Each round runs both sides back to back and flips which side goes first; a round's ratio is "
                     "posttrain's median step over TRL's in that round (after one warm-up step per run).")
    out = "\n\n".join(parts)
    elsewhere = {x.get("machine") for x in (res.get("rollout", {}), res.get("sync", {})) if x}
    if elsewhere:
        out += ("\n\nThe rollout and sync rows were measured on " + " and ".join(
            sorted(str(e or "an unrecorded machine") for e in elsewhere)) + ".")
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
                + " / ".join(a.get("speedup_modes", ["sync", "async"])) + f"; measured on "
                f"{a.get('machine', 'an unrecorded machine')}).")
    if t.get("matched_settings"):
        out += "\n\n| matched setting | posttrain | TRL GRPOTrainer |\n|---|---|---|\n" + "\n".join(
            f"| {m['setting']} | {m['posttrain']} | {m['trl']} |" for m in t["matched_settings"])
    if t.get("trl_non_default_settings"):
        out += ("\n\nEvery TRL `GRPOConfig` field the benchmark sets away from its declared default: " + "; ".join(
            f"`{k}` {v}" for k, v in t["trl_non_default_settings"].items()) + ".")
    m = res.get("machine", {})
    if m:
        v = m["versions"]
        gpu = "not run" if str(m.get("gpu", "")).startswith("not run") else m.get("gpu")
        trl_v = next((r["trl"][0]["versions"]["trl"] for wl in workloads(res).values() for r in wl["sizes"].values()
                      if r.get("trl")), "—")
        out += (f"\n\nLast `make bench` machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; torch {v['torch']}, vllm "
                f"{v['vllm']}, transformers {v['transformers']}, ray {v['ray']}, trl {trl_v}. GPU: {gpu}.")
    return out


def plot(res: dict, path: Path = PLOT) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pairs = [(w, size, row) for w, wl in workloads(res).items() for size, row in wl["sizes"].items()]
    trl = workloads(res).get("addition", {}).get("sizes", {})
    a = res.get("async")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    xs = list(range(len(pairs)))
    bottom = [0.0] * len(pairs)
    for k in KEYS:
        vals = [split_median(row).get(k) or 0.0 for _w, _s, row in pairs]
        ax.bar([x - 0.2 for x in xs], vals, 0.4, bottom=bottom, label=f"posttrain: {k}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.bar([x + 0.2 for x in xs], [row["trl_median_step_s"] for _w, _s, row in pairs], 0.4, color="grey",
           label="TRL step")
    for x, (_w, _s, row) in zip(xs, pairs):
        ax.annotate(f"{row['ratio']:.2f}× [{row['ratio_min']:.2f}–{row['ratio_max']:.2f}]", (x, max(bottom[x],
                    row["trl_median_step_s"])), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [f"{w}\n{s} ({row['params'] / 1e6:.0f}M)" for w, s, row in pairs], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("seconds per step (log)")
    ax.set_title("step: posttrain split vs TRL (ratio: median [range] of rounds)", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[1]
    params = [trl[s]["params"] / 1e6 for s in trl]
    ax.plot(params, [split_median(trl[s])["sync"] for s in trl], "o-", label="weight sync (s)")
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


def markdown(res: dict) -> str:
    """The block's markdown: the tables, and the plot's link (relative to docs/) when there is a plot."""
    md = table(res)
    if workloads(res):
        md += "\n\n![performance](perf.png)"
    return md


def replace_block(text: str, md: str) -> str:
    if "<!-- perf:start -->" not in text:
        raise ValueError(f"no <!-- perf:start/end --> markers in {DOC}")
    block = f"<!-- perf:start -->\n{md}\n<!-- perf:end -->"
    return re.sub(r"<!-- perf:start -->.*?<!-- perf:end -->", lambda _m: block, text, flags=re.S)


def write_report(res: dict) -> str:
    """Writes docs/perf.png and the block between the perf markers of docs/performance.md; returns the markdown."""
    md = markdown(res)
    if workloads(res):
        plot(res)
    DOC.write_text(replace_block(DOC.read_text(), md))
    return md
