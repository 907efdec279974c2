"""Scoring completions with a task's verifier, isolating each sample: an exception, a hang (timeout), NaN/inf or a
value of the wrong type becomes a per-sample failure record and the configured default reward, never a crashed or
hung run. The verifier runs in a child process of the reward worker, so a sample that runs past
`reward.timeout_seconds` is cut off by killing that process (a fresh one scores the next sample).

A failure's error text starts with its kind (`FAILURE_KINDS`), e.g. "timeout: verifier ran longer than 10 s";
the driver counts them per kind in the metrics (`reward_failures/<kind>`) and aborts the run when more than
`reward.max_failure_fraction` of the recent samples failed (`FailureBudget`)."""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from posttrain.errors import PosttrainError
from posttrain.orchestration.faults import maybe_wedge
from posttrain.orchestration.stacks import ActorProcess
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


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies, even if a verifier hangs (ray.kill SIGKILLs the worker)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(conn, make_handler: Callable[[], Callable]) -> None:
    """Child process: builds its handler once, then answers requests until the pipe closes."""
    _die_with_parent()
    handler = make_handler()
    conn.send("ready")
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        conn.send(handler(request))


class ChildProcess:
    """A spawned child that builds `make_handler()` once and answers `call(request)` with `handler(request)`. A call
    that takes longer than its timeout kills the child (a fresh one starts on the next call); so does a handler that
    takes its own process down. Shared by the verifier and user reward functions (rewards/functions.py);
    `make_handler` must be picklable."""

    START_TIMEOUT_S = 120.0  # building a task of 20,000 generated problems takes well under a second

    def __init__(self, make_handler: Callable[[], Callable], name: str):
        self.make_handler, self.name = make_handler, name
        self._ctx = mp.get_context("spawn")  # not fork: the reward worker is a multi-threaded Ray process
        self._proc = None
        self._conn = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.make_handler), daemon=True, name=self.name)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(self.START_TIMEOUT_S) or parent.recv() != "ready":
            self.close()
            raise RuntimeError(f"the {self.name} process did not start")

    def call(self, request, timeout_s: float) -> tuple[str, object]:
        """("ok", the handler's answer), ("timeout", None) or ("died", the child's exit code)."""
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send(request)
            if self._conn.poll(timeout_s):
                return "ok", self._conn.recv()
            self.close()
            return "timeout", None
        except (EOFError, OSError):  # the handler took its process down (os._exit, a segfault in an extension)
            self._proc.join(5)  # reap it, for its exit code
            code = self._proc.exitcode
            self.close()
            return "died", code

    def close(self) -> None:
        if self._proc is not None and self._proc.pid is not None:  # pid None: start() itself failed
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


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


class RewardWorker(ActorProcess):
    """The reward role for verifiable tasks. Made a Ray actor by the driver; holds the task's problems by id."""

    def __init__(self, cfg_dict: dict):
        from posttrain.config import RunConfig
        from posttrain.tasks import load_task
        from posttrain.tasks.base import answer_needed

        cfg = RunConfig.model_validate(cfg_dict)
        self.default = cfg.reward.default
        make_task = functools.partial(load_task, cfg.task, cfg.seed, need_answer=answer_needed(cfg.reward.weights))
        self.scorer = IsolatedScorer(make_task, cfg.reward.timeout_seconds, self.default)
        self.functions = None
        if cfg.reward.functions:  # user code: a child process per function (rewards/functions.py)
            from posttrain.rewards.functions import FunctionScorers

            self.functions = FunctionScorers(cfg.reward.functions, cfg.reward.timeout_seconds, self.default)

    def score(self, items: list[tuple[str, str, str, str]]) -> list[tuple[float, str | None]]:
        """items: (problem_id, prompt, answer, completion_text) -> (reward, error) per item."""
        maybe_wedge("reward")  # a recovery test's hang (orchestration/faults.py); nothing otherwise
        out = []
        for pid, prompt, answer, text in items:
            r = self.scorer.score(Problem(pid, prompt, answer), text)
            out.append((r.reward, r.error))
        return out

    def score_functions(self, rows: list[dict], step) -> dict[str, tuple[list, list]]:
        """The user's reward functions on rows (prompt, completion, answer, completion_ids, sample_id, columns):
        name -> (score per row, error per row); see FunctionScorers.score."""
        return self.functions.score(rows, step)


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
