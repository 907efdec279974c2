"""Hang detection (`ops.watchdog`): the driver waits for its remote calls with a bound, never forever.

A call of one kind (generate, heldout, alarm_probe, sync, reward, reward_functions, reference, values, train, eval)
on one role (rollout, reward, reward_model, reference, trainer, critic, evaluator) is hung once it has run longer than
`hang_bound`: ops.hang_factor x the median of the last RECENT durations of that kind on that role, and at least
ops.hang_min_seconds; while fewer than COLD_CALLS are measured, ops.hang_cold_seconds (the first generate compiles
kernels, the first train step allocates its optimizer state).

On a hang the watchdog writes every role's Python stacks and the driver's to runs/<name>/hangs/<step>/ (stacks.py),
sends `hang_detected` (ops.notify), and then, by role:
- a rollout worker is killed and restarted by Ray; its caller (redo.gather_with_redo) sees the actor die,
  syncs the trainer's weights into the new engine and redoes the same share with the same seeds;
- the reward worker, the reference and the reward model (fixed functions: restarted, they compute the same thing)
  are killed and restarted by Ray, which retries the pending call itself (their actors' max_task_retries);
- a trainer rank, the critic or the evaluator hold state the driver cannot hand back: they are killed and RolesLost
  is raised; the run (loop.py) re-forms its roles from the last checkpoint.
When the redone call returns, the hang is a line of runs/<name>/interruptions.jsonl and `hang_recovered` is sent.

Call sites use `watched_get(watchdog, calls)`: with no watchdog (ops.watchdog=false) it is exactly ray.get."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from posttrain.remote.stacks import ask_processes, dump_stacks, new_hang_dir
from posttrain.tracking.interruptions import record_interruption

RECENT = 20      # durations kept per (kind, role): the median follows a run whose steps slow down or speed up
COLD_CALLS = 3   # fewer measured durations than this: the bound is ops.hang_cold_seconds
# Kinds whose duration says nothing about the next call's: a partial rollout's generate returns when new weights cut
# it (rollout/partial.py), so its durations are never kept and it is always judged by the cold bound.
UNTIMED = ("generate_interruptible",)
STATEFUL = ("trainer", "critic", "evaluator")  # a restart loses their state: the run re-forms from a checkpoint
START_ASK_S = 60.0  # every role answers process() at the start; on a loaded machine a fresh actor takes seconds

Call = tuple  # (ObjectRef, kind, role): what a call site hands the watchdog for one remote call


class RolesLost(RuntimeError):
    """A role that holds state the driver cannot hand back (a trainer rank, the critic, the evaluator) is gone: its
    process or node died, or the watchdog killed it after a hang. The run (loop.py) re-creates its roles and
    resumes from the last checkpoint in process, or exits 76 when the cluster cannot hold the plan any more."""

    def __init__(self, role: str, reason: str):
        super().__init__(f"{role}: {reason}")
        self.role, self.reason = role, reason


def hang_bound(durations: Iterable[float], factor: float, min_s: float, cold_s: float) -> float:
    """Seconds after which a call is hung, from the durations (seconds) of earlier calls of its kind, oldest
    first: max(min_s, factor x median of the last RECENT); max(min_s, cold_s) while fewer than COLD_CALLS."""
    recent = list(durations)[-RECENT:]
    if len(recent) < COLD_CALLS:
        return max(min_s, cold_s)
    return max(min_s, factor * statistics.median(recent))


def role_family(role: str) -> str:
    """rollout3 -> rollout, trainer1 -> trainer: the roles whose calls share statistics."""
    return role.rstrip("0123456789")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Hang:
    kind: str
    role: str
    step: int
    elapsed_s: float
    bound_s: float
    median_s: float | None
    detected_at: float = 0.0   # unix seconds
    t0: float = 0.0            # monotonic, for the recovery time
    stacks: Path | None = None

    def summary(self) -> dict:
        """What index.json, the interruption record and the notifications say about it (seconds)."""
        median = None if self.median_s is None else round(self.median_s, 4)
        return {"step": self.step, "kind": self.kind, "role": self.role, "elapsed_s": round(self.elapsed_s, 3),
                "bound_s": round(self.bound_s, 3), "median_s": median}


class Watchdog:
    """Bounds the driver's waits on the run's actors: `actors()` returns them now, role name -> actor handle
    (the run passes `lambda: role_actors(roles)`, orchestration/roles.py; asked anew each time, since a re-formed
    run has new ones). `step` is set by the run (the step in progress, as numbered in metrics.jsonl); `hangs`
    counts the hangs detected. Safe to use from several driver threads (one-step-off rollout waits in its own)."""

    def __init__(self, cfg, actors: Callable[[], dict[str, Any]], notify: Callable[..., None] | None = None, log: Callable[[str], None] = _stderr):
        ops = cfg.ops
        self.factor, self.min_s, self.cold_s = ops.hang_factor, ops.hang_min_seconds, ops.hang_cold_seconds
        self.run_dir = Path(cfg.run_dir)
        self.actors = actors
        self.notify = notify or (lambda event, **fields: None)
        self.log = log
        self.step = 0
        self.hangs = 0
        self._durations: dict[tuple[str, str], deque] = defaultdict(lambda: deque(maxlen=RECENT))
        self._recovering: dict[str, Hang] = {}  # role -> its hang, until the redone call returns
        self._paused_s = 0.0  # driver time spent dumping stacks: other calls' deadlines move by it
        self._lock = threading.Lock()
        # A hung actor cannot say where it is: ask every role now, while all of them answer.
        self.processes = ask_processes(actors(), START_ASK_S)

    def _recent(self, kind: str, role: str) -> list[float]:
        with self._lock:
            return list(self._durations[(kind, role_family(role))])

    def bound(self, kind: str, role: str) -> tuple[float, float | None]:
        """(bound in seconds, median of the recent durations or None while cold) for a call of `kind` on `role`."""
        recent = self._recent(kind, role)
        median = statistics.median(recent) if len(recent) >= COLD_CALLS else None
        return hang_bound(recent, self.factor, self.min_s, self.cold_s), median

    def _deadline(self, kind: str, role: str, started: float, paused0: float) -> float:
        # every wait on every remote call passes here: the bound alone (the median is for a hang's report)
        bound = hang_bound(self._recent(kind, role), self.factor, self.min_s, self.cold_s)
        hang = self._recovering.get(role)
        if hang is not None:  # the restarted actor redoes the call: its start-up comes on top, as on a cold call
            started, bound = max(started, hang.t0), max(bound, self.cold_s)
        return started + bound + (self._paused_s - paused0)

    def get(self, calls: list[Call], started: float | None = None, block: bool = True) -> list | None:
        """ray.get of every call's ref, in order, raising what ray.get raises; a call past its bound is a hang
        (see the module docstring). `started`: when the calls were submitted (monotonic; default now).
        block=False: returns None at once unless every call has returned."""
        import ray

        started = time.monotonic() if started is None else started
        paused0 = self._paused_s
        pending = {ref: i for i, (ref, _, _) in enumerate(calls)}
        results: list = [None] * len(calls)
        if not block:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            if len(ready) < len(pending):
                self._check([calls[pending[r]] for r in pending if r not in ready], started, paused0)
                return None
        while pending:
            deadlines = {ref: self._deadline(calls[i][1], calls[i][2], started, paused0) for ref, i in pending.items()}
            timeout = max(0.0, min(deadlines.values()) - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            for ref in ready:
                i = pending.pop(ref)
                results[i] = ray.get(ref)  # a failed call raises here, as with ray.get
                self._returned(calls[i][1], calls[i][2], time.monotonic() - started)
            if not ready:
                self._check([calls[i] for i in pending.values()], started, paused0)
        return results

    # ------------------------------------------------------------------ bookkeeping

    def _returned(self, kind: str, role: str, seconds: float) -> None:
        with self._lock:
            hang = self._recovering.pop(role, None)
            if hang is None and kind not in UNTIMED:
                self._durations[(kind, role_family(role))].append(seconds)
        if hang is not None:
            self._recovered(hang)

    def _check(self, pending: list[Call], started: float, paused0: float) -> None:
        now = time.monotonic()
        overdue: dict[str, Hang] = {}
        for _, kind, role in pending:
            if role not in overdue and self._deadline(kind, role, started, paused0) <= now:
                bound, median = self.bound(kind, role)
                overdue[role] = Hang(kind, role, self.step, now - started, bound, median)
        if overdue:
            self._on_hang(list(overdue.values()))

    # ------------------------------------------------------------------ a hang

    def _on_hang(self, hangs: list[Hang]) -> None:
        import ray

        t0, detected = time.monotonic(), time.time()
        with self._lock:
            self.hangs += len(hangs)
        actors = self.actors()
        stuck = {role_family(h.role) for h in hangs}
        self.processes.update(ask_processes({r: a for r, a in actors.items() if role_family(r) not in stuck}))
        out_dir = new_hang_dir(self.run_dir, hangs[0].step)
        for h in hangs:
            h.detected_at, h.t0, h.stacks = detected, t0, out_dir
            self.log(f"hang at step {h.step}: {h.kind} on {h.role} has run {h.elapsed_s:.1f} s, past its bound of "
                     f"{h.bound_s:.1f} s; every actor's stacks go to {out_dir}")
        known = {r: p for r, p in self.processes.items() if r in actors}
        dump_stacks(out_dir, known, {**hangs[0].summary(), "hung": [h.summary() for h in hangs],
                                     "no_process": sorted(set(actors) - set(known))})  # never said where it runs
        with self._lock:
            self._paused_s += time.monotonic() - t0
        for h in hangs:
            self.notify("hang_detected", **h.summary(), stacks=str(out_dir))
        lost = [h for h in hangs if role_family(h.role) in STATEFUL]
        for h in hangs:
            if h not in lost and h.role in actors:  # Ray restarts it; Ray retries the call, or its caller redoes it
                with self._lock:
                    self._recovering[h.role] = h
                ray.kill(actors[h.role], no_restart=False)
        if lost:
            gone = {role_family(h.role) for h in lost}
            for role, actor in actors.items():
                if role_family(role) in gone:  # every trainer rank: their collectives only work together
                    ray.kill(actor, no_restart=True)
            h = lost[0]
            raise RolesLost(h.role, f"hung: its {h.kind} call ran {h.elapsed_s:.0f} s, past its bound of "
                                    f"{h.bound_s:.0f} s; killed (stacks in {out_dir})")

    def forget(self, role: str) -> Hang | None:
        """`role` is gone for good (an elastic fleet's extra that left, rollout/elastic.py): no redone call of its
        will return. Its hang, when the watchdog killed it for one."""
        with self._lock:
            return self._recovering.pop(role, None)

    def _recovered(self, hang: Hang) -> None:
        took = time.monotonic() - hang.t0
        facts = hang.summary()
        record_interruption(self.run_dir, "hang", step=hang.step, role=hang.role, detected_at=hang.detected_at,
                            recovery_s=took, call=hang.kind, elapsed_s=facts["elapsed_s"], bound_s=facts["bound_s"],
                            median_s=facts["median_s"], stacks=str(hang.stacks),
                            action=f"{hang.role} restarted after its {hang.kind} call hung; the call was redone")
        self.notify("hang_recovered", step=hang.step, kind=hang.kind, role=hang.role, recovery_s=round(took, 3),
                    stacks=str(hang.stacks))
        self.log(f"hang at step {hang.step} recovered: {hang.role} restarted, its {hang.kind} redone ({took:.1f} s)")
        actor = self.actors().get(hang.role)
        if actor is not None:  # the restarted process: a new pid
            self.processes.update(ask_processes({hang.role: actor}))


def watched_get(watchdog: Watchdog | None, calls: list[Call], started: float | None = None,
                block: bool = True) -> list | None:
    """ray.get of the calls' refs ((ref, kind, role) each) under the watchdog's bound; with none, plain ray.get.
    block=False: None unless every call has returned."""
    if watchdog is not None:
        return watchdog.get(calls, started, block)
    import ray

    refs = [ref for ref, _, _ in calls]
    if not block and len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs):
        return None
    return ray.get(refs)
