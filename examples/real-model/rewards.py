"""The example's reward, written as TRL's documentation writes one for conversational data: `completions` are lists
of assistant messages, `answer` is the dataset's column. 1.0 when the completion's last number is the answer."""

import re


def correct(prompts, completions, answer, **kwargs):
    scores = []
    for completion, gold in zip(completions, answer):
        numbers = re.findall(r"-?\d+", completion[0]["content"])
        scores.append(1.0 if numbers and numbers[-1] == gold else 0.0)
    return scores
