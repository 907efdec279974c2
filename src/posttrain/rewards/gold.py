"""A hidden *gold* score over completions of the built-in addition task: the "true human preference" of the
built-in RLHF example. Preference pairs are labelled by it, a proxy reward model learns from those pairs, and the
loop logs gold beside the proxy reward (`reward/gold`) so over-optimization of the proxy shows.

    gold = digit credit (share of answer digits right, aligned from the right; 0 for non-digit text)
           - 0.1 per character beyond the answer's length (a brevity term)
"""

from __future__ import annotations

from posttrain.tasks.base import digit_credit

BREVITY_PENALTY = 0.1  # gold points per character longer than the answer


def addition_gold(answer: str, completion: str) -> float:
    """Gold score of `completion` for a problem whose answer is `answer`: at most 1.0 (the exact answer).
    '432' for '432' -> 1.0; '431' -> 2/3; '4320' -> 0 - 0.1 = -0.1; 'ab' -> 0.0."""
    extra = max(0, len(completion.strip()) - len(answer.strip()))
    return digit_credit(answer, completion) - BREVITY_PENALTY * extra


GOLD_FUNCTIONS = {"addition": addition_gold}


def gold_function(task_name: str):
    """The gold function of a built-in task, or None when the task has none."""
    return GOLD_FUNCTIONS.get(task_name)
