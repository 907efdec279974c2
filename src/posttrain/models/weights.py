"""Trainer-side weight export for syncing engines: the HF state dict, as safetensors bytes or as raw arrays.

Two payloads, both keyed by HF parameter names; every engine's `update_weights` takes either:
- safetensors bytes (`export_weights`): self-describing, for files and for engines in another process;
- an array payload (`export_arrays`): per tensor its dtype, shape and bytes as a numpy uint8 array. Ray puts
  numpy arrays into its object store with one copy and hands them to the reader as read-only views of the store's
  shared memory, with no copy at all; safetensors bytes cost a serialisation copy on the trainer, a copy out of
  the store and a parse on the engine. The loop syncs with arrays.

Tied weights (e.g. `lm_head.weight` sharing storage with `model.embed_tokens.weight`) are written once
(safetensors refuses shared storage), under the input embedding's name when it is one of them, as HF's own
checkpoints do. The receivers fill the tied head from it: vLLM through `rollout.vllm_sync.WeightSyncExtension` (which
rebuilds the head's kernel copy), the HF engine through the shared parameter.
"""

from __future__ import annotations


def _unique_state(model) -> dict:
    """The state dict's tensors (detached, contiguous, on CPU), each shared tensor once, under the input
    embedding's name when it is one of them."""
    return unique_tensors(model, model.state_dict(keep_vars=True))  # keep_vars: ties visible by identity


def unique_tensors(model, state: dict) -> dict:
    """`state` (name -> tensor, `model`'s Parameters where unchanged) detached, contiguous and on CPU, each
    shared tensor once, under `model`'s input embedding's name when it is one of them."""
    import torch

    input_embedding = model.get_input_embeddings()
    preferred = id(input_embedding.weight) if input_embedding is not None else None
    embedding_name = next((name for name, t in state.items() if id(t) == preferred), None)
    chosen: dict[tuple, str] = {}  # storage key -> the name that will carry it
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in chosen or name == embedding_name:
            chosen[key] = name
    keep = set(chosen.values())
    with torch.no_grad():
        return {name: t.detach().to("cpu").contiguous() for name, t in state.items() if name in keep}


ARRAYS_FORMAT = "posttrain-arrays-v1"
PARTIAL_KEY = "posttrain_partial"  # set (array payload key, safetensors metadata) when only some tensors are sent
# set (array payload key, safetensors metadata) when the tensors are a LoRA adapter in peft's format: its
# adapter_config.json text (models/lora.py: adapter_payload; served by rollout/lora_serving.py)
ADAPTER_CONFIG_KEY = "posttrain_lora_adapter"


def arrays_from_tensors(tensors: dict, partial: bool = False) -> dict:
    """{"format": ARRAYS_FORMAT, "tensors": {name: (dtype name, shape, uint8 numpy view of the bytes)}}. The views
    share memory with the tensors: serialise (return from the actor method, or ray.put) before they change.
    `partial`: the tensors are some of the model's (LoRA's merged layers); the rest stay as the engine has them."""
    import torch

    out = {}
    for name, t in tensors.items():
        flat = t.reshape(-1)
        out[name] = (str(t.dtype).removeprefix("torch."), list(t.shape), flat.view(torch.uint8).numpy())
    return {"format": ARRAYS_FORMAT, "tensors": out, **({PARTIAL_KEY: True} if partial else {})}


def payload_metadata(payload, key: str):
    """A marker of either payload: the array payload's `key`, or the safetensors header's __metadata__[key]."""
    if isinstance(payload, dict):
        return payload.get(key)
    import json
    import struct

    (header_len,) = struct.unpack("<Q", bytes(payload[:8]))
    return json.loads(bytes(payload[8 : 8 + header_len])).get("__metadata__", {}).get(key)


def payload_is_partial(payload) -> bool:
    """Whether either payload holds only some of the model's tensors (`arrays_from_tensors(partial=True)`)."""
    return payload_metadata(payload, PARTIAL_KEY) in (True, "1")


def payload_adapter_config(payload) -> str | None:
    """adapter_config.json's text when either payload is a LoRA adapter (model.lora.sync=adapter), else None."""
    return payload_metadata(payload, ADAPTER_CONFIG_KEY)


def export_arrays(model) -> dict:
    """The array payload of `model`'s weights (see the module docstring), tied tensors once."""
    return arrays_from_tensors(_unique_state(model))


def payload_tensors(payload) -> dict:
    """name -> tensor from either payload. Tensors from an array payload view its buffers (read-only when they
    come from Ray's object store): copy them into parameters, never write to them."""
    import warnings

    import torch

    if isinstance(payload, (bytes, bytearray, memoryview)):
        from safetensors.torch import load

        return load(bytes(payload))
    if not isinstance(payload, dict) or payload.get("format") != ARRAYS_FORMAT:
        raise TypeError(f"weight payload: expected safetensors bytes or a {ARRAYS_FORMAT} dict, got {type(payload)}")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable": we only read it
        for name, (dtype, shape, raw) in payload["tensors"].items():
            if raw.size == 0:  # an empty tensor has no bytes to view
                out[name] = torch.empty(shape, dtype=getattr(torch, dtype))
            else:
                out[name] = torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)
    return out


def payload_count(payload) -> int:
    """Number of tensors in either payload (from the header only, for safetensors bytes)."""
    if isinstance(payload, dict):
        return len(payload["tensors"])
    return count_tensors(payload)


def payload_as_safetensors(payload) -> bytes:
    """Either payload as safetensors bytes (for an engine in another process)."""
    from safetensors.torch import save

    if isinstance(payload, bytes):
        return payload
    metadata = {**({PARTIAL_KEY: "1"} if payload_is_partial(payload) else {}),
                **({ADAPTER_CONFIG_KEY: payload[ADAPTER_CONFIG_KEY]} if payload.get(ADAPTER_CONFIG_KEY) else {})}
    return save({k: v.clone() for k, v in payload_tensors(payload).items()}, metadata=metadata or None)


def export_weights(model) -> bytes:
    """Returns safetensors bytes of `model.state_dict()` (HF parameter names, the model's own dtype, on CPU),
    every tensor contiguous, each shared tensor once. Size is about the model's parameter bytes."""
    from safetensors.torch import save

    return save(_unique_state(model))


def count_tensors(safetensors_bytes: bytes) -> int:
    """Number of tensors in safetensors bytes, read from the header only."""
    import json
    import struct

    (header_len,) = struct.unpack("<Q", safetensors_bytes[:8])
    header = json.loads(safetensors_bytes[8 : 8 + header_len])
    return sum(1 for name in header if name != "__metadata__")
