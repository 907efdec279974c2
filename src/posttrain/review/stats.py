"""Statistics of a review session, as pure functions on verdicts and scores (no I/O, no store).

Conventions: a comparison is "B against A" (as in evals/stats.py), so a value of 1 means B was preferred. A
judgment's value is a = 0, b = 1, tie = 0.5; both_bad has no value and is reported apart (it says neither output
is acceptable, not that they are equally good).

Per item: its human preference is the mean value of its judgments that are not both_bad (None when it has none);
an item whose every judgment is both_bad is a both-bad item. An item is human-decided when its preference is not
None and not 0.5: B was preferred when it is above 0.5 (e.g. one "b" and one "tie" = 0.75), A when below.

Confidence intervals are Wilson score intervals (95%). Why Wilson: it behaves at n = 10..200 and at the edges,
where a normal interval collapses (10 wins of 10 gives [1, 1] under the normal interval, [0.72, 1] under Wilson)
or leaves [0, 1]. For the win rate the per-item values lie in [0, 1] but are not all 0/1 (ties count as half); the
Wilson interval of the fractional count sum(values) over n items is then conservative, since a [0, 1]-valued item
with mean p has variance at most p (1 - p), the Bernoulli variance Wilson assumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from posttrain.evals.runner import Z95
from posttrain.evals.suites import pairwise_score

VERDICT_VALUE = {"a": 0.0, "b": 1.0, "tie": 0.5}
CATEGORIES = ("a", "b", "tie", "both_bad")


def item_preference(verdicts: Sequence[str]) -> Optional[float]:
    """Mean value of the verdicts that are not both_bad (a = 0, b = 1, tie = 0.5); None when there are none."""
    values = [VERDICT_VALUE[v] for v in verdicts if v != "both_bad"]
    return sum(values) / len(values) if values else None


def is_both_bad(verdicts: Sequence[str]) -> bool:
    """True when the item has judgments and every one is both_bad."""
    return bool(verdicts) and all(v == "both_bad" for v in verdicts)


def human_choice(preference: Optional[float]) -> Optional[str]:
    """"a" or "b" for a human-decided item (preference below / above 0.5), None otherwise."""
    if preference is None or preference == 0.5:
        return None
    return "b" if preference > 0.5 else "a"


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion successes / n (successes may be fractional), clipped to [0, 1]."""
    if n <= 0:
        raise ValueError("wilson: n must be positive")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Rate:
    """A share with its 95% Wilson interval over n units; every field None (n 0) when there is nothing to count."""

    value: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    n: int


def rate(values: Sequence[float]) -> Rate:
    """Mean of [0, 1]-valued units (items, pairs) with the Wilson 95% interval of sum(values) / n."""
    if not values:
        return Rate(None, None, None, 0)
    total = float(sum(values))
    lo, hi = wilson(total, len(values))
    return Rate(total / len(values), lo, hi, len(values))


def win_rate(preferences: Sequence[Optional[float]]) -> Rate:
    """B's win rate over A: the mean human preference over items that have one (both-bad and unjudged items left
    out), with the Wilson 95% interval (see the module docstring)."""
    return rate([p for p in preferences if p is not None])


@dataclass(frozen=True)
class Kappa:
    kappa: Optional[float]  # None when no item was judged twice, or chance agreement is 1
    observed: Optional[float]  # share of doubly judged items where the first two judgments agree
    n_pairs: int


def cohens_kappa(pairs: Sequence[tuple[str, str]]) -> Kappa:
    """Cohen's kappa of (first judgment, second judgment) per doubly reviewed item, over the categories a, b, tie,
    both_bad. "First" and "second" are by time: different items have different reviewers, so the two marginals
    are those of first and second judgments (the usual way to pool many raters into two). kappa = (p_o - p_e) /
    (1 - p_e), p_o the observed agreement, p_e = sum over categories of p_first(c) * p_second(c)."""
    n = len(pairs)
    if n == 0:
        return Kappa(None, None, 0)
    observed = sum(x == y for x, y in pairs) / n
    expected = sum((sum(x == c for x, _ in pairs) / n) * (sum(y == c for _, y in pairs) / n) for c in CATEGORIES)
    kappa = None if math.isclose(expected, 1.0) else (observed - expected) / (1.0 - expected)
    return Kappa(kappa, observed, n)


def scorer_agreement(choices: Sequence[str], scores: Sequence[tuple[float, float]]) -> Rate:
    """Share of human-decided pairs where a scorer prefers the human's choice, with its Wilson 95% interval.
    choices[i] is "a" or "b" (the human choice of item i), scores[i] the scorer's (score of A, score of B); a
    scorer tie counts 0.5 (pairwise_score, as preference suites count it)."""
    if len(choices) != len(scores):
        raise ValueError(f"scorer_agreement: {len(choices)} choices but {len(scores)} score pairs")
    agree = [pairwise_score(b, a) if c == "b" else pairwise_score(a, b) for c, (a, b) in zip(choices, scores)]
    return rate(agree)
