"""Statistics for evals and checkpoint comparisons, as pure functions on score lists (no I/O, no globals).

Conventions: a comparison is always "B against A" on the same samples, so a positive difference means B scored
higher; `a[i]` and `b[i]` are the scores of the same sample (same prompt, same seed) under the two models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from posttrain.errors import PosttrainError

# Below this many discordant pairs McNemar uses the exact binomial test; from it on, chi-square with
# continuity correction (the usual rule of thumb: the normal approximation is fine once b + c >= 25).
MCNEMAR_EXACT_BELOW = 25


@dataclass(frozen=True)
class MeanSE:
    mean: float
    se: float  # standard error of the mean: sample std (ddof=1) / sqrt(n); 0 for n < 2
    n: int


def mean_se(scores: Sequence[float]) -> MeanSE:
    x = np.asarray(scores, dtype=float)
    if x.size == 0:
        raise PosttrainError("mean_se: no scores; a suite needs at least one sample")
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    return MeanSE(float(x.mean()), se, int(x.size))


def _paired(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.shape != xb.shape or xa.ndim != 1 or xa.size == 0:
        raise PosttrainError(
            f"paired statistics need two equally long, non-empty score lists; got {xa.size} and {xb.size}",
            hint="compare both models on the same suite with the same samples",
        )
    return xa, xb


@dataclass(frozen=True)
class BootstrapResult:
    mean_diff: float  # mean(b - a)
    ci_low: float
    ci_high: float
    p_value: float  # two-sided, from the bootstrap distribution shifted to mean 0
    n: int


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, n_resamples: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> BootstrapResult:
    """Percentile bootstrap CI of mean(b - a), resampling sample indices (pairs stay together), seeded.
    p-value: share of resampled means at least as far from the observed mean as the observed mean is from 0
    (the null distribution is the bootstrap distribution shifted to centre 0)."""
    xa, xb = _paired(a, b)
    d = xb - xa
    rng = np.random.default_rng(seed)
    # Resample in chunks so the index matrix stays ~8M entries (64 MB) even for suites of many thousand samples.
    chunk = max(1, min(n_resamples, 8_000_000 // d.size))
    boot = np.concatenate([d[rng.integers(0, d.size, size=(min(chunk, n_resamples - start), d.size))].mean(axis=1)
                           for start in range(0, n_resamples, chunk)])
    alpha = 1 - confidence
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    observed = float(d.mean())
    if np.all(d == d[0]):
        p = 1.0 if d[0] == 0 else 0.0  # no variation: the difference is certain (or certainly zero)
    else:
        p = float(np.mean(np.abs(boot - observed) >= abs(observed)))
    return BootstrapResult(observed, float(lo), float(hi), p, int(d.size))


@dataclass(frozen=True)
class McNemarResult:
    a_only: int  # pairs where A passed and B failed
    b_only: int  # pairs where B passed and A failed
    p_value: float
    method: str  # "exact-binomial" or "chi2-continuity"
    statistic: float | None  # chi-square statistic (None for the exact test)


def _binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def mcnemar(a: Sequence[float], b: Sequence[float], *, exact_below: int = MCNEMAR_EXACT_BELOW) -> McNemarResult:
    """McNemar's test on paired binary scores (1 = pass; any score >= 0.5 counts as a pass).
    Exact two-sided binomial test on the discordant pairs when there are fewer than `exact_below` of them,
    otherwise chi-square (1 dof) with continuity correction: (|b - c| - 1)^2 / (b + c)."""
    xa, xb = _paired(a, b)
    pa, pb = xa >= 0.5, xb >= 0.5
    a_only, b_only = int(np.sum(pa & ~pb)), int(np.sum(pb & ~pa))
    n = a_only + b_only
    if n == 0:
        return McNemarResult(a_only, b_only, 1.0, "exact-binomial", None)
    if n < exact_below:
        p = min(1.0, 2 * _binom_cdf_half(min(a_only, b_only), n))
        return McNemarResult(a_only, b_only, p, "exact-binomial", None)
    stat = (abs(a_only - b_only) - 1) ** 2 / n
    p = math.erfc(math.sqrt(stat / 2))  # survival function of chi-square with 1 dof
    return McNemarResult(a_only, b_only, p, "chi2-continuity", stat)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order: sort ascending, adjusted_(i) =
    max_{j<=i} min(1, (m - j + 1) * p_(j)) (1-based j). Reject H_i at level alpha when adjusted_i <= alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class WinTieLoss:
    wins: int  # B higher than A
    ties: int
    losses: int  # B lower than A


def win_tie_loss(a: Sequence[float], b: Sequence[float], *, tol: float = 1e-9) -> WinTieLoss:
    xa, xb = _paired(a, b)
    d = xb - xa
    return WinTieLoss(int(np.sum(d > tol)), int(np.sum(np.abs(d) <= tol)), int(np.sum(d < -tol)))


def is_binary(scores: Sequence[float]) -> bool:
    return all(s in (0.0, 1.0) for s in scores)
