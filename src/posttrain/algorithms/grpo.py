"""GRPO (Shao et al. 2024): group-normalised advantages and the clipped surrogate with a k3 KL penalty."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from posttrain.algorithms.common import aggregate, at_least_float32, kl_k3, masked_mean


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """rewards [G*n] laid out group by group -> advantages [G*n].

    A_i = r_i - mean(group), divided by the group's std (unbiased, as torch.std) when `scale`. A group whose rewards
    are all equal gets advantage 0 everywhere.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = at_least_float32(rewards).view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.view(-1)


def nonzero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Bool [G]: the groups whose rewards are not all equal (the only ones that carry a learning signal)."""
    grouped = rewards.view(-1, group_size)
    return (grouped.max(dim=1).values - grouped.min(dim=1).values) > 0


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor          # scalar, differentiable
    policy_loss: torch.Tensor   # scalar, the clipped-surrogate part
    kl: torch.Tensor            # scalar, mean k3 KL per token (0 when no reference)
    clip_fraction: torch.Tensor  # scalar, share of tokens where the clipped branch is taken
    ratio_mean: torch.Tensor


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
    clip_eps_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    agg: Literal["token", "sequence", "constant"] = "token",
    agg_constant: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """PPO-style clipped surrogate per token plus kl_coef * k3(pi, ref), aggregated over unmasked tokens.

    logprobs, old_logprobs, ref_logprobs, mask: [B, T]; advantages: [B] (one per sequence) or [B, T].
    old_logprobs are the trainer's own before the update (never the engine's: they disagree in low precision).
    is_weights: optional [B, T] rollout-correction weights (rollout_correction.correction_weights), detached; they
    multiply the clipped surrogate per token (not the KL term).
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + hi) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    policy_loss = aggregate(per_token, mask, agg, agg_constant)
    loss = policy_loss
    if ref_logprobs is not None and kl_coef > 0:
        kl_tok = kl_k3(logprobs, ref_logprobs)
        loss = loss + kl_coef * aggregate(kl_tok, mask, agg, agg_constant)
        kl = masked_mean(kl_tok.detach(), mask)
    else:
        kl = torch.zeros((), dtype=logprobs.dtype)
    took_clip = (clipped < unclipped).to(logprobs.dtype)
    return PolicyLossOutput(
        loss=loss,
        policy_loss=policy_loss.detach(),
        kl=kl,
        clip_fraction=masked_mean(took_clip.detach(), mask),
        ratio_mean=masked_mean(ratio.detach(), mask),
    )
