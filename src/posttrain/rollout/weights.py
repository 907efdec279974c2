"""Trainer-side weight export for syncing engines: the HF state dict as safetensors bytes.

Tied weights (e.g. `lm_head.weight` sharing storage with `model.embed_tokens.weight`) are written once
(safetensors refuses shared storage), under the input embedding's name when it is one of them, as HF's own
checkpoints do. The receivers fill the tied head from it: vLLM through `vllm_sync.WeightSyncExtension` (which
rebuilds the head's kernel copy), the HF engine through the shared parameter.
"""

from __future__ import annotations


def export_weights(model) -> bytes:
    """Returns safetensors bytes of `model.state_dict()` (HF parameter names, the model's own dtype, on CPU),
    every tensor contiguous, each shared tensor once. Size is about the model's parameter bytes."""
    import torch
    from safetensors.torch import save

    input_embedding = model.get_input_embeddings()
    preferred = id(input_embedding.weight) if input_embedding is not None else None
    state = model.state_dict(keep_vars=True)  # keep_vars: the Parameter objects, so ties are visible by identity

    embedding_name = next((name for name, t in state.items() if id(t) == preferred), None)
    chosen: dict[tuple, str] = {}  # storage key -> the name that will carry it
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in chosen or name == embedding_name:
            chosen[key] = name
    keep = set(chosen.values())
    with torch.no_grad():
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items() if name in keep}
    return save(tensors)


def count_tensors(safetensors_bytes: bytes) -> int:
    """Number of tensors in safetensors bytes, read from the header only."""
    import json
    import struct

    (header_len,) = struct.unpack("<Q", safetensors_bytes[:8])
    header = json.loads(safetensors_bytes[8 : 8 + header_len])
    return sum(1 for name in header if name != "__metadata__")
