"""Rollout correction for asynchronous / off-policy RL: the samples come from the rollout engine's policy
(pi_rollout: stale weights, another kernel, low precision), the loss is taken under the trainer's (pi_train).
An importance weight r = pi_train / pi_rollout makes the gradient the on-policy one again; truncating it (TIS:
min(r, cap)) or dropping the samples whose r is far from 1 (MIS: r outside [1/cap, cap]) trades that bias away for
bounded variance. Pure functions on [batch, tokens] tensors; everything is detached (a weight, not a loss term).

Ratios are exp of the log ratio clamped at +-LOG_RATIO_CLAMP (e^20 = 4.9e8), so a token the rollout gave
probability ~0 (log ratio 1e4, or inf) gives a finite weight instead of inf/nan. With any cap below e^20 the clamp
changes no result: TIS caps such a ratio anyway and MIS drops it either way."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from posttrain.algorithms.common import at_least_float32, kl_k3, masked_mean

LOG_RATIO_CLAMP = 20.0
MODES = ("none", "tis", "mis")
LEVELS = ("token", "sequence")


@dataclass
class Correction:
    weights: torch.Tensor    # [B, T], detached; 0 where loss_mask is 0
    loss_mask: torch.Tensor  # [B, T], the input mask with MIS's drops set to 0 (the input mask for none/tis)
    capped_share: float      # share of unmasked tokens whose weight was truncated at the cap (TIS)
    masked_share: float      # share of unmasked tokens dropped (MIS)


def log_ratios(
    trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor, level: Literal["token", "sequence"]
) -> torch.Tensor:
    """log(pi_train / pi_rollout) per token [B, T] (token level) or the row's sum over its unmasked tokens broadcast
    to every token of the row (sequence level: log of the product of the token ratios); 0 where mask is 0 (padding
    may hold inf or nan), then clamped at +-LOG_RATIO_CLAMP. Float32, or float64 when the trainer's are."""
    trainer_lp = at_least_float32(trainer_lp.detach())
    log_r = trainer_lp - rollout_lp.detach().to(trainer_lp.dtype)
    log_r = torch.where(mask.bool(), log_r, torch.zeros_like(log_r))
    if level == "sequence":
        log_r = log_r.sum(-1, keepdim=True).expand_as(log_r)
    return log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _share(selected: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of the unmasked tokens where `selected` (bool [B, T]) holds; 0 with an empty mask."""
    return float(masked_mean(selected.double(), mask.double()))


def correction_weights(
    trainer_lp: torch.Tensor,
    rollout_lp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: Literal["none", "tis", "mis"],
    level: Literal["token", "sequence"],
    cap: float,
) -> Correction:
    """Importance weights [B, T] that turn a loss over rollout samples into one over the trainer's policy.

    trainer_lp, rollout_lp: [B, T] logprobs of the sampled tokens under each; mask: [B, T] 0/1 (any dtype).
    none: weights = mask. tis: weights = min(r, cap) (r per token, or one per row at sequence level).
    mis: tokens (token level) or whole rows (sequence level) whose r lies outside [1/cap, cap] are dropped from
    loss_mask (weight 0); the kept ones get weight r. cap must be > 1.
    """
    if mode not in MODES:
        raise ValueError(f"unknown rollout correction mode {mode!r}; expected one of {MODES}")
    if level not in LEVELS:
        raise ValueError(f"unknown rollout correction level {level!r}; expected one of {LEVELS}")
    if not cap > 1.0:
        raise ValueError(f"rollout correction cap must be > 1, got {cap!r}")
    log_r = log_ratios(trainer_lp, rollout_lp, mask, level)
    m = mask.detach().to(log_r.dtype)
    if mode == "none":
        return Correction(weights=m, loss_mask=mask, capped_share=0.0, masked_share=0.0)
    ratio = log_r.exp()
    log_cap = math.log(cap)
    if mode == "tis":
        capped = (log_r > log_cap) & mask.bool()
        weights = ratio.clamp(max=cap) * m
        return Correction(weights=weights, loss_mask=mask, capped_share=_share(capped, mask), masked_share=0.0)
    keep = log_r.abs() <= log_cap
    dropped = ~keep & mask.bool()
    loss_mask = mask * keep.to(mask.dtype)
    weights = ratio * m * keep.to(ratio.dtype)
    return Correction(weights=weights, loss_mask=loss_mask, capped_share=0.0, masked_share=_share(dropped, mask))


def mismatch_metrics(trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the trainer's policy is from the one that drew the samples, over the unmasked tokens, in float64.

    With log r = trainer_lp - rollout_lp per token (samples from pi_rollout):
    mismatch/k3_kl: mean of k3 = r - 1 - log r, an unbiased estimate of KL(pi_rollout || pi_train);
    mismatch/ppl_ratio: exp(mean(rollout_lp - trainer_lp)), the trainer's perplexity over the rollout's;
    mismatch/chi2: mean of r^2 - 1, the estimate E_rollout[r^2] - 1 of the chi-square divergence;
    mismatch/log_ratio_abs_max: max |log r| (not clamped).
    k3 and chi2 take log r clamped at +-LOG_RATIO_CLAMP, as the weights do. All 0 (ppl_ratio 1) when mask is empty.
    """
    on = mask.detach().bool()
    m = on.double()
    raw = trainer_lp.detach().double() - rollout_lp.detach().double()
    raw = torch.where(on, raw, torch.zeros_like(raw))
    log_r = raw.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    zeros = torch.zeros_like(log_r)
    return {
        "mismatch/k3_kl": float(masked_mean(kl_k3(zeros, log_r), m)),
        "mismatch/ppl_ratio": math.exp(float(masked_mean(-raw, m))),
        "mismatch/chi2": float(masked_mean(torch.exp(2.0 * log_r) - 1.0, m)),
        "mismatch/log_ratio_abs_max": float(raw.abs().max()) if raw.numel() else 0.0,
    }
