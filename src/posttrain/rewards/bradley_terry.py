"""The reward model's objective and its held-out statistics, as pure functions on score tensors.

r_chosen, r_rejected: [N] scalar rewards of the chosen and rejected completion of N preference pairs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    r_chosen: torch.Tensor,
    r_rejected: torch.Tensor,
    margin: float | torch.Tensor = 0.0,
    center_coef: float = 0.0,
) -> torch.Tensor:
    """Mean over pairs of -log sigmoid(r_chosen - r_rejected - margin), plus center_coef * mean((r_c + r_r)^2).

    The margin (a float, or a per-pair [N] tensor as in Llama 2's RM) asks the chosen reward to win by at least that
    much. The centering term (Eisenstein et al. 2023) pulls the rewards of each pair towards zero sum: the BT loss
    only sees differences, so without it the reward's offset drifts freely."""
    diff = r_chosen - r_rejected - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * ((r_chosen + r_rejected) ** 2).mean()
    return loss


def pairwise_accuracy(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> float:
    """Share of pairs where the chosen completion scores strictly higher (ties count as wrong)."""
    return float((r_chosen > r_rejected).float().mean()) if len(r_chosen) else 0.0


def mean_margin(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> float:
    """Mean of r_chosen - r_rejected over pairs."""
    return float((r_chosen - r_rejected).mean()) if len(r_chosen) else 0.0


def reward_stats(rewards: torch.Tensor) -> tuple[float, float]:
    """(mean, std) of a 1-D reward tensor, std the population one and never below 1e-6 (it is a divisor)."""
    return float(rewards.mean()), max(float(rewards.std(unbiased=False)), 1e-6)
