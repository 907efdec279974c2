"""DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"), the parts that are not
knobs on GRPO's loss (clip-higher is `clip_eps_high` in grpo.clipped_policy_loss, token-level aggregation is
loss_agg=token):

- overlong reward shaping (their eq. 13): no penalty up to L_max - L_cache tokens, then a linear penalty reaching
  -1 at L_max (scaled here by `penalty`);
- dynamic sampling: keep only groups whose rewards are not all equal, and sample more prompts until the batch holds
  the target number of groups (the loop does the sampling; `fill_groups` decides what is kept).
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """Reward added to each sample given its completion length in tokens: 0 when L <= max_length - buffer,
    penalty * (max_length - buffer - L) / buffer inside the buffer, -penalty at or beyond max_length."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    start = max_length - buffer
    over = (lengths.float() - start).clamp(min=0.0, max=float(buffer))
    return -penalty * over / buffer


def overlong_buffer_tokens(max_length: int, fraction: float) -> int:
    """L_cache in tokens from its share of the generation budget (0 -> off; at least 1 token when on)."""
    return max(1, round(fraction * max_length)) if fraction > 0 else 0


def fill_groups(group_has_signal: list[bool], already: int, target: int) -> list[bool]:
    """Which of a round's groups to keep: those with reward variance, in order, until `already + kept == target`."""
    keep, room = [], max(0, target - already)
    for ok in group_has_signal:
        take = ok and room > 0
        keep.append(take)
        room -= take
    return keep
