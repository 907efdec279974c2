"""`save_weights` / `load_weights` of the Tinker-compatible service on posttrain's atomic, verified checkpoints
(checkpoint.py: a temp directory, fsynced files, a manifest with sha256s, one rename).

A checkpoint holds the adapter's tensors (adapter.safetensors), the AdamW state (optimizer.pt; torch tensors and
numbers only, read back with weights_only=True) and, in the manifest, the base model, the LoRA shape, the step and
the owner (a sha256 of the API key): another key's load is refused as if the path did not exist.

Paths: `tinker://<model_id>/weights/<name>` (save_state) and `tinker://<model_id>/sampler_weights/<name>`; on disk
<state_dir>/checkpoints/<model_id with ':' as '_'>/<kind>/<name>/step_00000000.
"""

from __future__ import annotations

import re
from pathlib import Path

from posttrain.checkpoint import CheckpointError, begin_checkpoint, finalize_checkpoint, step_dir_name, verify_checkpoint
from posttrain.errors import PosttrainError

_PATH = re.compile(r"^tinker://(?P<model_id>[^/]+)/(?P<kind>weights|sampler_weights)/(?P<name>[A-Za-z0-9._-]+)$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def tinker_path(model_id: str, kind: str, name: str) -> str:
    return f"tinker://{model_id}/{kind}/{name}"


def parse_path(path: str, field: str = "path") -> tuple[str, str, str]:
    """(model_id, kind, name) of a tinker:// checkpoint path; PosttrainError naming `field` otherwise."""
    m = _PATH.match(path or "")
    if m is None:
        raise PosttrainError(f"{field}={path!r}: not a checkpoint path of this service "
                             "(tinker://<model_id>/weights/<name> or .../sampler_weights/<name>)")
    return m["model_id"], m["kind"], m["name"]


def check_name(name: str | None, field: str = "path") -> str:
    if name is None or not _NAME.match(name):
        raise PosttrainError(f"{field}={name!r}: a checkpoint name is 1-128 of A-Z a-z 0-9 . _ -")
    return name


def checkpoint_dir(state_dir: Path, model_id: str, kind: str, name: str) -> Path:
    return Path(state_dir) / "checkpoints" / model_id.replace(":", "_") / kind / name


def save(state_dir: Path, backend, m, kind: str, name: str, with_optimizer: bool) -> str:
    """Writes model `m`'s adapter (and optimizer) atomically; returns its tinker:// path."""
    import torch
    from safetensors.torch import save_file

    root = checkpoint_dir(state_dir, m.model_id, kind, name)
    tmp = begin_checkpoint(root, 0)
    save_file({k: v.contiguous() for k, v in backend.adapter_state(m).items()}, str(tmp / "adapter.safetensors"))
    if with_optimizer:
        torch.save(m.optimizer.state_dict(), tmp / "optimizer.pt")
    finalize_checkpoint(tmp, 0, extra={"service": {"owner": m.owner, "base_model": m.base.name, "lora": m.lora,
                                                   "steps": m.steps, "model_id": m.model_id}})
    return tinker_path(m.model_id, kind, name)


def read(state_dir: Path, path: str, owner: str, field: str = "path") -> tuple[dict, Path]:
    """(the manifest's service record, the verified checkpoint directory) of `path`, if `owner` wrote it."""
    model_id, kind, name = parse_path(path, field)
    ckpt = checkpoint_dir(state_dir, model_id, kind, name) / step_dir_name(0)
    missing = PosttrainError(f"{field}={path!r}: no such checkpoint of this API key",
                             hint="use a path a save_state/save_weights_for_sampler call of this key returned")
    if not ckpt.is_dir():
        raise missing
    try:
        record = verify_checkpoint(ckpt).get("service") or {}
    except CheckpointError as e:
        raise PosttrainError(f"{field}={path!r}: {e}") from None
    if record.get("owner") != owner:
        raise missing
    return record, ckpt


def load_into(backend, m, ckpt: Path, with_optimizer: bool) -> None:
    """Copies a checkpoint's adapter (and optimizer state) into the freshly made model `m`."""
    import torch
    from safetensors.torch import load_file

    backend.set_adapter_state(m, load_file(str(ckpt / "adapter.safetensors")))
    if with_optimizer:
        if not (ckpt / "optimizer.pt").is_file():
            raise PosttrainError(f"checkpoint {ckpt.parent.name}: saved without optimizer state "
                                 "(save_weights_for_sampler); load it with optimizer=False")
        m.optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
