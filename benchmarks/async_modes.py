"""Asynchronous rollout and off-policy correction on the real-model workload (examples/real-model: SmolLM2-135M-
Instruct learns single-digit additions, GRPO on vLLM): each mode of rollout.max_staleness (and partial rollouts),
with and without algorithm.rollout_correction, on the same config, steps and seeds. Per run: wall seconds of the
steps, the mean step, the held-out curve (the run's own eval of the `correct` reward, every eval.every steps), the
first step whose held-out score is 10 points above the start and the step seconds spent until then, and the mismatch
metrics (k3 KL, perplexity ratio, share capped or masked) and staleness averaged over the steps.

    python benchmarks/async_modes.py [--steps 10] [--seeds 0 1 2] [--modes sync k1 k2 k2_tis ...]

Needs `posttrain model import smollm2 runs/smollm2` and `python examples/real-model/make_data.py` first (the example's
run.sh does both). Writes benchmarks/results/async_modes.json; docs/async.md's table is made from it (--table).
Runs go one after another in child processes (`posttrain train`), in the order the modes are given, rotated each
seed so that drift on a shared machine falls on every mode alike.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import bench_main, first_at_target, log_to, md_table, median

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "real-model" / "config.yaml"
RESULTS = Path(__file__).resolve().parent / "results" / "async_modes.json"
log = log_to("async")

TIS = ["algorithm.rollout_correction.mode=tis"]
MIS = ["algorithm.rollout_correction.mode=mis"]
MODES = {
    "sync": [], "sync_tis": TIS,
    "k1": ["rollout.max_staleness=1"], "k1_tis": ["rollout.max_staleness=1", *TIS],
    "k2": ["rollout.max_staleness=2"], "k2_tis": ["rollout.max_staleness=2", *TIS],
    "k2_mis": ["rollout.max_staleness=2", *MIS],
    "k2_partial": ["rollout.max_staleness=2", "rollout.partial_rollouts=true"],
    "k2_partial_tis": ["rollout.max_staleness=2", "rollout.partial_rollouts=true", *TIS],
}


def run_mode(mode: str, seed: int, steps: int) -> dict:
    return {"mode": mode, **run_example(f"bench-async-{mode}-s{seed}", seed, steps, MODES[mode])}


def run_example(name: str, seed: int, steps: int, overrides: list[str], summarize_records=None) -> dict:
    """One `posttrain train` of the real-model example in a child process, `overrides` on top: its wall seconds
    and the figures `summarize_records` (default: summarize) makes of its metrics records, or its error and exit
    code."""
    overrides = [f"name={name}", f"seed={seed}", f"train.steps={steps}", "eval.every=5", "checkpoint.every=0",
                 "logging.progress=false", *overrides]
    shutil.rmtree(ROOT / "runs" / name, ignore_errors=True)  # a rerun starts afresh (a failed one left its checkpoints)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", str(CONFIG), *overrides], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"seed": seed, "error": proc.stderr[-2000:], "exit": proc.returncode}
    records = [json.loads(line) for line in (ROOT / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return {"seed": seed, "wall_s": wall, **(summarize_records or summarize)(records)}


def summarize(records: list[dict]) -> dict:
    steps = [r for r in records if "time/step" in r]
    curve = {r["step"]: r["eval/score"] for r in records if "eval/score" in r}
    gain_step, to_gain = first_at_target(curve, {r["step"]: r["time/step"] for r in steps}, 0.10)

    def mean_of(key):
        values = [r[key] for r in steps if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    return {"steps_s": sum(r["time/step"] for r in steps), "step_s_mean": mean_of("time/step"),
            "generate_exposed_s_mean": mean_of("time/generate"), "train_s_mean": mean_of("time/train"),
            "logprob_gap_mean": mean_of("logprob_gap_mean"),
            "heldout": {str(k): v for k, v in curve.items()},  # str keys, as JSON keeps them
            "gain_step": gain_step, "step_s_to_gain": to_gain,
            **{k.split("/")[-1]: mean_of(k) for k in ("mismatch/k3_kl", "mismatch/ppl_ratio", "mismatch/capped_share",
                                                      "mismatch/masked_share", "rollout/staleness")}}


def table(results: dict) -> str:
    rows = []
    for mode in MODES:
        runs = sorted((r for r in results["runs"] if r["mode"] == mode and "error" not in r), key=lambda r: r["seed"])
        if not runs:
            continue
        last = [r["heldout"][max(r["heldout"], key=int)] for r in runs]
        first = [r["heldout"].get("0") for r in runs]
        rows.append([mode, len(runs), f"{median(r['step_s_mean'] for r in runs):.1f}",
                     f"{median(r['steps_s'] for r in runs):.0f}",
                     " / ".join(f"{a:.3f} -> {b:.3f}" for a, b in zip(first, last)),
                     " / ".join(str(r["step_s_to_gain"] and round(r["step_s_to_gain"])) for r in runs),
                     f"{median(r['k3_kl'] for r in runs):.2e}", f"{median(r['staleness'] for r in runs) or 0:.2f}",
                     f"{median(r['capped_share'] for r in runs) or 0:.3f} / {median(r['masked_share'] for r in runs) or 0:.3f}"])
    return md_table(["mode", "seeds", "step s (median)", "steps s", "held-out start -> end (per seed)",
                     "step s to +10 points (per seed)", "k3 KL", "staleness", "capped / masked"], rows)


def main() -> None:
    bench_main(__doc__, MODES, "mode", RESULTS, table, run_mode, log)


if __name__ == "__main__":
    main()
