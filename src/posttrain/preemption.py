"""Preemption: on SIGTERM the driver writes a checkpoint within `checkpoint.grace_seconds` and exits with
EXIT_PREEMPTED, so a scheduler (SkyPilot spot recovery, Slurm requeue, Kubernetes) can rerun it with --resume.

A step has a point of no return: the moment its batch is handed to the trainer, whose optimizer step cannot be
taken back. Before it, a step can be abandoned: its partial work (rollouts, rewards) is discarded, the checkpoint
is of the last completed step, and --resume redoes the abandoned step identically (same data cursor, same
sampling seeds). After it, the step finishes (the update, the weight sync) and the checkpoint is of that step.

On SIGTERM the watch therefore keeps time: the checkpoint needs `reserve_seconds()` (the longest checkpoint
measured in this run, or an estimate from the model's size before the first one, plus a margin for the signal
to reach a Ray wait). If the step in progress is still before its point of no return when only that much of the
grace period is left, or if the last step's duration says it will not finish before then, it is abandoned at
once (StepAbandoned, raised from a signal handler: Ray's waits poll for signals about once a second). The exit
message says how long after the signal the checkpoint was written, and when that was over the grace period.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry". Distinct from 2 (user error), 1 (bug)
# and from 143/-15 (killed by SIGTERM without a checkpoint).
EXIT_PREEMPTED = 75

# Seconds added to the checkpoint's own time: a signal reaches a thread blocked in ray.get() only when Ray next
# polls for signals (measured: up to ~1 s), and the checkpoint's duration varies with the disk.
SIGNAL_MARGIN_SECONDS = 1.5
# Write + sha256 throughput assumed for a checkpoint before one has been measured (bytes per second; slow disk).
ASSUMED_CHECKPOINT_BYTES_PER_S = 50 * 2**20


class Preempted(Exception):
    """Raised by the training loop after SIGTERM once the checkpoint is written; the CLI exits with EXIT_PREEMPTED."""

    def __init__(self, checkpoint: Path, step: int, seconds_after_signal: float, grace_seconds: float,
                 abandoned_step: int | None = None):
        self.checkpoint, self.step, self.seconds = checkpoint, step, seconds_after_signal
        self.abandoned_step = abandoned_step
        late = "" if seconds_after_signal <= grace_seconds else f" (over checkpoint.grace_seconds={grace_seconds:g})"
        dropped = ("" if abandoned_step is None else
                   f"; step {abandoned_step} was abandoned before its update (its partial work is discarded and "
                   "--resume redoes it)")
        super().__init__(
            f"preempted (SIGTERM): checkpoint {checkpoint} at step {step} written {seconds_after_signal:.2f} s "
            f"after the signal{late}{dropped}; continue with `posttrain train <config> --resume`"
        )


class StepAbandoned(BaseException):
    """Raised inside a step, before its point of no return, when it cannot finish within the grace period. A
    BaseException, so that code which turns an Exception into a per-sample failure (reward isolation) lets it pass."""


_active: "SigtermWatch | None" = None


def point_of_no_return() -> None:
    """Called by the step just before it hands its batch to the trainer: from here on it is never abandoned."""
    if _active is not None:
        _active.point_of_no_return()


class SigtermWatch:
    """Records SIGTERM instead of dying and abandons a step that would overrun the grace period (see the module
    docstring). Install it after ray.init, which sets a SIGTERM handler of its own (sys.exit). A no-op outside the
    main thread, where Python cannot set handlers."""

    def __init__(self, grace_seconds: float = float("inf"), checkpoint_estimate_seconds: float = 0.0) -> None:
        self.grace_seconds = grace_seconds
        self.checkpoint_seconds = checkpoint_estimate_seconds  # the longest checkpoint measured (or the estimate)
        self.step_seconds: float | None = None  # the last completed step's duration
        self.received_at: float | None = None  # time.monotonic() of the first SIGTERM
        self._step_started: float | None = None
        self._abandonable = False
        self._previous: dict[int, object] = {}

    # -------------------------------------------------------------------------------- installation

    def install(self) -> "SigtermWatch":
        global _active
        if threading.current_thread() is threading.main_thread():
            self._previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_sigterm),
                              signal.SIGALRM: signal.signal(signal.SIGALRM, self._on_deadline)}
            _active = self
        return self

    def restore(self) -> None:
        global _active
        if self._previous:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous = {}
            _active = None

    # -------------------------------------------------------------------------------- the loop's calls

    def begin_step(self) -> None:
        self._step_started = time.monotonic()
        self._abandonable = True
        if self.requested:
            self._schedule_abandon()

    def point_of_no_return(self) -> None:
        self._abandonable = False
        if self._previous:  # installed: the SIGALRM timer is ours
            signal.setitimer(signal.ITIMER_REAL, 0)

    def end_step(self) -> None:
        self.point_of_no_return()
        if self._step_started is not None:
            self.step_seconds = time.monotonic() - self._step_started

    def checkpoint_written(self, seconds: float) -> None:
        self.checkpoint_seconds = max(self.checkpoint_seconds, seconds)

    # -------------------------------------------------------------------------------- state

    @property
    def requested(self) -> bool:
        return self.received_at is not None

    def seconds_since(self) -> float:
        return time.monotonic() - self.received_at if self.received_at is not None else 0.0

    def reserve_seconds(self) -> float:
        """Of the grace period, the seconds kept for writing the checkpoint."""
        return self.checkpoint_seconds + SIGNAL_MARGIN_SECONDS

    def abandon_at(self) -> float:
        """time.monotonic() by which a step still before its point of no return is abandoned."""
        assert self.received_at is not None
        return self.received_at + self.grace_seconds - self.reserve_seconds()

    # -------------------------------------------------------------------------------- signal handlers

    def _on_sigterm(self, signum, frame) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            if self._abandonable:
                self._schedule_abandon()

    def _on_deadline(self, signum, frame) -> None:
        if self._abandonable:
            self._abandon()

    def _schedule_abandon(self) -> None:
        """Abandons the step now if it cannot finish in time, else arms SIGALRM for the deadline."""
        now, deadline = time.monotonic(), self.abandon_at()
        expected_end = self._step_started + self.step_seconds if self.step_seconds is not None else now
        if deadline <= now or expected_end > deadline:
            self._abandon()
        signal.setitimer(signal.ITIMER_REAL, deadline - now)

    def _abandon(self) -> None:
        self._abandonable = False
        raise StepAbandoned()
