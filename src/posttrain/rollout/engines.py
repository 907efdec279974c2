"""Builds a rollout engine by kind: the one place that knows every engine (VllmEngine, HfEngine) behind the
interface in engine.py."""

from __future__ import annotations

from posttrain.errors import PosttrainError
from posttrain.rollout.engine import RolloutEngine

ENGINE_KINDS = ("vllm", "hf")


def make_engine(kind: str, model_dir: str, **options) -> RolloutEngine:
    """Builds an engine of `kind` ("vllm" or "hf") on the HF model directory `model_dir`. `options` are
    VllmEngine's keyword arguments (dtype, seed, max_model_len in tokens, kv_cache_gb for vLLM on CPU,
    gpu_memory_utilization for vLLM on GPU, enforce_eager, max_lora_rank to serve a LoRA adapter, logprobs); the HF
    engine uses dtype, max_model_len and logprobs (adapter serving on it is refused before any actor:
    lora_serving.py). `logprobs` ("raw", the default, or "sampled"), for both kinds, says what `generate` returns
    per sampled token: the raw-model logprob, or that of the distribution sampled from (after temperature and
    top_p, renormalised; raw at temperature 0); engine.py's docstring has the contract."""
    if kind == "vllm":
        from posttrain.rollout.vllm_engine import VllmEngine

        return VllmEngine(model_dir, **options)
    if kind == "hf":
        from posttrain.rollout.hf_engine import HfEngine

        return HfEngine(model_dir, dtype=options.get("dtype", "float32"),
                        max_model_len=options.get("max_model_len", 128), logprobs=options.get("logprobs", "raw"))
    raise PosttrainError(f"rollout.engine: unknown engine kind {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
