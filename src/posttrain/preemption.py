"""Stopping a run by signal, the way schedulers, clusters and people stop it. The exit code says which, the message
names the checkpoint and the exact command that continues the run:

- SIGTERM (Slurm's scancel, a preempted spot node, Kubernetes, a container runtime): the driver writes a checkpoint
  within `checkpoint.grace_seconds` and exits EXIT_PREEMPTED (75), so the scheduler can rerun it with --resume.
  The embedded Ray cluster's processes run in their own session (orchestration/runtime.py), so a SIGTERM to the
  driver's process group reaches the driver alone and is handled the same way.
- SIGTERM to every process of the run at once (a cgroup kill): the trainer goes with the rest, so nothing can be
  checkpointed. Once a stop signal came, the watch polls the processes the driver started for the embedded cluster
  (GCS, raylet, monitors: none of them exits during a run; the monitors exit within milliseconds of a SIGTERM,
  the GCS and raylet drain for up to ~15 s); when one has exited it raises ClusterStopped, and the run exits 75 at
  once naming the newest valid checkpoint, instead of waiting for workers to restart (or for Ray's 60 s GCS
  reconnect to end the process with exit 1). When the main thread is blocked inside C code then, so that no
  Python handler can run, stop_guard.py ends the process from another thread with the same message and code.
- SIGINT (Ctrl-C) once: the step in progress finishes, the checkpoint is written, exit EXIT_INTERRUPTED (130).
  Twice: KeyboardInterrupt at once, no checkpoint; exit 130 naming the newest valid one.

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
from typing import Callable

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry". Distinct from 2 (user error), 1 (bug)
# and from 143/-15 (killed by SIGTERM without a checkpoint).
EXIT_PREEMPTED = 75
# 128 + SIGINT: what a shell reports for a program stopped by Ctrl-C.
EXIT_INTERRUPTED = 130

# Seconds added to the checkpoint's own time: a signal reaches a thread blocked in ray.get() only when Ray next
# polls for signals (measured: up to ~1 s), and the checkpoint's duration varies with the disk.
SIGNAL_MARGIN_SECONDS = 1.5
# Write + sha256 throughput assumed for a checkpoint before one has been measured (bytes per second; slow disk).
ASSUMED_CHECKPOINT_BYTES_PER_S = 50 * 2**20
# After a stop signal: how often the embedded cluster's processes are looked at (seconds), and how long a worker's
# death waits for one of them to exit before it counts as a worker to restart (the monitors exit within
# milliseconds of a SIGTERM; 2 busy cores may delay that by a second).
CLUSTER_POLL_SECONDS = 0.5
CLUSTER_EXIT_WAIT_SECONDS = 2.0

def exit_code_for(signal_name: str) -> int:
    return EXIT_INTERRUPTED if signal_name == "SIGINT" else EXIT_PREEMPTED


def _stopped_by(signal_name: str) -> str:
    return "stopped (Ctrl-C)" if signal_name == "SIGINT" else f"preempted ({signal_name})"


class Preempted(Exception):
    """Raised by the training loop after a stop signal once the checkpoint is written; the CLI exits with
    `exit_code` (EXIT_PREEMPTED for SIGTERM, EXIT_INTERRUPTED for Ctrl-C)."""

    def __init__(self, checkpoint: Path, step: int, seconds_after_signal: float, grace_seconds: float,
                 abandoned_step: int | None = None, resume: str = "posttrain train <config> --resume",
                 signal_name: str = "SIGTERM"):
        self.checkpoint, self.step, self.seconds = checkpoint, step, seconds_after_signal
        self.abandoned_step, self.signal_name = abandoned_step, signal_name
        self.exit_code = exit_code_for(signal_name)
        late = ("" if seconds_after_signal <= grace_seconds or signal_name == "SIGINT"
                else f" (over checkpoint.grace_seconds={grace_seconds:g})")
        dropped = ("" if abandoned_step is None else
                   f"; step {abandoned_step} was abandoned before its update (its partial work is discarded and "
                   "--resume redoes it)")
        super().__init__(
            f"{_stopped_by(signal_name)}: checkpoint {checkpoint} at step {step} written {seconds_after_signal:.2f} "
            f"s after the signal{late}{dropped}; continue with `{resume}`"
        )


class StoppedWithoutCheckpoint(Exception):
    """The run stopped where no checkpoint could be written: its own Ray cluster went away with it (`why`), or a
    second Ctrl-C. Names the newest valid checkpoint (None: there is none yet) and the command that continues."""

    def __init__(self, why: str, signal_name: str, newest: Path | None, step: int | None, command: str):
        self.newest, self.step, self.signal_name = newest, step, signal_name
        self.exit_code = exit_code_for(signal_name)
        where = (f"the newest valid checkpoint is {newest} (step {step}); continue with `{command}`" if newest
                 else f"no checkpoint was written yet; start the run again with `{command}`")
        super().__init__(f"{_stopped_by(signal_name)}: {why}, so no checkpoint was written now; {where}")


class StepAbandoned(BaseException):
    """Raised inside a step, before its point of no return, when it cannot finish within the grace period. A
    BaseException, so that code which turns an Exception into a per-sample failure (reward isolation) lets it pass."""


class ClusterStopped(BaseException):
    """Raised after a stop signal once the run's own embedded Ray cluster is being stopped too: every process of
    the run was signalled, so there is no worker to restart and no trainer to checkpoint. A BaseException for the
    same reason as StepAbandoned."""

    def __init__(self, signal_name: str):
        super().__init__(f"the run's Ray cluster (GCS, raylet, workers) was stopped with it by {signal_name}")
        self.signal_name = signal_name


_active: "StopSignalWatch | None" = None
_cluster_stopped_by: str | None = None  # the stop signal with which the last watch saw its cluster go


def cluster_stopped_by() -> str | None:
    """"SIGTERM"/"SIGINT" when the last run's watch saw its own cluster stopped after that signal, else None. Read
    after the watch is restored: whatever Ray raised meanwhile (a lost actor, a SystemError from inside its C
    code) is then part of that stop, not a failure."""
    return _cluster_stopped_by


def mark_cluster_stopped(signal_name: str) -> None:
    """Records that the run's own cluster went with `signal_name` (the first one seen stays)."""
    global _cluster_stopped_by
    if _cluster_stopped_by is None:
        _cluster_stopped_by = signal_name


