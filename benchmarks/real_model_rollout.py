"""Generation on the real model: posttrain's rollout path against vLLM's own offline throughput (issue "A real model
gets better at a real task", item 5; target >= 90%). Same machine, same model, same prompts (the run's first N
training prompts, encoded by the run's own template), same seeds (the probe's), n, max tokens and temperature, in
alternating rounds:

- posttrain: `posttrain probe CONFIG --no-train-step` (a Ray rollout actor with the run's engine settings, one
  warm-up request, then one timed `generate_on_workers` call: the tokens/s in its probe.json);
- vLLM alone: benchmarks/perf_raw_vllm.py (`LLM.generate` in a child process, no Ray, no posttrain) on those
  prompt ids and seeds, with the rollout actor's environment (threads, KV cache), one warm-up pass.

    .venv/bin/python benchmarks/real_model_rollout.py --config examples/real-model/config.yaml \
        --model runs/smollm2 --data runs/real-model-data --prompts 64 --rounds 3

Writes benchmarks/results/real_model_rollout.json (each round's tokens/s, the medians, their ratio, `lscpu`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import lscpu, median, run_spec, write_json

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def overrides(args, name: str) -> list[str]:
    return [f"name={name}", f"runs_dir={args.runs_dir}", f"model.path={args.model}",
            f"task.path={args.data}/train.jsonl", f"task.heldout_path={args.data}/test.jsonl"]


def posttrain_round(args, i: int) -> dict:
    name = f"rollout-bench-{i}"
    subprocess.run([str(BIN / "posttrain"), "probe", args.config, *overrides(args, name), "--prompts",
                    str(args.prompts), "--k", str(args.k), "--no-train-step"], check=False, capture_output=True)
    probe = json.loads((Path(args.runs_dir) / name / "probe.json").read_text())
    return {"tokens_per_s": probe["tokens_per_s"], "seconds": probe["generate_seconds"]}


def raw_spec(args) -> dict:
    from posttrain.config import load_config
    from posttrain.probe import PROBE_STEP, _prepare
    from posttrain.rollout.sampler import sample_seed

    cfg = load_config(args.config, overrides(args, "rollout-bench-spec"))
    task, encoder = _prepare(cfg)
    problems = task.train[: args.prompts]
    return {"model": args.model, "n": args.k, "max_new_tokens": cfg.rollout.max_new_tokens,
            "max_model_len": cfg.rollout.vllm.max_model_len, "warmup": 1, "passes": 2,
            "batches": [[encoder.encode(p.prompt) for p in problems]],
            "seeds": [[sample_seed(cfg.seed, PROBE_STEP, i) for i in range(len(problems))]],
            "kv_cache_gb": cfg.rollout.vllm.kv_cache_gb, "threads": cfg.topology.torch_threads}


def raw_round(args, spec: dict, i: int) -> dict:
    from posttrain.rollout.worker import rollout_worker_env

    work = Path(args.runs_dir) / f"raw-vllm-{i}"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **rollout_worker_env(spec["kv_cache_gb"], spec["threads"]))
    out = run_spec(sys.executable, HERE / "perf_raw_vllm.py", spec, work, env, "vllm.log")
    return {"tokens_per_s": sum(out["tokens"]) / sum(out["seconds"]), "seconds": out["seconds"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/real-model/config.yaml")
    ap.add_argument("--model", default="runs/smollm2")
    ap.add_argument("--data", default="runs/real-model-data")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs-dir", default="runs/bench-real-rollout")
    args = ap.parse_args()
    spec = raw_spec(args)
    rounds = []
    for i in range(args.rounds):  # alternating: posttrain, then vLLM alone, each round
        rounds.append({"posttrain": posttrain_round(args, i), "raw_vllm": raw_round(args, spec, i)})
        print(json.dumps(rounds[-1]), flush=True)
    pt = median(r["posttrain"]["tokens_per_s"] for r in rounds)
    raw = median(r["raw_vllm"]["tokens_per_s"] for r in rounds)
    # Each round's two runs share the machine's state of the moment: the paired ratio is the estimate, its median
    # over rounds the headline, the ratio of the two medians beside it.
    shares = [r["posttrain"]["tokens_per_s"] / r["raw_vllm"]["tokens_per_s"] for r in rounds]
    result = {"settings": {k: v for k, v in vars(args).items()}, "rounds": rounds,
              "posttrain_tokens_per_s": pt, "raw_vllm_tokens_per_s": raw, "share_of_raw": median(shares),
              "share_per_round": shares, "share_of_medians": pt / raw, "cpu": lscpu()[:20]}
    write_json(HERE / "results" / "real_model_rollout.json", result, end="")
    print(f"posttrain {pt:.0f} tok/s, vLLM alone {raw:.0f} tok/s (medians); per round "
          f"{', '.join(f'{100 * x:.0f}%' for x in shares)} of vLLM's own: median {100 * median(shares):.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
