"""Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"): GRPO without its two
biases. Advantages are group-centred rewards, not divided by the group std (grpo.group_advantages with
scale=False); the loss sums each sequence's per-token terms and divides by a constant instead of by the sequence's
own length (the paper's code divides by the generation budget; we use rollout.max_new_tokens, times max_turns for
multi-turn episodes: advantages.sampled_token_budget), so long wrong answers are not penalised less per token than
short ones."""

from __future__ import annotations

import torch


def constant_normalized_sum(per_token: torch.Tensor, mask: torch.Tensor, constant: float) -> torch.Tensor:
    """Mean over sequences of (sum of the sequence's unmasked per-token values) / constant. [B, T] -> scalar."""
    if constant <= 0:
        raise ValueError(f"normalising constant must be positive, got {constant}")
    mask = mask.to(per_token.dtype)
    return ((per_token * mask).sum(-1) / constant).mean()