def point_of_no_return() -> None:
    """Called by the step just before it hands its batch to the trainer: from here on it is never abandoned."""
    if _active is not None:
        _active.point_of_no_return()


def stop_if_cluster_stopped(wait_s: float = CLUSTER_EXIT_WAIT_SECONDS) -> None:
    """Called where a dead worker would be waited for or its roles re-formed: after a stop signal, raises
    ClusterStopped when a process of the embedded cluster exits within wait_s (the worker died with it)."""
    if _active is not None:
        _active.stop_if_cluster_stopped(wait_s)


class StopSignalWatch:
    """Records SIGTERM and a first SIGINT instead of dying, abandons a step that would overrun the grace period,
    and after either signal watches the embedded cluster (see the module docstring). Install it after ray.init,
    which sets a SIGTERM handler of its own (sys.exit). A no-op outside the main thread, where Python cannot set
    handlers. `cluster_stopped()`: whether a process of the run's own Ray cluster has exited (runtime.py);
    `note(message)`: says on the progress line that a stop is under way (called from the signal handler)."""

    def __init__(self, grace_seconds: float = float("inf"), checkpoint_estimate_seconds: float = 0.0,
                 cluster_stopped: Callable[[], bool] = lambda: False,
                 note: Callable[[str], None] = lambda m: None):
        self.grace_seconds = grace_seconds
        self.checkpoint_seconds = checkpoint_estimate_seconds  # the longest checkpoint measured (or the estimate)
        self.step_seconds: float | None = None  # the last completed step's duration
        self.received_at: float | None = None  # time.monotonic() of the stop signal (SIGTERM: its first)
        self.signal_name: str | None = None  # "SIGTERM" or "SIGINT": which stop is under way
        self.cluster_stopped, self.note = cluster_stopped, note
        self._step_started: float | None = None
        self._abandonable = False
        self._previous: dict[int, object] = {}

    # -------------------------------------------------------------------------------- installation

    def install(self) -> "StopSignalWatch":
        global _active, _cluster_stopped_by
        _cluster_stopped_by = None
        if threading.current_thread() is threading.main_thread():
            self._previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_sigterm),
                              signal.SIGINT: signal.signal(signal.SIGINT, self._on_sigint),
                              signal.SIGALRM: signal.signal(signal.SIGALRM, self._on_alarm)}
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
        if self.signal_name == "SIGTERM":
            self._schedule_abandon()

    def point_of_no_return(self) -> None:
        self._abandonable = False  # the alarm, still armed to watch the cluster, no longer abandons

    def end_step(self) -> None:
        self.point_of_no_return()
        if self._step_started is not None:
            self.step_seconds = time.monotonic() - self._step_started

    def checkpoint_written(self, seconds: float) -> None:
        self.checkpoint_seconds = max(self.checkpoint_seconds, seconds)

    def stop_if_cluster_stopped(self, wait_s: float) -> None:
        """See the module-level stop_if_cluster_stopped."""
        if not self.requested:
            return
        deadline = time.monotonic() + wait_s
        while not self._saw_cluster_stopped():
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)
        raise ClusterStopped(self.signal_name)

    def _saw_cluster_stopped(self) -> bool:
        if _cluster_stopped_by is None and self.cluster_stopped():
            mark_cluster_stopped(self.signal_name)
        return _cluster_stopped_by is not None

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
        if self.signal_name == "SIGTERM":
            return
        # the first SIGTERM (also after a Ctrl-C): the grace period starts now
        self.received_at, self.signal_name = time.monotonic(), "SIGTERM"
        self.note(f"SIGTERM: checkpointing within checkpoint.grace_seconds={self.grace_seconds:g}, then exiting "
                  f"{EXIT_PREEMPTED}")
        if self._abandonable:
            self._schedule_abandon()
        else:
            self._arm()

    def _on_sigint(self, signum, frame) -> None:
        if self.requested:  # the second Ctrl-C (or one after SIGTERM): stop at once
            self.note("Ctrl-C again: stopping at once, without a checkpoint")
            raise KeyboardInterrupt
        self.received_at, self.signal_name = time.monotonic(), "SIGINT"
        self.note("Ctrl-C: stopping after this step with a checkpoint (Ctrl-C again stops at once, without one)")
        self._arm()

    def _on_alarm(self, signum, frame) -> None:
        if not self.requested:
            return
        if _cluster_stopped_by is not None:  # raised once: the run is ending, let its clean-up run
            return
        self._arm()
        if self._saw_cluster_stopped():
            raise ClusterStopped(self.signal_name)
        if self._abandonable and self.signal_name == "SIGTERM" and time.monotonic() >= self.abandon_at():
            self._abandon()

    def _arm(self) -> None:
        """The next SIGALRM: the next look at the cluster, or the abandon deadline when that comes first."""
        if not self._previous:  # not installed: the SIGALRM timer is not ours
            return
        wait = CLUSTER_POLL_SECONDS
        if self._abandonable and self.signal_name == "SIGTERM":
            wait = min(wait, self.abandon_at() - time.monotonic())
        signal.setitimer(signal.ITIMER_REAL, max(wait, 0.001))  # 0 would disarm it

    def _schedule_abandon(self) -> None:
        """Abandons the step now if it cannot finish in time, else arms SIGALRM for the deadline."""
        now, deadline = time.monotonic(), self.abandon_at()
        expected_end = self._step_started + self.step_seconds if self.step_seconds is not None else now
        self._arm()
        if deadline <= now or expected_end > deadline:
            self._abandon()

    def _abandon(self) -> None:
        self._abandonable = False
        raise StepAbandoned()
