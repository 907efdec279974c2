"""The learning monitor's statistics (evals/progress.py watches a run with them): the trend of a per-step series
and, when the training reward is not rising, the likely cause named from the run's own metrics with the figure
behind it. Pure: lists of numbers and metrics records in, numbers and sentences out.

The trend is the OLS slope of the series on the step number, with its standard error from the residuals and a
one-sided Student-t test of "the series does not rise" (df = n - 2). Why a slope and not the early-vs-late window
z-test (tests/test_algorithm_runs.py's): the slope uses every step of the window, not only its two ends, so it has
more power on the steady early rise a learning run shows, and it needs no split of a short window into two
shorter ones. Steps of a run that does not learn are independent draws around a flat mean (fresh prompts each step),
which is the test's null; a learning run's steps are correlated through the weights, which only matters when the
run learns, and then the slope is clearly positive anyway."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Sequence

# Thresholds of the diagnosis, each measured on the tiny model's planted runs (docs/evals.md, "Is it learning?"):
# the update's size relative to the weights per step (train update_ratio) ...
BARELY_MOVES = 1e-6  # below: the learning rate does nothing (lr 1e-9: ~1e-8; a learning lr 1e-3: ~1e-3)
JUMPS = 3e-2  # above: each step rewrites a few percent of the weights (lr 1e-1: ~1e-1)
CLIP_HIGH = 0.2  # mean clip fraction above which the updates leave the trust region
# Largest step-to-step entropy change as a share of the window's mean entropy. At a fixed policy (lr 1e-9) the
# entropy of 32 four-token completions changed by up to 74% of its mean from one step to the next: batch noise.
ENTROPY_SWING = 1.0
FEW_SIGNAL = 0.25  # mean share of groups whose rewards differ
TRUNCATED = 0.5  # mean share of completions cut at rollout.max_new_tokens


@dataclass(frozen=True)
class Trend:
    """The OLS trend of a series over n steps: slope per step, its standard error, t = slope / se and the one-sided
    p-value of "no rise" (small p: the series rises)."""

    slope: float
    se: float
    t: float
    p: float
    n: int

    def rises(self, alpha: float) -> bool:
        return self.p < alpha

    def __str__(self) -> str:
        return f"{self.slope:+.2g}/step +- {self.se:.2g} (t {self.t:.1f}, one-sided p {self.p:.2g}, {self.n} steps)"


def t_upper_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with integer df >= 1, exact (Abramowitz & Stegun 26.7.3-4: a finite series in
    theta = atan(t / sqrt(df)))."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: A = (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), df - 3 terms past 1
        term, series = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            series += term
        inside = 2 / math.pi * (theta + s * math.cos(theta) * series)
    else:  # even: A = sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, series = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            series += term
        inside = s * series
    return (1 - inside) / 2 if t >= 0 else (1 + inside) / 2


def trend(values: Sequence[float]) -> Trend:
    """The OLS slope of `values` on 0..n-1 with its standard error and one-sided p (module docstring). Fewer than
    3 values: no trend can be told (slope 0, p 1)."""
    n = len(values)
    if n < 3:
        return Trend(0.0, math.inf, 0.0, 1.0, n)
    xbar, ybar = (n - 1) / 2, sum(values) / n
    sxx = sum((i - xbar) ** 2 for i in range(n))
    slope = sum((i - xbar) * (y - ybar) for i, y in enumerate(values)) / sxx
    resid = sum((y - ybar - slope * (i - xbar)) ** 2 for i, y in enumerate(values))
    se = math.sqrt(resid / (n - 2) / sxx)
    if se == 0.0:
        t = math.copysign(math.inf, slope) if slope else 0.0
    else:
        t = slope / se
    return Trend(slope, se, t, t_upper_tail(t, n - 2) if t else 0.5, n)


@dataclass(frozen=True)
class Cause:
    """The likely reason the reward does not rise: `kind` (a key: barely_moves, jumps, few_signal, truncated,
    heldout_gap, reward_not_following), the `figure` behind it, and a sentence with both and what to try."""

    kind: str
    figure: float
    message: str


def _values(records: Sequence[dict], key: str) -> list[float]:
    return [float(r[key]) for r in records if r.get(key) is not None]


def _entropy_swing(entropy: list[float]) -> float:
    """The largest step-to-step change of the entropy as a share of its mean over the window (0 with < 2 steps)."""
    if len(entropy) < 2 or not sum(entropy):
        return 0.0
    return max(abs(b - a) for a, b in zip(entropy, entropy[1:])) / (sum(entropy) / len(entropy))


def policy_cause(records: Sequence[dict]) -> Cause | None:
    """The update's size is the cause: too large (update_ratio, then clip fraction or entropy swings) or too small.
    Steps that trained nothing (no signal) carry no update_ratio and are left out of its median."""
    ratio = median(_values(records, "update_ratio") or [math.nan])
    clip = _values(records, "clip_fraction")
    swing = _entropy_swing(_values(records, "entropy"))
    too_high = "the learning rate is likely too high: try algorithm.lr / 10 (or `posttrain probe`)"
    if ratio > JUMPS:
        return Cause("jumps", ratio, f"the policy jumps: each update changes the weights by {ratio:.2g} of their "
                     f"norm (median; above {JUMPS:g}); {too_high}")
    if ratio < BARELY_MOVES:  # before the entropy: at a fixed policy a small batch's entropy swings on its own
        return Cause("barely_moves", ratio, f"the policy barely moves: each update changes the weights by "
                     f"{ratio:.2g} of their norm (median; below {BARELY_MOVES:g}); the learning rate is likely too "
                     "low: try algorithm.lr x 10 (or `posttrain probe`)")
    if clip and sum(clip) / len(clip) > CLIP_HIGH:
        mean = sum(clip) / len(clip)
        return Cause("jumps", mean, f"the policy jumps: {mean:.0%} of tokens clipped (mean; above {CLIP_HIGH:.0%}); "
                     f"{too_high}")
    if swing > ENTROPY_SWING:
        return Cause("jumps", swing, f"the policy jumps: the entropy changed by {swing:.0%} of its mean in one step "
                     f"(above {ENTROPY_SWING:.0%}); {too_high}")
    return None


def data_cause(records: Sequence[dict]) -> Cause | None:
    """The batches are the cause: too few groups with a signal, or completions cut at the length limit."""
    signal = _values(records, "signal_share")
    if signal and sum(signal) / len(signal) < FEW_SIGNAL:
        share = sum(signal) / len(signal)
        return Cause("few_signal", share, f"too few groups with a signal: {share:.0%} of groups had rewards that "
                     f"differ (mean; below {FEW_SIGNAL:.0%}); try a larger algorithm.group_size, easier prompts or "
                     "partial credit (`posttrain probe`)")
    cut = _values(records, "truncated_share")
    if cut and sum(cut) / len(cut) >= TRUNCATED:
        share = sum(cut) / len(cut)
        return Cause("truncated", share, f"completions cut at the length limit: {share:.0%} of completions reached "
                     f"rollout.max_new_tokens (mean; {TRUNCATED:.0%} or more); raise rollout.max_new_tokens or "
                     "reward shorter answers")
    return None


def heldout_gap(records: Sequence[dict], alpha: float) -> Cause | None:
    """The held-out accuracy does not follow a training reward that rises (needs >= 3 held-out points)."""
    held = _values(records, "eval/heldout_accuracy")
    if len(held) < 3:
        return None
    train, test = trend(_values(records, "reward_mean")), trend(held)
    if not train.rises(alpha) or test.slope > 0:
        return None
    return Cause("heldout_gap", test.slope, f"a held-out/training gap: the training reward rises ({train}) but the "
                 f"held-out accuracy does not ({test.slope:+.2g}/eval over {len(held)} evals); the reward may "
                 "reward something other than the task (check reward hacking: alarms.rules), or the training "
                 "prompts differ from the held-out ones")


def diagnose(records: Sequence[dict], alpha: float = 0.05) -> Cause:
    """The likely cause of a window of steps whose training reward does not rise, from its metrics records (steps
    in order): the update's size first (it decides whether anything can be learned), then the batches, then a
    held-out/training gap; when none stands out, the policy moves and the reward does not follow it."""
    found = policy_cause(records) or data_cause(records) or heldout_gap(records, alpha)
    if found is not None:
        return found
    ratio = median(_values(records, "update_ratio") or [math.nan])
    got = trend(_values(records, "reward_mean"))
    return Cause("reward_not_following", got.slope, f"the policy moves (updates of {ratio:.2g} of the weights' "
                 f"norm, median) but the reward does not follow ({got}): the reward may not depend on the "
                 "completion, or be too noisy for this batch; check the reward function on a few samples, or use "
                 "more prompts per step")
