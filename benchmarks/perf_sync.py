"""Where weight-sync time goes, per model size, without Ray: the trainer's export (state dict -> safetensors bytes)
and the engine's in-place load (`VllmEngine.update_weights`: collective_rpc -> vLLM reload_weights, which on CPU
re-packs every linear layer's weight). Run by benchmarks/perf.py in a child process with the rollout actor's env.

    python benchmarks/perf_sync.py MODEL_DIR OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def main(model_dir: str, out_path: str) -> int:
    from posttrain.models.loading import load_causal_lm
    from posttrain.rollout.vllm_engine import VllmEngine
    from posttrain.rollout.weights import export_weights

    model, _ = load_causal_lm(model_dir, "float32")
    engine = VllmEngine(model_dir, max_model_len=128, kv_cache_gb=1)
    export, load = [], []
    for _ in range(4):
        t = time.perf_counter()
        blob = export_weights(model)
        export.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.update_weights(blob)
        load.append(time.perf_counter() - t)
    out = {"bytes": len(blob), "export_s": statistics.median(export[1:]), "engine_load_s": statistics.median(load[1:])}
    open(out_path, "w").write(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
