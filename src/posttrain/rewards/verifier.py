"""Scoring completions with a task's verifier, isolating each sample: an exception, NaN/inf or a value of the
wrong type becomes a per-sample failure record and the configured default reward, never a crashed run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from posttrain.tasks.base import Problem, Task


@dataclass
class RewardResult:
    reward: float
    error: str | None = None  # why the verifier failed on this sample, None when it succeeded


def score_one(task: Task, problem: Problem, completion: str, default: float = 0.0) -> RewardResult:
    try:
        value = task.score(problem, completion)
    except Exception as e:  # noqa: BLE001 — a user's verifier may raise anything; record it per sample
        return RewardResult(default, f"{type(e).__name__}: {e}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return RewardResult(default, f"verifier returned {type(value).__name__}, expected a float")
    if not math.isfinite(value):
        return RewardResult(default, f"verifier returned {value}")
    return RewardResult(float(value))


class RewardWorker:
    """The reward role for verifiable tasks. Made a Ray actor by the driver; holds the task's problems by id."""

    def __init__(self, cfg_dict: dict):
        from posttrain.config import RunConfig
        from posttrain.tasks import load_task

        cfg = RunConfig.model_validate(cfg_dict)
        self.task = load_task(cfg.task, cfg.seed)
        self.default = cfg.reward.default

    def score(self, items: list[tuple[str, str, str, str]]) -> list[tuple[float, str | None]]:
        """items: (problem_id, prompt, answer, completion_text) -> (reward, error) per item."""
        out = []
        for pid, prompt, answer, text in items:
            r = score_one(self.task, Problem(pid, prompt, answer), text, self.default)
            out.append((r.reward, r.error))
        return out
