"""Preemption: on SIGTERM the driver finishes the step in progress, writes a checkpoint and exits with
EXIT_PREEMPTED, so a scheduler (SkyPilot spot recovery, Slurm requeue, Kubernetes) can rerun it with --resume.

The step in progress is finished rather than aborted because the trainer may already have taken its optimizer
step: a checkpoint taken halfway would pair the new weights with the old step count. At the sizes posttrain runs
on one machine a step is seconds, well inside `checkpoint.grace_seconds`; when the step plus the checkpoint take
longer than that, the run says so, and a scheduler's SIGKILL then leaves the previous checkpoint as resume point.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry". Distinct from 2 (user error), 1 (bug)
# and from 143/-15 (killed by SIGTERM without a checkpoint).
EXIT_PREEMPTED = 75


class Preempted(Exception):
    """Raised by the training loop after SIGTERM once the checkpoint is written; the CLI exits with EXIT_PREEMPTED."""

    def __init__(self, checkpoint: Path, step: int, seconds_after_signal: float, grace_seconds: float):
        self.checkpoint, self.step, self.seconds = checkpoint, step, seconds_after_signal
        late = "" if seconds_after_signal <= grace_seconds else f" (over checkpoint.grace_seconds={grace_seconds:g})"
        super().__init__(
            f"preempted (SIGTERM): checkpoint {checkpoint} at step {step} written {seconds_after_signal:.2f} s "
            f"after the signal{late}; continue with `posttrain train <config> --resume`"
        )


class SigtermWatch:
    """Records SIGTERM instead of dying; the loop polls `requested` between steps. Install it after ray.init,
    which sets a handler of its own (sys.exit). A no-op outside the main thread, where Python cannot set one."""

    def __init__(self) -> None:
        self.received_at: float | None = None  # time.monotonic() of the first SIGTERM
        self._previous = None
        self._installed = False

    def install(self) -> "SigtermWatch":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def _handle(self, signum, frame) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()

    @property
    def requested(self) -> bool:
        return self.received_at is not None

    def seconds_since(self) -> float:
        return time.monotonic() - self.received_at if self.received_at is not None else 0.0

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
