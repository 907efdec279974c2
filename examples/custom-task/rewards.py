"""This example's definition of quality, as plain Python: the same functions train the policy (reward.functions)
and score it in evaluation (`posttrain eval --from-run`). Both forms are shown. The prompts are chat messages, so
each completion arrives as TRL's GRPOTrainer passes it for conversational data: a list with one assistant message,
`[{"role": "assistant", "content": "..."}]` (a dataset of plain string prompts gets plain string completions)."""

from __future__ import annotations

import re


def correct(prompts, completions, answer, **kwargs):
    """Batch form (TRL's reward_funcs form, unchanged): 1 when the completion's first number is the answer's."""
    out = []
    for completion, gold in zip(completions, answer):
        got = re.search(r"\d+", completion[0]["content"])
        out.append(1.0 if got and got.group() == gold.split()[0] else 0.0)
    return out


def names_unit(prompt, completion, unit):
    """Per-sample form, reading the dataset's own `unit` column: 1 when the completion names the right unit,
    None (does not apply) when the completion has no words at all."""
    words = completion[0]["content"].split()
    if not words:
        return None
    return 1.0 if unit in words else 0.0
