"""REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning LLMs"): no critic, no groups.
The KL to the reference is folded into the reward per token, r_t = 1[t = last] * r - beta * KL_t (KL_t the k1
estimate log pi_old - log pi_ref), the advantage of token t is the undiscounted return from t onwards,
A_t = r - beta * sum_{i >= t} KL_i, and advantages are normalised over every valid token of the global batch."""

from __future__ import annotations

import torch

from posttrain.algorithms.common import at_least_float32, masked_mean


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Undiscounted sum of the rewards from each token to the end of its sequence. [B, T] -> [B, T] (0 where masked)."""
    r = token_rewards * mask
    return torch.flip(torch.cumsum(torch.flip(r, [-1]), -1), [-1]) * mask


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Places each sequence's scalar reward on its last valid token: [B], [B, T] -> [B, T]. The mask may have holes
    (a multi-turn episode's environment and tool tokens): the reward goes on the last sampled token, not on
    position sum(mask) - 1."""
    rewards = at_least_float32(rewards)
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    positions = torch.arange(mask.shape[-1]).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).amax(-1).clamp(min=0)
    out[torch.arange(len(rewards)), last] = rewards * (mask.sum(-1) > 0).to(rewards.dtype)
    return out


def kl_shaped_token_rewards(
    rewards: torch.Tensor, mask: torch.Tensor, logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None,
    kl_coef: float,
) -> torch.Tensor:
    """r_t = 1[t = last] * r - kl_coef * (logprobs_t - ref_logprobs_t); the KL part only when both are given."""
    out = terminal_rewards(rewards, mask)
    if logprobs is not None and ref_logprobs is not None and kl_coef > 0:
        out = out - kl_coef * (logprobs - ref_logprobs) * mask
    return out


def global_normalize(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(x - mean) / std over every unmasked entry of the batch (population std); masked entries become 0."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return (values - mean) / (var.sqrt() + eps) * mask


def reinforce_pp_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token advantages [B, T] from sequence rewards [B] and, optionally, per-token logprobs for the KL penalty."""
    token_rewards = kl_shaped_token_rewards(rewards, mask, logprobs, ref_logprobs, kl_coef)
    return global_normalize(returns_to_go(token_rewards, mask), mask)
