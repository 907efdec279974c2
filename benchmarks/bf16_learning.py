"""model.dtype=bfloat16 against float32 where it matters to a user: does the real-model example still learn? The
real-model workload (examples/real-model: SmolLM2-135M-Instruct, single-digit additions, GRPO on vLLM), the same
config, steps and seeds in each dtype; per run the held-out curve (the run's own eval of the `correct` reward every
eval.every steps), the step seconds, the engine-vs-trainer logprob gap, and the first step 10 points above the start.
bfloat16 needs a CPU with native bfloat16 (AVX512-BF16 or AMX): elsewhere the run is refused at start.

    python benchmarks/bf16_learning.py [--steps 10] [--seeds 0 1 2] [--sides float32 bfloat16 bfloat16_lr1e-4]

Needs what benchmarks/async_modes.py needs (the imported model in runs/smollm2 and the example's data). Runs go one
after another in child processes (`posttrain train`), the dtypes taking turns going first each seed. Writes
benchmarks/results/bf16_learning.json; docs/real-models.md's table is made from it (--table).
"""

from __future__ import annotations

from pathlib import Path

from async_modes import run_example
from common import bench_main, log_to, md_table, median

RESULTS = Path(__file__).resolve().parent / "results" / "bf16_learning.json"
# each side: its overrides of the example's config. Pure bfloat16 weights round away AdamW updates below ~1/256 of
# a weight (docs/real-models.md), so bfloat16 is also run at a learning rate 3.3x the example's 3e-5.
SIDES = {"float32": ["model.dtype=float32"], "bfloat16": ["model.dtype=bfloat16"],
         "bfloat16_lr1e-4": ["model.dtype=bfloat16", "algorithm.lr=1e-4"]}
log = log_to("bf16")


def run_side(side: str, seed: int, steps: int) -> dict:
    return {"side": side, **run_example(f"bench-bf16-{side}-s{seed}", seed, steps, SIDES[side])}


def table(results: dict) -> str:
    rows = []
    for side in SIDES:
        runs = sorted((r for r in results["runs"] if r["side"] == side and "error" not in r), key=lambda r: r["seed"])
        if not runs:
            continue
        curves = [" -> ".join(f"{r['heldout'][k]:.3f}" for k in sorted(r["heldout"], key=int)) for r in runs]
        rows.append([side, " / ".join(str(r["seed"]) for r in runs), " / ".join(curves),
                     f"{median(r['step_s_mean'] for r in runs):.1f}",
                     " / ".join(str(r["gain_step"]) for r in runs),
                     f"{median(r['logprob_gap_mean'] for r in runs):.2e}"])
    return md_table(["side", "seeds", "held-out curve (per seed)", "step s (median)",
                     "first step +10 points (per seed)", "engine-trainer logprob gap (mean)"], rows)


def main() -> None:
    bench_main(__doc__, SIDES, "side", RESULTS, table, run_side, log)


if __name__ == "__main__":
    main()
