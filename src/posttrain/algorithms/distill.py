"""On-policy distillation (OPD; Agarwal et al. 2024 "GKD", Thinking Machines 2025 "On-Policy Distillation"): the
student samples, a teacher scores the student's own tokens, and each sampled token's advantage is its own
reverse-KL sample with the sign flipped, A_t = coef * (log p_teacher(y_t) - log p_student(y_t)), undiscounted (the
student's behaviour logprobs, the engine's). Optionally mixed with the task reward: + reward_coef * the group's
GRPO advantage of the sequence, the same on every one of its tokens. The PPO clipped loss then uses A_t as is."""

from __future__ import annotations

import torch

from posttrain.algorithms.common import at_least_float32, masked_mean
from posttrain.algorithms.grpo import group_advantages


def reverse_kl_advantages(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor,
                          coef: float = 1.0) -> torch.Tensor:
    """A_t = coef * (teacher_t - student_t) on each sampled token, 0 where masked. [B, T] x3 -> [B, T] (nats)."""
    lp, tlp = at_least_float32(logprobs), at_least_float32(teacher_logprobs)
    return coef * (tlp - lp) * mask.to(lp.dtype)


def distill_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
    coef: float = 1.0, reward_coef: float = 0.0, group_size: int = 1, scale: bool = True,
) -> torch.Tensor:
    """Per-token advantages [B, T]: the reverse-KL term above plus, when reward_coef > 0, reward_coef times the
    sequence's group advantage (rewards [B] laid out group by group, group_size samples per prompt) on its tokens."""
    adv = reverse_kl_advantages(logprobs, teacher_logprobs, mask, coef)
    if reward_coef > 0:
        seq = group_advantages(rewards, group_size, scale=scale).to(adv.dtype)
        adv = adv + reward_coef * seq[:, None] * mask.to(adv.dtype)
    return adv


def mean_reverse_kl(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over the sampled tokens of log p_student - log p_teacher (nats per token): the k1 estimate of
    KL(student || teacher) on the student's samples; falls as the student learns the teacher."""
    lp, tlp = at_least_float32(logprobs), at_least_float32(teacher_logprobs)
    return float(masked_mean(lp - tlp, mask))
