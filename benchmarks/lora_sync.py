"""LoRA's two sync modes (model.lora.sync) against each other and against full fine-tuning, through Ray as the loop
does it: a Trainer actor exports, a RolloutWorker actor (vLLM engine in its process) takes it.

- merged: the adapted layers merged, W + alpha/r B A (plus the unchanged shards vLLM packs with them), loaded in
  place into a plain engine;
- adapter: the adapter itself (peft format), served by an engine built with vLLM's enable_lora
  (rollout/lora_serving.py); every generated token then pays for the adapters' extra matmuls.

Per mode: the bytes sent, the seconds of the whole sync (export + object store + engine load) and of the load alone,
and the generation throughput after the sync (tokens/s on a fixed batch, BATCH). Both modes' actors live side by
side and are measured alternately, round after round (the order flips every round), so a busy neighbour on a shared
machine slows both alike; min and median over the rounds. Writes benchmarks/results/lora_sync.json.

    .venv/bin/python benchmarks/lora_sync.py            # the tiny-model factory's 80m shape (~78M), ~13 min on 2 cores
    .venv/bin/python benchmarks/lora_sync.py --size 1m --rounds 2   # a quick look

Variants: full fine-tuning (sync only: its engine is the merged mode's); LoRA r=16 on all-linear (every linear layer
but the head: most of the body's bytes); LoRA r=16 on q_proj and v_proj (merged: k_proj rides along, vLLM stacks
q, k, v into one parameter).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from common import median, round_order, write_json

RESULTS = Path(__file__).resolve().parent / "results" / "lora_sync.json"
SYNC_REPS = 3  # syncs per mode per round (median taken); one warm-up round before the measured ones
BATCH = {"prompts": 32, "n": 8, "prompt_tokens": 16, "max_new_tokens": 32}  # 8,192 tokens at most
VARIANTS = {"lora_q_v": ["model.lora.r=16", "model.lora.target_modules=[q_proj, v_proj]"],
            "lora_all_linear": ["model.lora.r=16", "model.lora.target_modules=all-linear"]}
MODES = ("merged", "adapter")


def start_pair(model_dir: str, overrides: list[str]):
    """A Trainer actor and a RolloutWorker actor for the run config `overrides`, both started."""
    import ray

    from posttrain.config import load_config
    from posttrain.rollout.lora_serving import lora_engine_options
    from posttrain.rollout.worker import RolloutWorker, rollout_worker_env
    from posttrain.training.trainer import Trainer

    cfg = load_config(None, [f"model.path={model_dir}", "algorithm.kl_coef=0", *overrides])
    trainer = ray.remote(num_cpus=1)(Trainer).remote(cfg.to_dict(), model_dir)
    worker = ray.remote(num_cpus=1, runtime_env={"env_vars": rollout_worker_env(1)})(RolloutWorker).remote(
        "vllm", model_dir, {"kv_cache_gb": 1, "max_model_len": 128, **lora_engine_options(cfg)})
    ray.get([trainer.ping.remote(), worker.pid.remote()])
    return trainer, worker


def sync(trainer, worker) -> tuple[float, float]:
    """(whole sync, engine load) seconds: export on the trainer, through the object store, load on the engine."""
    import ray

    t = time.perf_counter()
    ref = trainer.export_arrays.remote()
    load = ray.get(worker.update_weights.remote(ref))
    return time.perf_counter() - t, load


def generate(worker, vocab: int) -> tuple[int, float]:
    """(tokens generated, seconds) for BATCH (prompts of token ids below `vocab`), sampled at temperature 1 with
    fixed seeds."""
    import ray

    from posttrain.rollout.engine import SamplingSpec

    prompts = [[3 + (7 * i + 3 * j) % (vocab - 3) for j in range(BATCH["prompt_tokens"])]
               for i in range(BATCH["prompts"])]
    spec = SamplingSpec(n=BATCH["n"], max_new_tokens=BATCH["max_new_tokens"], temperature=1.0)
    t = time.perf_counter()
    out = ray.get(worker.generate.remote(prompts, spec, [1000 * i for i in range(len(prompts))]))
    seconds = time.perf_counter() - t
    return sum(len(c.token_ids) for group in out for c in group), seconds


def payload_size(trainer) -> tuple[int, int]:
    import ray

    payload = ray.get(trainer.export_arrays.remote())
    return sum(raw.nbytes for _, _, raw in payload["tensors"].values()), len(payload["tensors"])


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": median(values), "all": values}


def measure_variant(model_dir: str, overrides: list[str], rounds: int) -> dict:
    import ray

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    actors = {mode: start_pair(model_dir, [*overrides, f"model.lora.sync={mode}"]) for mode in MODES}
    try:
        rows = {mode: {"sync_s": [], "load_s": [], "tokens_per_s": [], "step_s": []} for mode in MODES}
        for r in range(rounds + 1):  # round 0: warm-up
            for mode in round_order(MODES[::-1], r):
                trainer, worker = actors[mode]
                timings = [sync(trainer, worker) for _ in range(SYNC_REPS)]
                tokens, seconds = generate(worker, vocab)
                if r == 0:
                    continue
                row = rows[mode]
                row["sync_s"].append(median(t for t, _ in timings))
                row["load_s"].append(median(l for _, l in timings))
                row["tokens_per_s"].append(tokens / seconds)
                row["step_s"].append(row["sync_s"][-1] + seconds)  # one sync + the batch's generation
                row["tokens"] = tokens
                print(f"  round {r} {mode:8s} sync {row['sync_s'][-1]:.3f} s  load {row['load_s'][-1]:.3f} s  "
                      f"{tokens} tokens at {tokens / seconds:7.0f} tok/s", flush=True)
        out = {}
        for mode, row in rows.items():
            sent, tensors = payload_size(actors[mode][0])
            out[mode] = {"bytes": sent, "tensors": tensors, "tokens": row["tokens"],
                         **{k: summary(row[k]) for k in ("sync_s", "load_s", "tokens_per_s", "step_s")}}
        return out
    finally:
        for trainer, worker in actors.values():
            ray.kill(trainer)
            ray.kill(worker)


def measure_full(model_dir: str, rounds: int) -> dict:
    import ray

    trainer, worker = start_pair(model_dir, [])
    try:
        sent, tensors = payload_size(trainer)
        timings = [sync(trainer, worker) for _ in range(rounds * SYNC_REPS + 1)][1:]
        return {"bytes": sent, "tensors": tensors, "sync_s": summary([t for t, _ in timings]),
                "load_s": summary([l for _, l in timings])}
    finally:
        ray.kill(trainer)
        ray.kill(worker)


def main() -> None:
    from posttrain.config import RayConfig
    from posttrain.models.tiny import build_tiny_model
    from posttrain.orchestration.runtime import start_ray, stop_ray

    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="80m", help="tiny-model factory shape (1m, 4m, 80m)")
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds per variant (after one warm-up)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model_dir = str(build_tiny_model(Path(d) / "model", args.size, seed=0))
        # logical CPUs: the four actors of a variant take turns (one busy at a time), each with one OMP thread
        start_ray(RayConfig(num_cpus=4), needed_cpus=4)
        try:
            rows = {"full": measure_full(model_dir, args.rounds)}
            for name, overrides in VARIANTS.items():
                print(name, flush=True)
                rows[name] = measure_variant(model_dir, overrides, args.rounds)
        finally:
            stop_ray()
    f = rows["full"]
    print(f"{'full':28s} {f['bytes'] / 2**20:8.2f} MiB {f['tensors']:4d} tensors  sync {f['sync_s']['median']:.3f} s "
          f"(min {f['sync_s']['min']:.3f})")
    for name in VARIANTS:
        for mode in MODES:
            r = rows[name][mode]
            print(f"{name + ' ' + mode:28s} {r['bytes'] / 2**20:8.2f} MiB {r['tensors']:4d} tensors  sync "
                  f"{r['sync_s']['median']:.3f} s (min {r['sync_s']['min']:.3f})  {r['tokens_per_s']['median']:6.0f} "
                  f"tok/s (max {max(r['tokens_per_s']['all']):.0f})  step {r['step_s']['median']:.2f} s "
                  f"(min {r['step_s']['min']:.2f})")
    write_json(RESULTS, {"size": args.size, "rounds": args.rounds, "sync_reps": SYNC_REPS, "batch": BATCH,
                         "variants": rows})


if __name__ == "__main__":
    main()
