"""RLOO (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics"): each sample's baseline is the mean reward of
the other n-1 samples of its prompt, which keeps the estimator unbiased (the baseline does not depend on the sample)."""

from __future__ import annotations

import torch

from posttrain.algorithms.common import at_least_float32


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """rewards [G*n] laid out group by group -> advantages [G*n]: A_i = r_i - (sum_group - r_i) / (n - 1),
    which equals n/(n-1) * (r_i - mean_group). A group of equal rewards gets 0 everywhere."""
    if group_size < 2:
        raise ValueError("leave-one-out needs at least 2 samples per prompt")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = at_least_float32(rewards).view(-1, group_size)
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others).view(-1)
