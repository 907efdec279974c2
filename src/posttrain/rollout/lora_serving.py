"""model.lora.sync=adapter: the engines serve the policy's LoRA adapter through vLLM's own LoRA support
(`LLM(enable_lora=True)`, a `LoRARequest` on every generate call) instead of loading merged weights in place.

How an adapter gets in: vLLM 0.32 loads adapters only from a directory in peft's format (`LoRARequest.lora_path`;
there is no public way to hand it tensors). The trainer's adapter travels as an array payload through Ray's object
store like any weight sync (models/lora.py: adapter_payload), and the engine's own process writes it to a
temporary directory on its own machine, so trainer and engines need not share a filesystem. vLLM reads the files
once, in `add_lora`, and keeps the adapter in memory (it would reread them only for an adapter evicted from its
cache, and the engine holds just the one it serves), so the directory is deleted at once: nothing is left on
disk, even when the actor is killed. Each sync is a new adapter version with a new id (vLLM caches adapters and
prefix-cache blocks by id and name); the previous version is removed, so memory holds one adapter.

What it costs: the payload is r·(in+out) numbers per adapted layer instead of in·out, but every generated token
pays for the adapters' extra matmuls (vLLM's punica kernels; on CPU plain torch ops). benchmarks/lora_sync.py
measures both sides.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from posttrain.errors import PosttrainError

# The values vLLM accepts for max_lora_rank (vllm/config/lora.py, MaxLoRARanks, vllm 0.32)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(r: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds rank `r`."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise PosttrainError(
        f"model.lora.r={r} with model.lora.sync=adapter: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}",
        hint=f"lower model.lora.r to at most {VLLM_LORA_RANKS[-1]}, or set model.lora.sync=merged",
    )


def lora_engine_options(cfg) -> dict:
    """The rollout engines' extra options for the run config `cfg`: a max LoRA rank when they serve the adapter."""
    lora = cfg.model.lora
    return {"max_lora_rank": lora.r} if lora is not None and lora.sync == "adapter" else {}


def check_adapter_serving(cfg) -> None:
    """At the driver, before any actor: PosttrainError when model.lora.sync=adapter cannot work with `cfg`: the
    transformers engine, a rank above vLLM's largest, a model vLLM serves without LoRA support (GPT-2), an adapted
    LM head vLLM's LoRA cannot serve (Qwen2's; Llama's it serves)."""
    lora = cfg.model.lora
    if lora is None or lora.sync != "adapter":
        return
    if cfg.rollout.engine != "vllm":
        raise PosttrainError(
            f"model.lora.sync=adapter with rollout.engine={cfg.rollout.engine}: only vLLM serves adapters (its "
            "enable_lora); the transformers engine loads weights only",
            hint="set model.lora.sync=merged (the adapted layers' merged weights), or rollout.engine=vllm",
        )
    vllm_max_lora_rank(lora.r)
    _check_vllm_lora_model(lora, cfg.model.path)


def _check_vllm_lora_model(lora, model_dir) -> None:
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from posttrain.models.lora import output_layer_name, target_layer_names

    arch = (json.loads((Path(model_dir) / "config.json").read_text()).get("architectures") or [""])[0]
    try:
        import logging

        import vllm.logger  # noqa: F401  (configures vLLM's loggers; quiet them while its models import: a warning
        # "Triton is installed, but doesn't include CPU backend" would precede every message the CLI prints)
        vllm_logger = logging.getLogger("vllm")
        level = vllm_logger.level
        vllm_logger.setLevel(logging.ERROR)
        try:
            from vllm.model_executor.models import ModelRegistry
            from vllm.model_executor.models.interfaces import supports_lora

            # private in vllm 0.32; should it move, vLLM's own refusal at the first sync still names the problem
            model_cls = ModelRegistry._try_load_model_cls(arch)
        finally:
            vllm_logger.setLevel(level)
    except Exception:  # noqa: BLE001
        return
    if model_cls is None:
        return  # an architecture vLLM does not know: the engine's start says so
    if not supports_lora(model_cls):
        raise PosttrainError(f"model.lora.sync=adapter: vLLM serves {arch} ({model_dir}) without LoRA support",
                             hint="set model.lora.sync=merged (the adapted layers' merged weights)")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)))
    head = output_layer_name(model)
    if head in target_layer_names(model, lora.target_modules) and "lm_head" not in (
            getattr(model_cls, "embedding_modules", None) or {}):
        raise PosttrainError(
            f"model.lora.sync=adapter with model.lora.target_modules={lora.target_modules}: vLLM's LoRA cannot "
            f"serve an adapter on the LM head ({head}) of {arch}",
            hint=f"leave {head.rsplit('.', 1)[-1]} out of target_modules, or set model.lora.sync=merged",
        )


class ServedAdapter:
    """The engine side: the adapter version the engine's `llm` (a `vllm.LLM` built with enable_lora) serves now.
    `request` is None until the first `load` (the engine then serves its base model, which equals a fresh adapter's
    model: LoRA's B starts at zero)."""

    def __init__(self, llm):
        self.llm = llm
        self.request = None  # vllm.lora.request.LoRARequest of the current version

    def load(self, payload) -> None:
        """Serves the adapter in `payload` (models/lora.py: adapter_payload, or its safetensors bytes) from the next
        request on; the previous version is removed. Refused by vLLM (the engine keeps the previous one): a module
        vLLM cannot serve, a rank above the engine's max_lora_rank, DoRA, LoRA bias."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        from posttrain.models.weights import payload_adapter_config, payload_tensors

        config = payload_adapter_config(payload)
        if config is None:
            raise ValueError("ServedAdapter.load: the payload is not a LoRA adapter (models/lora.py: adapter_payload)")
        version = 1 if self.request is None else self.request.lora_int_id + 1
        with tempfile.TemporaryDirectory(prefix=f"posttrain-lora-v{version}-") as path:
            save_file(payload_tensors(payload), str(Path(path) / "adapter_model.safetensors"))
            (Path(path) / "adapter_config.json").write_text(config)
            request = LoRARequest(f"posttrain-policy-v{version}", version, path)
            try:
                self.llm.llm_engine.add_lora(request)
            except Exception as e:  # vLLM's own checks; the message names the module or setting
                raise PosttrainError(
                    f"model.lora.sync=adapter: vLLM refused the policy's adapter: {e}",
                    hint="set model.lora.sync=merged (any linear layer), or leave the module vLLM names out of "
                         "model.lora.target_modules",
                ) from e
        previous, self.request = self.request, request
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)  # False when vLLM's LRU already evicted it

    def loaded_ids(self) -> set[int]:
        """The adapter ids vLLM holds (one after a load: memory does not grow with the steps)."""
        return set(self.llm.llm_engine.list_loras())
