"""Composing a sample's reward from several sources with weights (pure: lists of floats in, lists out).

Sources (names used in `reward.weights` and logged as `reward/<name>`):
    verifier  the task's verifier score (rewards/verifier.py), in [0, 1]
    rm        a reward model's score, normalized by the mean/std stored with the model
    judge     an LLM judge's score (rewards/judge.py), mapped to [0, 1]
    length    -(completion tokens) / rollout.max_new_tokens, in [-1, 0]
    format    1 when the completion matches `reward.format_regex`, else 0
    environment  a multi-turn environment's reward for the episode (the sum of its turns'; None = gave none)
    <name>    a reward function from user code (`reward.functions`, rewards/functions.py); its weight is there.
              Its score may be None (does not apply): that sample adds nothing from it.
"""

from __future__ import annotations

import re


def normalize(scores: list[float], mean: float, std: float) -> list[float]:
    """(s - mean) / std for each score: the RM's scale made comparable to the other sources."""
    return [(s - mean) / std for s in scores]


def ensemble_mean(member_scores: list[list[float]]) -> list[float]:
    """Per sample, the mean of the ensemble members' (normalized) scores: [[1, 2], [3, 0]] -> [2.0, 1.0]."""
    return [sum(col) / len(col) for col in zip(*member_scores)]


def ensemble_spread(member_scores: list[list[float]]) -> list[float]:
    """Per sample, the population std of the members' scores: [[1, 2], [3, 0]] -> [1.0, 1.0]. Its batch mean is
    `evals.alarms.ensemble_disagreement(..., standardize=False)`, logged as reward/rm_disagreement."""
    out = []
    for col in zip(*member_scores):
        mean = sum(col) / len(col)
        out.append((sum((x - mean) ** 2 for x in col) / len(col)) ** 0.5)
    return out


def length_component(num_tokens: list[int], max_new_tokens: int) -> list[float]:
    """-(tokens) / max_new_tokens: 0 for an empty completion, -1 for one that used the whole budget."""
    return [-n / max_new_tokens for n in num_tokens]


def format_component(completions: list[str], pattern: str) -> list[float]:
    """1.0 where the whole completion (stripped) matches the regex `pattern`, else 0.0."""
    rx = re.compile(pattern)
    return [1.0 if rx.fullmatch(c.strip()) else 0.0 for c in completions]


def compose(components: dict[str, list[float | None]], weights: dict[str, float]) -> list[float]:
    """The total reward per sample: sum over sources of weight * component, a None component adding nothing.
    Every weighted source must be present and all components must have the same length; sources without a weight
    are logged, not added."""
    missing = [k for k, w in weights.items() if w and k not in components]
    if missing:
        raise ValueError(f"no scores for weighted reward source(s) {missing}")
    lengths = {len(v) for v in components.values()}
    if len(lengths) > 1:
        raise ValueError(f"reward components differ in length: { {k: len(v) for k, v in components.items()} }")
    n = lengths.pop() if lengths else 0
    return [sum(w * components[k][i] for k, w in weights.items() if w and components[k][i] is not None)
            for i in range(n)]
