"""The one shape of the in-process trainings (SFT, SFT on traces, DPO, reward model), as torchtune's recipes: setup ->
train -> save, composed from three functions of the training's own module, no base class.

- `setup_*`: validates the inputs, loads model, tokenizer and data; returns what the run holds (a dataclass);
- `train_*`: the loop, the optimizer steps and their evaluations; returns what it measured;
- `save_*`: writes the model directory and the stats; returns the run's result.

`run_recipe` runs them in that order, seeded, under `topology.torch_threads`. The pieces the trainings share live
here too: the batch order (`batch_indices`), the optimizer step (`optimizer_step`) and the atomic model directory
(`save_model_dir`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, TypeVar

import torch

if TYPE_CHECKING:
    from posttrain.config import RunConfig

Setup = TypeVar("Setup")
Trained = TypeVar("Trained")
Result = TypeVar("Result")


def run_recipe(cfg: "RunConfig", setup: Callable[[], Setup], train: Callable[[Setup], Trained],
               save: Callable[[Setup, Trained], Result]) -> Result:
    """save(s, train(s)) for s = setup(), after torch.manual_seed(cfg.seed), with `topology.torch_threads` intra-op
    threads (the caller's setting is restored on return or error): more threads than free cores slows the tiny
    models several-fold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.topology.torch_threads)
    try:
        torch.manual_seed(cfg.seed)
        state = setup()
        return save(state, train(state))
    finally:
        torch.set_num_threads(threads)


def batch_indices(num_examples: int, batch_size: int, generator: torch.Generator):
    """Endless stream of index batches: a fresh seeded permutation each epoch, batches never straddle epochs."""
    if batch_size > num_examples:
        batch_size = num_examples
    while True:
        order = torch.randperm(num_examples, generator=generator)
        for start in range(0, num_examples - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: Iterable[torch.Tensor],
                   max_grad_norm: float) -> torch.Tensor:
    """Gradients of `loss`, clipped to `max_grad_norm` over `params` (the trained ones), then one optimizer step;
    returns the grad norm before clipping."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return grad_norm


def save_model_dir(model, tokenizer, out_dir: str | Path, provenance: dict | None = None) -> Path:
    """Writes an HF directory (safetensors + tokenizer, plus `sft.json` provenance) to a temporary sibling, fsyncs
    it, then renames it into place: a killed run leaves the old directory or the new one, never half of one."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    if provenance is not None:
        (tmp / "sft.json").write_text(json.dumps(provenance, indent=2) + "\n")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out
