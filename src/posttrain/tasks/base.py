"""A task is a train split, a disjoint held-out split and a verifier that scores a completion in [0, 1]."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Problem:
    id: str       # stable across runs with the same seed: the prompt_id of every sample drawn from it
    prompt: str | list[dict]   # text, or chat-format [{role, content}] turns (PromptEncoder renders both)
    answer: str | None         # None: a dataset row without an answer (no verifier compares with it)
    # A dataset row's other columns (name -> JSON value), given to reward functions as keyword arguments.
    columns: dict[str, Any] = field(default_factory=dict)


def prompt_text(prompt: str | list[dict]) -> str:
    """A prompt as plain text for what reads text (the LLM judge, the held-out overlap count): chat turns as
    "role: content" lines."""
    return prompt if isinstance(prompt, str) else "\n".join(f"{t['role']}: {t['content']}" for t in prompt)


class Task(Protocol):
    name: str
    train: list[Problem]
    heldout: list[Problem]

    def score(self, problem: Problem, completion: str) -> float:
        """Reward in [0, 1] for `completion` (the decoded text after the prompt, EOS and padding removed)."""
        ...


def exact_match(answer: str, completion: str) -> float:
    return 1.0 if completion.strip() == answer.strip() else 0.0


def digit_credit(answer: str, completion: str) -> float:
    """Share of positions, aligned from the right, where the completion's digits equal the answer's, over the
    longer of the two: '725' for '724' -> 2/3; '7240' -> 0 (every position shifts); 1.0 only for the exact
    answer. A denser signal than exact match for arithmetic, where the last digits are the hard ones."""
    a, c = answer.strip(), completion.strip()
    if not c or not c.isdigit():
        return 0.0
    width = max(len(a), len(c))
    same = sum(x == y for x, y in zip(reversed(a), reversed(c)))
    return same / width


LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number_match(answer: str, completion: str) -> float:
    """1 when the completion's last number, as written, is the answer ('The answer is 12.' for '12'): the lenient
    check for models that explain before they answer. Digits only, no separators: '1,200' ends in '200'."""
    numbers = LAST_NUMBER.findall(completion)
    return 1.0 if numbers and numbers[-1] == answer.strip() else 0.0


def verifier_for(kind: str):
    if kind == "python":  # the completion is a program, run in the sandbox; 1 when it prints the answer
        from posttrain.sandbox import isolation_prefix, python_output_match

        isolation_prefix()  # refuse now, with a clear error, where model output cannot be confined
        return python_output_match
    return {"exact": exact_match, "digits": digit_credit, "last_number": last_number_match}[kind]


def answer_needed(reward_weights: dict[str, float]) -> bool:
    """Whether an RL run compares completions with the dataset's answers: when the verifier is a weighted reward
    source (its score is still computed, and logged as accuracy, as 0 for rows without an answer)."""
    return bool(reward_weights.get("verifier"))
