"""Masked reductions and per-token quantities shared by every algorithm. Shapes: [batch, tokens]."""

from __future__ import annotations

from typing import Literal

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where mask is 1; 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, how: Literal["token", "sequence", "constant"],
    constant: float | None = None,
) -> torch.Tensor:
    """token: one mean over every unmasked token of the batch (long answers weigh more);
    sequence: mean within each sequence, then over sequences (each sample weighs the same);
    constant: each sequence's sum divided by `constant` tokens, then mean over sequences (Dr.GRPO)."""
    if how == "constant":
        from posttrain.algorithms.dr_grpo import constant_normalized_sum

        if constant is None:
            raise ValueError("constant aggregation needs the normalising constant (tokens)")
        return constant_normalized_sum(per_token, mask, constant)
    mask = mask.to(per_token.dtype)
    if how == "token":
        return masked_mean(per_token, mask)
    if how == "sequence":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.mean()
    raise ValueError(f"unknown aggregation {how!r}")


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """bfloat16/float16 up to float32 for softmaxes and sums; float64 (model.dtype=float64, numerics checks) stays."""
    return x if x.dtype == torch.float64 else x.float()


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target_t | prefix) for each position. logits [B, T, V], targets [B, T] -> [B, T]."""
    logp = torch.log_softmax(at_least_float32(logits), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the next-token distribution at each position. [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(at_least_float32(logits), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0
