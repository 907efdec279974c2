"""Atomic, verified checkpoints.

A checkpoint is a directory `checkpoints/step_000050/` holding the policy as an HF directory (`model/`), the
trainer state (`trainer_state.pt`: optimizer, torch RNG), the driver state (`state.json`: step, data cursor, eval
history) and `manifest.json` with the sha256 and size of every other file. It is written into a hidden temp
directory, every file fsynced, the manifest written last, then renamed into place: a reader sees a whole
checkpoint or none. A sharded trainer (topology.trainer_ranks > 1) also writes `trainer_shards/`
(torch.distributed.checkpoint, one file per rank, in the manifest like every file; training/distributed.py). Loading verifies the manifest; resume walks back to the newest checkpoint that verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path

from posttrain.errors import PosttrainError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
PREFIX = "step_"


class CheckpointError(PosttrainError):
    """A checkpoint that is missing, incomplete or whose bytes differ from its manifest."""


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def begin_checkpoint(root: str | Path, step: int) -> Path:
    """Creates and returns an empty temp directory beside the final one (same filesystem, so rename is atomic)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def finalize_checkpoint(tmp: Path, step: int, extra: dict | None = None) -> Path:
    """Fsyncs every file in `tmp`, writes the manifest, renames `tmp` to its final name and returns that path.
    An existing checkpoint of the same step is replaced only after the new one is complete."""
    files = {}
    for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
        _fsync_path(f)
        rel = f.relative_to(tmp).as_posix()
        files[rel] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
    manifest = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "created_unix": time.time(),
        "files": files,
        **(extra or {}),
    }
    mpath = tmp / MANIFEST
    with open(mpath, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, key=lambda p: len(p.parts), reverse=True):
        _fsync_path(d)
    final = tmp.parent / step_dir_name(step)
    if final.exists():
        trash = tmp.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        final.rename(trash)
        tmp.rename(final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(final)
    _fsync_path(tmp.parent)
    return final


def verify_checkpoint(path: str | Path) -> dict:
    """Returns the manifest if every listed file exists with its recorded size and sha256; raises CheckpointError
    naming the first file that does not."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST} (incomplete write?)")
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is unreadable") from None
    for rel, meta in files.items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: file {rel} listed in the manifest is missing")
        if f.stat().st_size != meta["bytes"]:
            raise CheckpointError(
                f"checkpoint {path}: file {rel} has {f.stat().st_size} bytes, manifest says {meta['bytes']} (truncated?)"
            )
        if sha256_file(f) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {path}: file {rel} does not match its sha256 in the manifest (corrupted)")
    return manifest


def list_checkpoints(root: str | Path) -> list[Path]:
    """Final (non-temp) checkpoint directories under root, oldest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit():
            found.append(p)
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_valid_checkpoint(root: str | Path, warn=print) -> Path | None:
    """The newest checkpoint that verifies; each one skipped on the way is reported through `warn`."""
    for path in reversed(list_checkpoints(root)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as e:
            warn(f"skipping invalid checkpoint: {e}; falling back to the previous one")
    return None


def prune_checkpoints(root: str | Path, keep_last: int, protect: tuple[Path, ...] = ()) -> list[Path]:
    """Deletes all but the newest `keep_last` checkpoints (and those in `protect`), never the newest valid one,
    and removes stale temp directories. Returns what was deleted."""
    root = Path(root)
    ckpts = list_checkpoints(root)
    keep = set(ckpts[-keep_last:]) | {Path(p) for p in protect}
    best = read_best_pointer(root.parent)
    if best is not None:  # the in-loop eval's best checkpoint is never deleted
        keep.add(root / best["checkpoint"])
    keep |= {p for p in ckpts if (p / HOLD).exists()}  # nor one the evaluator has yet to read
    newest_valid = latest_valid_checkpoint(root, warn=lambda _m: None)
    if newest_valid is not None:
        keep.add(newest_valid)
    removed = []
    for p in ckpts:
        if p not in keep:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def best_checkpoint(root: str | Path, scores: dict[int, float]) -> Path | None:
    """The valid checkpoint whose step has the highest score (held-out accuracy), the newest among equals; None
    when no checkpointed step has a score."""
    scored = [p for p in list_checkpoints(root) if int(p.name[len(PREFIX):]) in scores]
    for path in sorted(scored, key=lambda p: (scores[int(p.name[len(PREFIX):])], p.name), reverse=True):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError:
            continue
    return None


BEST_POINTER = "best.json"  # in the run directory, beside checkpoints/
HOLD = ".eval-hold"  # a file inside a checkpoint: retention keeps it until the in-loop evaluator has read it


def write_best_pointer(run_dir: str | Path, info: dict) -> Path:
    """Atomically points runs/<name>/best.json at a checkpoint; `info` holds at least "checkpoint" (its directory
    name under checkpoints/) and "step". Written to a temp file, fsynced, then renamed over the old pointer."""
    path = Path(run_dir) / BEST_POINTER
    tmp = path.with_name(f".{BEST_POINTER}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as fh:
        json.dump(info, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)
    return path


def read_best_pointer(run_dir: str | Path) -> dict | None:
    """The best-checkpoint pointer of a run, or None when there is none (or it is unreadable)."""
    path = Path(run_dir) / BEST_POINTER
    try:
        info = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("checkpoint"), str) else None


def checkpoint_bytes_estimate(model_dir: str | Path) -> int:
    """Bytes one checkpoint of this model takes: the weights, AdamW's two moments of the same size, small files."""
    weights = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    return 3 * weights + (1 << 20)


def check_disk_space(root: str | Path, model_dir: str | Path) -> None:
    """Refuses to start a run whose checkpoint would not fit on the disk of `root` (better now than at step 50)."""
    need = checkpoint_bytes_estimate(model_dir)
    free = shutil.disk_usage(root).free
    if free < need:
        raise PosttrainError(
            f"runs_dir: {root} has {free / 2**20:.1f} MiB free, but one checkpoint of {model_dir} needs about "
            f"{need / 2**20:.1f} MiB",
            hint="free disk space or point runs_dir at a larger disk",
        )


def is_disk_full(error: BaseException) -> bool:
    """True for ENOSPC/EDQUOT, also when it comes wrapped by Ray from an actor (RayTaskError.cause)."""
    import errno

    for e in (error, getattr(error, "cause", None), error.__cause__):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
    return False
