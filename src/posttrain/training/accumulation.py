"""Gradient accumulation: a minibatch's loss as a weighted sum of the losses of its parts (micro-batches of one
trainer, or the ranks' rows of the sharded trainer), so that the summed gradient is the whole minibatch's. Pure
functions on index and mask tensors."""

from __future__ import annotations

import torch


def loss_share(local_mask: torch.Tensor, minibatch_mask: torch.Tensor, agg: str) -> float:
    """Weight of a part's loss so that the parts' weighted losses sum to the minibatch's loss. `token` averages over
    every token of the minibatch, so a share is local tokens / minibatch tokens; `sequence` and `constant` average
    over sequences, so it is local sequences / minibatch sequences. Masks: [rows, T]."""
    if agg == "token":
        total = float(minibatch_mask.sum())
        return float(local_mask.sum()) / total if total else 0.0
    return local_mask.shape[0] / minibatch_mask.shape[0]


def micro_batches(idx: torch.Tensor, size: int | None) -> list[torch.Tensor]:
    """A minibatch's row indices in consecutive micro-batches of `size` rows (the last may be shorter); None: one,
    the whole minibatch."""
    return [idx] if size is None else list(torch.split(idx, size))


def nonempty_rows(rows: torch.Tensor) -> torch.Tensor:
    """A part with no rows (a sharded rank's share of a small minibatch) still runs forward and backward (FSDP's
    collectives need every rank): on row 0, with a loss weight of 0 and its outputs discarded."""
    return rows if len(rows) else torch.zeros(1, dtype=torch.long)
