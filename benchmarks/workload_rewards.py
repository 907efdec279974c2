"""The benchmark workloads' reward functions, in TRL's `reward_funcs` form. TRL's GRPOTrainer imports this file
(benchmarks/perf_trl.py) and posttrain takes the very same functions through `reward.functions`, unchanged: what a
TRL user's reward function needs to run in posttrain is nothing."""

from __future__ import annotations

VOWELS = set("aeiouAEIOU")


def exact_answer(prompts, completions, answer, **kwargs):
    """The addition task's exact reward: 1 when the stripped completion is the row's answer, else 0."""
    return [1.0 if c.strip() == a.strip() else 0.0 for c, a in zip(completions, answer)]


def vowel_share(prompts, completions, **kwargs):
    """A dense reward every random completion gets a different value of: the share of its letters that are vowels
    (0 when it has no letters). Rewards vary within every group, so every advantage is non-zero and each step
    really updates the policy on both sides."""
    out = []
    for c in completions:
        letters = [ch for ch in c if ch.isalpha()]
        out.append(sum(ch in VOWELS for ch in letters) / len(letters) if letters else 0.0)
    return out
