"""Scoring completions with a task's verifier, isolating each sample: an exception, a hang (timeout), NaN/inf or a
value of the wrong type becomes a per-sample failure record and the configured default reward, never a crashed or
hung run. The verifier runs in a child process of the reward worker, so a sample that runs past
`reward.timeout_seconds` is cut off by killing that process (a fresh one scores the next sample; the child is a
rewards/child_process.py `ChildProcess`; the reward worker actor is rewards/worker.py).

A failure's error text starts with its kind (`FAILURE_KINDS`), e.g. "timeout: verifier ran longer than 10 s";
the driver counts them per kind in the metrics (`reward_failures/<kind>`) and aborts the run when more than
`reward.max_failure_fraction` of the recent samples failed (`FailureBudget`)."""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from posttrain.errors import PosttrainError
from posttrain.rewards.child_process import ChildProcess
from posttrain.tasks.base import Problem, Task

FAILURE_KINDS = ("exception", "timeout", "nan", "type")


@dataclass
class RewardResult:
    reward: float
    error: str | None = None  # "<kind>: why the verifier failed on this sample"; None when it succeeded


def score_one(task: Task, problem: Problem, completion: str, default: float = 0.0) -> RewardResult:
    try:
        value = task.score(problem, completion)
    except Exception as e:  # noqa: BLE001 — a user's verifier may raise anything; record it per sample
        return RewardResult(default, f"exception: {type(e).__name__}: {e}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return RewardResult(default, f"type: verifier returned {type(value).__name__}, expected a float")
    if not math.isfinite(value):
        return RewardResult(default, f"nan: verifier returned {value}")
    return RewardResult(float(value))


def failure_kind(error: str | None) -> str | None:
    return None if error is None else error.split(":", 1)[0]


def failure_counts(errors: Iterable[str | None]) -> dict[str, int]:
    """{"reward_failures/<kind>": count} for every kind, zeros included (steady metric columns)."""
    counts = dict.fromkeys(FAILURE_KINDS, 0)
    for e in errors:
        kind = failure_kind(e)
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + 1
    return {f"reward_failures/{k}": v for k, v in counts.items()}


# ---------------------------------------------------------------------------------------------- isolation


def _task_handler(make_task: Callable[[], Task], default: float) -> Callable:
    task = make_task()
    return lambda request: score_one(task, *request, default)


class IsolatedScorer:
    """Scores samples one by one in a child process; a sample that takes longer than `timeout_s` seconds kills
    the child (a new one starts for the next sample). `make_task` must be picklable (the child is spawned)."""

    def __init__(self, make_task: Callable[[], Task], timeout_s: float, default: float = 0.0):
        self.timeout_s, self.default = timeout_s, default
        self.child = ChildProcess(functools.partial(_task_handler, make_task, default), "posttrain-verifier")

    def score(self, problem: Problem, completion: str) -> RewardResult:
        status, value = self.child.call((problem, completion), self.timeout_s)
        if status == "ok":
            return value
        if status == "timeout":
            return RewardResult(self.default, f"timeout: verifier ran longer than {self.timeout_s:g} s")
        return RewardResult(self.default, f"exception: the verifier's process died (exit code {value})")

    def close(self) -> None:
        self.child.close()


# ---------------------------------------------------------------------------------------------- run-level threshold


class FailureBudget:
    """Aborts the run when more than `max_fraction` of the samples of the last `window_steps` steps failed to
    score. A broken verifier then stops the run at its first step instead of training on default rewards."""

    def __init__(self, max_fraction: float, window_steps: int):
        self.max_fraction = max_fraction
        self.window: deque[tuple[int, int, dict]] = deque(maxlen=window_steps)  # (samples, failures, counts)

    def check(self, record: dict, samples: dict) -> None:
        """record: the step's metrics (reward_failures, reward_failures/<kind>); samples: its samples.jsonl entry."""
        n = len(samples["samples"])
        counts = {k.split("/", 1)[1]: v for k, v in record.items() if k.startswith("reward_failures/")}
        self.window.append((n, int(record.get("reward_failures", 0)), counts))
        total = sum(w[0] for w in self.window)
        failed = sum(w[1] for w in self.window)
        if total == 0 or failed / total <= self.max_fraction:
            return
        kinds = dict.fromkeys([*FAILURE_KINDS, *(k for w in self.window for k in w[2] if "/" not in k)])
        by_kind = {k: sum(w[2].get(k, 0) for w in self.window) for k in kinds}
        example = next(iter((samples.get("reward_errors") or {}).items()), None)
        raise PosttrainError(
            f"reward: {failed} of the last {total} samples ({failed / total:.0%}, over {len(self.window)} steps) "
            f"failed to score, above reward.max_failure_fraction={self.max_fraction:g} "
            f"({', '.join(f'{k}: {v}' for k, v in by_kind.items())})"
            + (f"; e.g. sample {example[0]}: {example[1]}" if example else ""),
            hint="fix the task's verifier or the reward function named (each failure is in samples.jsonl under "
            "reward_errors), raise reward.timeout_seconds for slow ones, or raise reward.max_failure_fraction",
        )
