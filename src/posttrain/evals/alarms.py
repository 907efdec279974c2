"""Reward-hacking alarms: pure functions on metric series, and an `AlarmMonitor` that applies them step by step.

Each detector takes plain lists (steps, values) and returns evidence; the monitor keeps the per-step history,
decides which alarms fire, and attaches the configured action ("warn", "stop" or "rollback" to the best
checkpoint). Acting on the action is the caller's job (the training loop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from posttrain.errors import PosttrainError

ACTIONS = ("warn", "stop", "rollback")


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys against xs (units of y per unit of x); 0 with fewer than two distinct xs."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.size < 2 or np.all(x == x[0]):
        return 0.0
    xc = x - x.mean()
    return float(np.dot(xc, y - y.mean()) / np.dot(xc, xc))


def proxy_gold_divergence(
    steps: Sequence[float], proxy: Sequence[float], gold: Sequence[float], *, min_proxy_slope: float = 0.0,
    max_gold_slope: float = 0.0,
) -> dict | None:
    """Evidence when, over the given window, the proxy reward rises (slope > min_proxy_slope per step) while the
    gold/eval score is flat or falling (slope <= max_gold_slope per step); None otherwise."""
    ps, gs = slope(steps, proxy), slope(steps, gold)
    if ps > min_proxy_slope and gs <= max_gold_slope:
        return {"proxy_slope": ps, "gold_slope": gs, "window": [steps[0], steps[-1]]}
    return None


def gold_drawdown(steps: Sequence[float], proxy: Sequence[float], gold: Sequence[float], *, drop: float) -> dict | None:
    """Evidence when gold has fallen more than `drop` (a share of |peak|) below its peak while the proxy now stands
    above its value at that peak: the over-optimization the slopes see only a window later. None otherwise.
    gold 0.60, 0.58, 0.56 with proxy 0.2, 0.3, 0.4 and drop 0.05: 0.56 < 0.60 - 0.03 and 0.4 > 0.2 -> fires."""
    if len(gold) < 2:
        return None
    peak = int(np.argmax(gold))
    limit = gold[peak] - drop * abs(gold[peak])
    if peak < len(gold) - 1 and gold[-1] < limit and proxy[-1] > proxy[peak]:
        return {"gold_peak": gold[peak], "gold_peak_step": steps[peak], "gold_now": gold[-1],
                "proxy_at_peak": proxy[peak], "proxy_now": proxy[-1]}
    return None


@dataclass(frozen=True)
class GoldKLFit:
    """gold - gold_0 ~= d * (alpha - beta * d), d = sqrt(KL to the initial policy) (Gao et al. 2022, best-of-n /
    RL form without the log). `peak_d` = alpha / (2 beta) is where the fitted gold peaks (inf when beta <= 0)."""

    alpha: float
    beta: float
    peak_d: float
    peak_kl: float


def fit_gold_vs_sqrt_kl(kl: Sequence[float], gold: Sequence[float]) -> GoldKLFit:
    """Least squares of (gold - gold[0]) on the features [d, -d^2], no intercept (at KL 0 the gain is 0)."""
    d = np.sqrt(np.maximum(np.asarray(kl, dtype=float), 0.0))
    g = np.asarray(gold, dtype=float)
    if d.size < 3:
        raise PosttrainError(f"gold-vs-KL fit: needs at least 3 points, got {d.size}")
    g = g - g[0]
    design = np.stack([d, -(d**2)], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, g, rcond=None)
    peak_d = float(alpha / (2 * beta)) if beta > 0 else math.inf
    return GoldKLFit(float(alpha), float(beta), peak_d, peak_d**2)


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation; 0 when either series is constant."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    xc, yc = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(np.dot(xc, xc) * np.dot(yc, yc)))
    return float(np.dot(xc, yc) / denom) if denom > 0 else 0.0


def reward_gain_by_length_bucket(
    before: tuple[Sequence[float], Sequence[float]], after: tuple[Sequence[float], Sequence[float]],
    edges: Sequence[float],
) -> dict:
    """Reward gain from `before` to `after` (each a (lengths, rewards) pair), overall and within length buckets
    [edges[i], edges[i+1]). When the overall gain is large but the within-bucket gains are ~0, the gain came
    from moving to longer (or shorter) completions, not from better ones at the same length.
    Returns {"overall": gain, "buckets": [(lo, hi, gain or None), ...], "within": mean of bucket gains}."""
    lb, rb = np.asarray(before[0], float), np.asarray(before[1], float)
    la, ra = np.asarray(after[0], float), np.asarray(after[1], float)
    buckets, gains = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        mb, ma = (lb >= lo) & (lb < hi), (la >= lo) & (la < hi)
        gain = float(ra[ma].mean() - rb[mb].mean()) if mb.any() and ma.any() else None
        buckets.append((lo, hi, gain))
        if gain is not None:
            gains.append(gain)
    return {"overall": float(ra.mean() - rb.mean()), "buckets": buckets,
            "within": float(np.mean(gains)) if gains else 0.0}


def kl_acceleration(steps: Sequence[float], kl: Sequence[float]) -> float:
    """Ratio of the KL slope over the second half of the window to the slope over the first half (>1: KL is
    growing faster and faster). inf when the first half is flat and the second rises."""
    h = len(steps) // 2
    first, second = slope(steps[:h + 1], kl[:h + 1]), slope(steps[h:], kl[h:])
    if first <= 1e-12:
        return math.inf if second > 1e-12 else 1.0
    return second / first


def ngram_repetition_rate(completions: Sequence[Sequence], n: int = 3) -> float:
    """Share of n-grams that repeat an earlier n-gram of the same completion, pooled over completions
    (0 = no repetition; 'a b a b a b' with n=2 has 5 bigrams of which 3 are repeats -> 0.6)."""
    total = repeats = 0
    for c in completions:
        grams = [tuple(c[i:i + n]) for i in range(len(c) - n + 1)]
        total += len(grams)
        repeats += len(grams) - len(set(grams))
    return repeats / total if total else 0.0


def ensemble_disagreement(member_scores: Sequence[Sequence[float]], *, standardize: bool = True) -> float:
    """Mean over samples of the std across reward-model ensemble members (shape: members x samples). With
    `standardize` each member's scores are first z-scored over the samples (RMs with arbitrary offsets and scales);
    without it the scores are compared as given (the loop's members are already normalized by their own training
    statistics, and a shift of one member against the others is disagreement too). 0 when members agree."""
    m = np.asarray(member_scores, dtype=float)
    if m.ndim != 2 or m.shape[0] < 2:
        raise PosttrainError("ensemble disagreement needs scores from two or more reward models")
    if standardize:
        std = m.std(axis=1, keepdims=True)
        m = (m - m.mean(axis=1, keepdims=True)) / np.where(std > 0, std, 1.0)
    return float(m.std(axis=0).mean())


def length_bucket_edges(lengths: Sequence[float], buckets: int = 5) -> list[float]:
    """Bucket edges [e0, e1, ..., ek] with e0 = min and ek = max + 1 (buckets are [lo, hi)), at the quantiles of
    `lengths`, duplicates dropped: token counts 1..8 with 5 buckets -> quantile edges, few distinct lengths -> one
    bucket per length at most."""
    x = np.asarray(lengths, dtype=float)
    qs = np.quantile(x, np.linspace(0, 1, buckets + 1)[1:-1]) if x.size else []
    inner = sorted({float(q) for q in qs} - {float(x.min())}) if x.size else []
    return [float(x.min()), *inner, float(x.max()) + 1] if x.size else []


def length_driven_gain(before: tuple[Sequence[float], Sequence[float]], after: tuple[Sequence[float], Sequence[float]],
                       *, share: float, buckets: int = 5) -> dict | None:
    """Evidence when the reward rose from `before` to `after` ((lengths, rewards) each) but the mean gain within
    length buckets (quantile edges of both sets' lengths) is below `share` x the overall gain: the rise came from
    changing length, not from better completions of the same length. None otherwise, and None when no bucket holds
    samples of both sets (then length_corr speaks)."""
    edges = length_bucket_edges([*before[0], *after[0]], buckets)
    gains = reward_gain_by_length_bucket(before, after, edges)
    shared = [b for b in gains["buckets"] if b[2] is not None]
    if gains["overall"] > 0 and shared and gains["within"] < share * gains["overall"]:
        return {"overall_gain": gains["overall"], "within_bucket_gain": gains["within"],
                "buckets": [[lo, hi, g] for lo, hi, g in gains["buckets"]],
                "length_before": float(np.mean(before[0])), "length_after": float(np.mean(after[0]))}
    return None


@dataclass
class AlarmSpec:
    """One alarm: which detector, its threshold, the metric keys it reads, the window (in logged points) and
    what to do when it fires."""

    kind: str  # proxy_gold | length_corr | length_bucket | kl_accel | entropy_collapse | repetition | rm_disagreement
    action: str = "warn"
    threshold: float = 0.0
    window: int = 5
    keys: dict = field(default_factory=dict)
    drop: float | None = None  # proxy_gold: also fire on a gold drawdown of this share from its peak (gold_drawdown)

    def __post_init__(self):
        if self.kind not in DEFAULT_KEYS:
            raise PosttrainError(f"alarm kind {self.kind!r} is unknown; choose one of {', '.join(DEFAULT_KEYS)}")
        if self.action not in ACTIONS:
            raise PosttrainError(f"alarm {self.kind}: action {self.action!r} must be one of {', '.join(ACTIONS)}")
        self.keys = {**DEFAULT_KEYS[self.kind], **self.keys}


# The metric names each alarm reads from the per-step dicts (overridable per alarm through `keys`).
DEFAULT_KEYS = {
    "proxy_gold": {"proxy": "reward_mean", "gold": "eval/gold", "kl": "kl"},
    "length_corr": {"length": "response_length_mean", "reward": "reward_mean"},
    "length_bucket": {"samples": "sample_lengths_rewards"},
    "kl_accel": {"kl": "kl"},
    "entropy_collapse": {"entropy": "entropy"},
    "repetition": {"repetition": "repetition_rate"},
    "rm_disagreement": {"disagreement": "rm_disagreement"},
}


@dataclass(frozen=True)
class FiredAlarm:
    kind: str
    step: int
    action: str
    evidence: dict


class AlarmMonitor:
    """Consumes one metrics dict per step (`{"step": int, ...}`) and returns the alarms that fire at that step.
    A metric missing from a step is simply absent from that alarm's series (evals run every k steps)."""

    def __init__(self, specs: Sequence[AlarmSpec]):
        self.specs = list(specs)
        self.history: list[dict] = []
        self.fired: list[FiredAlarm] = []

    def _series(self, *keys: str, window: int) -> tuple[list, ...]:
        rows = [m for m in self.history if all(k in m for k in keys)][-window:]
        return ([m["step"] for m in rows],) + tuple([m[k] for m in rows] for k in keys)

    def _check(self, spec: AlarmSpec) -> dict | None:
        k, w = spec.keys, spec.window
        if spec.kind == "proxy_gold":
            steps, proxy, gold = self._series(k["proxy"], k["gold"], window=w)
            evidence = proxy_gold_divergence(steps, proxy, gold, min_proxy_slope=spec.threshold) if len(steps) >= 3 else None
            if evidence is None and spec.drop is not None:
                evidence = gold_drawdown(*self._series(k["proxy"], k["gold"], window=10**9), drop=spec.drop)
            if evidence is not None:
                _, kl, all_gold = self._series(k.get("kl", "kl"), k["gold"], window=10**9)
                if len(kl) >= 3:  # where the whole run's gold-vs-sqrt(KL) curve peaks (Gao et al. 2022)
                    fit = fit_gold_vs_sqrt_kl(kl, all_gold)
                    evidence.update(fit_alpha=fit.alpha, fit_beta=fit.beta, peak_kl=fit.peak_kl, kl_now=kl[-1])
            return evidence
        if spec.kind == "length_corr":
            steps, length, reward = self._series(k["length"], k["reward"], window=w)
            if len(steps) < max(3, w):  # judged on a full window only: r of 3 noisy points means little
                return None
            r, gain = pearson(length, reward), slope(steps, reward)
            # length hacking: the reward rises, and rises with the length
            if r > (spec.threshold or 0.8) and gain > 0:
                return {"pearson": r, "reward_slope": gain, "window": [steps[0], steps[-1]]}
            return None
        if spec.kind == "length_bucket":  # per-sample (lengths, rewards) of the first and the last `window` steps
            _, rows = self._series(k["samples"], window=10**9)
            if len(rows) < 2 * w:
                return None
            pool = lambda part: ([x for r in part for x in r[0]], [x for r in part for x in r[1]])  # noqa: E731
            return length_driven_gain(pool(rows[:w]), pool(rows[-w:]), share=spec.threshold or 0.5)
        if spec.kind == "rm_disagreement":
            _, dis = self._series(k["disagreement"], window=10**9)
            if len(dis) >= 2 and dis[-1] > (spec.threshold or 1.5) * dis[0]:
                return {"initial": dis[0], "now": dis[-1], "ratio": dis[-1] / dis[0] if dis[0] > 0 else None}
            return None
        if spec.kind == "kl_accel":
            steps, kl = self._series(k["kl"], window=w)
            ratio = kl_acceleration(steps, kl) if len(steps) >= 4 else 1.0
            return {"slope_ratio": ratio, "kl": kl[-1]} if ratio > (spec.threshold or 3.0) else None
        if spec.kind == "entropy_collapse":
            steps, ent = self._series(k["entropy"], window=10**9)
            if len(ent) >= 2 and ent[0] > 0 and ent[-1] < (spec.threshold or 0.1) * ent[0]:
                return {"initial": ent[0], "now": ent[-1]}
            return None
        _, values = self._series(next(iter(k.values())), window=1)
        if values and values[-1] > spec.threshold:
            return {next(iter(k.values())): values[-1], "threshold": spec.threshold}
        return None

    def update(self, metrics: dict) -> list[FiredAlarm]:
        if "step" not in metrics:
            raise PosttrainError("AlarmMonitor.update: the metrics dict needs a 'step' key")
        self.history.append(dict(metrics))
        fired = []
        for spec in self.specs:
            evidence = self._check(spec)
            if evidence is not None:
                fired.append(FiredAlarm(spec.kind, int(metrics["step"]), spec.action, evidence))
        self.fired.extend(fired)
        return fired

    def first_fired(self) -> FiredAlarm | None:
        return self.fired[0] if self.fired else None
