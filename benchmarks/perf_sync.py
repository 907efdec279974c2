"""Where weight-sync time goes, per model size, through Ray as the loop does it: a Trainer actor exports, a
RolloutWorker actor (vLLM engine in its process) loads in place. Two payloads (models/weights.py): safetensors
bytes (what posttrain sent until 2026-12-03) and the array payload the loop sends now, which the object store
hands to the engine without a copy. Reports the median seconds of the whole sync for each, and of the engine's
in-place load alone (vLLM reload_weights, which on CPU re-packs every linear layer's weight). Run by
benchmarks/perf.py in a child process.

    python benchmarks/perf_sync.py MODEL_DIR OUT.json
"""

from __future__ import annotations

import json
import sys
import time

from common import median, write_json

REPS = 4  # per payload, interleaved; the first of each is a warm-up


def main(model_dir: str, out_path: str) -> int:
    import ray

    from posttrain.config import RayConfig, load_config
    from posttrain.orchestration.runtime import start_ray, stop_ray
    from posttrain.models.weights import count_tensors
    from posttrain.rollout.worker import RolloutWorker, rollout_worker_env
    from posttrain.training.trainer import Trainer

    cfg = load_config(None, [f"model.path={model_dir}", "algorithm.kl_coef=0"])
    start_ray(RayConfig(num_cpus=2), needed_cpus=1.5)
    try:
        trainer = ray.remote(num_cpus=0.5)(Trainer).remote(cfg.to_dict(), model_dir)
        worker = ray.remote(num_cpus=1, runtime_env={"env_vars": rollout_worker_env(1)})(RolloutWorker).remote(
            "vllm", model_dir, {"kv_cache_gb": 1, "max_model_len": 128})
        ray.get([trainer.ping.remote(), worker.pid.remote()])
        size = len(ray.get(trainer.export_weights.remote()))
        total: dict[str, list[float]] = {"safetensors": [], "arrays": []}
        load: list[float] = []
        for _ in range(REPS):
            for kind, export in (("safetensors", trainer.export_weights), ("arrays", trainer.export_arrays)):
                t = time.perf_counter()
                ref = export.remote()
                inner = ray.get(worker.update_weights.remote(ref))
                total[kind].append(time.perf_counter() - t)
                if kind == "arrays":
                    load.append(inner)
                del ref
        out = {"bytes": size, "tensors": count_tensors(ray.get(trainer.export_weights.remote())),
               "ray_safetensors_s": median(total["safetensors"][1:]),
               "ray_arrays_s": median(total["arrays"][1:]),
               "engine_load_s": median(load[1:])}
    finally:
        stop_ray()
    write_json(out_path, out, indent=None, end="")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
