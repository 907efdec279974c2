"""`posttrain export RUN_DIR [--step N] --merge OUT`: a checkpoint as one plain HF model directory that transformers
and vLLM load without posttrain or peft. A LoRA run's adapter (peft's format, checkpoint/adapter/) is merged into
the run's base model (model.path, checked against the hash the checkpoint recorded); a full-weight run's model is
copied as it is, and the message says so."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

import typer

from posttrain.errors import PosttrainError


def export(
    run_dir: str = typer.Argument(..., help="The run's directory, e.g. runs/demo."),
    merge: str = typer.Option(..., "--merge", help="Directory to write the merged HF model to (must not exist)."),
    step: Optional[int] = typer.Option(None, "--step", help="The checkpoint's step (default: the newest valid one)."),
):
    """Write a checkpoint as a merged HF model directory (weights + config + tokenizer)."""
    from posttrain.cli.common import console

    console.print(export_merged(run_dir, merge, step), highlight=False, soft_wrap=True)


def export_merged(run_dir: str | Path, out: str | Path, step: int | None = None) -> str:
    """Writes the checkpoint of `step` (default: the newest valid) of the run as a plain HF directory at `out`,
    atomically (a temp sibling renamed into place); returns what it did, in words."""
    from posttrain.config import load_config
    from posttrain.models.lora import ADAPTER_DIR, check_adapter_base, read_base_record
    from posttrain import checkpoint as ckpt

    d, out = Path(run_dir), Path(out)
    if not (d / "config.yaml").is_file():
        raise PosttrainError(f"export {d}: not a run directory (no config.yaml in it)",
                             hint="give runs/<name>, the directory `posttrain train` wrote")
    if out.exists():
        raise PosttrainError(f"--merge {out} already exists", hint="choose a new directory (export never overwrites)")
    root = d / "checkpoints"
    if step is None:
        path = ckpt.latest_valid_checkpoint(root, warn=lambda _m: None)
        if path is None:
            raise PosttrainError(f"export {d}: no valid checkpoint under {root}", hint="train the run first")
    else:
        path = root / ckpt.step_dir_name(step)
        if not path.is_dir():
            have = ", ".join(p.name.removeprefix(ckpt.PREFIX).lstrip("0") or "0" for p in ckpt.list_checkpoints(root))
            raise PosttrainError(f"--step {step}: the run {d} has no checkpoint of step {step}",
                                 hint=f"its checkpoints are of steps: {have or 'none'}")
        ckpt.verify_checkpoint(path)
    cfg = load_config(d / "config.yaml")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    record = read_base_record(path)
    if record is None:
        shutil.copytree(path / "model", tmp)
        what = f"the run has no LoRA adapter (full fine-tuning): copied the model of {path} to {out}"
    else:
        from peft import PeftModel

        from posttrain.models.loading import load_causal_lm

        check_adapter_base(record, cfg.model.path, path, "export")
        base, tokenizer = load_causal_lm(cfg.model.path, cfg.model.dtype)
        merged = PeftModel.from_pretrained(base, str(path / ADAPTER_DIR)).merge_and_unload()
        merged.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        what = f"merged the LoRA adapter of {path} into the base model {cfg.model.path}: wrote {out}"
    os.rename(tmp, out)
    return what
