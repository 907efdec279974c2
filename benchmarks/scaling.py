"""Throughput of the loop with 1 vs 2 rollout engines and 1 vs 2 trainer ranks (FSDP2 over gloo), same config and
global batch otherwise: mean step time, generation tokens/s, trained tokens/s, and the weight-sync time to M
engines. Writes benchmarks/results/scaling.json and prints the markdown table of the README's scale-out section.

    PYTHONPATH=src python benchmarks/scaling.py                       # builds a tiny model, HF engines
    PYTHONPATH=src python benchmarks/scaling.py --model DIR --engine vllm --steps 6

Each rank and each engine is one "device" here: topology.torch_threads=1, so 2 ranks use 2 cores where 1 rank uses
one. The first step of each run (warm-up) is left out of the means.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import machine, md_table, run_posttrain, write_json

LAYOUTS = ((1, 1), (1, 2), (2, 1), (2, 2))  # (trainer ranks, engines)


def run_overrides(model_dir: str, runs_dir: str, ranks: int, engines: int, steps: int, engine: str) -> list[str]:
    return [
        f"name=scale-r{ranks}-e{engines}", f"runs_dir={runs_dir}", f"model.path={model_dir}",
        "algorithm.prompts_per_step=16", "algorithm.group_size=8", "algorithm.skip_zero_variance_groups=false",
        "algorithm.kl_coef=0.02", "algorithm.lr_schedule=constant", f"train.steps={steps}", f"rollout.engine={engine}",
        "rollout.max_new_tokens=8", "task.heldout_size=16", "eval.every=0", "checkpoint.every=0",
        "logging.progress=false", "topology.torch_threads=1", f"topology.trainer_ranks={ranks}",
        f"rollout.num_workers={engines}", "ray.num_cpus=6",
    ]


def run_layout(model_dir: str, runs_dir: str, ranks: int, engines: int, steps: int, engine: str) -> dict:
    run = run_posttrain(run_overrides(model_dir, runs_dir, ranks, engines, steps, engine))
    cfg, wall = run.cfg, run.train_seconds
    m = run.steps[1:]  # without the warm-up step

    def mean(key: str) -> float:
        return sum(r[key] for r in m) / len(m)

    samples = cfg.algorithm.prompts_per_step * cfg.algorithm.group_size
    gen_tokens = mean("response_length") * samples
    return {"trainer_ranks": ranks, "engines": engines, "steps_measured": len(m), "step_s": mean("time/step"),
            "generate_s": mean("time/generate"), "train_s": mean("time/train"), "sync_s": mean("time/sync"),
            "gen_tokens_per_s": gen_tokens / mean("time/generate"), "train_tokens_per_s": gen_tokens / mean("time/train"),
            "loss_curve": [r["loss"] for r in m], "run_wall_s": wall}


def markdown_table(rows: list[dict]) -> str:
    return md_table(
        ["trainer ranks", "engines", "step (s)", "generate (s)", "gen tok/s", "train (s)", "train tok/s", "sync (s)"],
        [[r["trainer_ranks"], r["engines"], f"{r['step_s']:.3f}", f"{r['generate_s']:.3f}",
          f"{r['gen_tokens_per_s']:.0f}", f"{r['train_s']:.3f}", f"{r['train_tokens_per_s']:.0f}", f"{r['sync_s']:.3f}"]
         for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF model directory (default: a tiny one built here)")
    ap.add_argument("--size", default="4m", help="tiny model size when --model is not given (1m, 4m, 80m)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--engine", default="hf", choices=("hf", "vllm"))
    ap.add_argument("--runs-dir", default="runs/bench-scaling")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "scaling.json"))
    args = ap.parse_args(argv)

    from posttrain.config import RayConfig
    from posttrain.orchestration.runtime import start_ray, stop_ray

    model = args.model
    if model is None:
        from posttrain.models.tiny import build_tiny_model

        model = str(build_tiny_model(Path(tempfile.mkdtemp()) / f"tiny-{args.size}", args.size, seed=0))
    rows = []
    start_ray(RayConfig(num_cpus=6), 6)
    try:
        for ranks, engines in LAYOUTS:
            rows.append(run_layout(model, args.runs_dir, ranks, engines, args.steps, args.engine))
            print(markdown_table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        stop_ray()
    result = {"machine": machine(), "engine": args.engine,
              "model": args.model or f"tiny {args.size} (built by the benchmark)", "steps": args.steps,
              "batch": "16 prompts x 8 samples, 8 new tokens", "torch_threads_per_rank": 1,
              "gpu": "not run: this task has no GPU machine", "rows": rows}
    write_json(args.out, result, end="")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
