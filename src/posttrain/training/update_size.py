"""The size of a step's update relative to the weights, the norm of the change over the norm of the weights: the
learning monitor's measure of how far the policy moved, ||theta_after - theta_before|| / ||theta_before||
(evals/progress_stats.py). ~1e-9 says the learning rate does nothing, ~1e-1 says each step rewrites a tenth of the
weights. Cheap: both norms are taken over a fixed strided sample of at most SAMPLE_PER_TENSOR entries of each
trainable tensor (a copy of those entries before the step), not a second copy of the model. A sharded trainer
samples its local shards; the squared sums add over ranks."""

from __future__ import annotations

import torch

SAMPLE_PER_TENSOR = 4096


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p  # an FSDP DTensor: this rank's shard


def weight_sample(params, per_tensor: int = SAMPLE_PER_TENSOR) -> list[torch.Tensor]:
    """A copy of every `per_tensor`-th-spaced entry of each tensor of `params` (at most `per_tensor` of each), in
    float64: the same entries every call, so a sample before and after a step compare entry by entry."""
    out = []
    for p in params:
        flat = _local(p).detach().reshape(-1)
        stride = max(1, -(-flat.numel() // per_tensor))  # ceil: at most per_tensor entries
        out.append(flat[::stride].to(torch.float64, copy=True))
    return out


def squared_sums(before: list[torch.Tensor], after: list[torch.Tensor]) -> torch.Tensor:
    """[sum of (after - before)^2, sum of before^2] over the samples: summed over ranks, then update_ratio."""
    delta = sum((float(((a - b) ** 2).sum()) for a, b in zip(after, before)), 0.0)
    norm = sum((float((b ** 2).sum()) for b in before), 0.0)
    return torch.tensor([delta, norm], dtype=torch.float64)


def update_ratio(sums: torch.Tensor) -> float:
    """||delta|| / ||theta|| from squared_sums' pair; 0.0 for all-zero weights."""
    delta, norm = (float(x) for x in sums)
    return (delta / norm) ** 0.5 if norm > 0 else 0.0
