"""A chaos hook for recovery tests, like Ray's own testing hooks (e.g. RAY_testing_asio_delay_us): a role's method
can be made to wedge once, on purpose, so a test can show that the watchdog (remote/watchdog.py) detects the
hang, dumps the stacks, restarts the actor and redoes its work.

Off unless the environment variable POSTTRAIN_FAULTS_DIR names a directory; then `maybe_wedge(point)` looks for the
file `<dir>/wedge-<point>`. If it is there, the first process to rename it away (os.rename is atomic: exactly one
caller wins, in any number of actors) blocks forever in that call, the way a deadlocked collective or a stuck
driver call looks from outside; everyone else returns at once. Points: "generate" (RolloutWorker.generate), "reward"
(RewardWorker.score), "train" (Trainer.train_step and ShardedTrainer.train_step).

    POSTTRAIN_FAULTS_DIR=/tmp/faults posttrain train cfg.yaml &     # Ray actors inherit the variable (runtime.py)
    touch /tmp/faults/wedge-generate                                 # the next generate call wedges

A second hook slows generation down instead: `<dir>/slow-engine-step` holding a number of seconds makes every
engine step of an interruptible generate (partial rollouts, rollout/vllm_engine.py) sleep that long, so a test can
count on new weights arriving mid-generation.

Reading one environment variable per call is the whole cost when it is unset."""

from __future__ import annotations

import os
import threading
from pathlib import Path

ENV = "POSTTRAIN_FAULTS_DIR"
POINTS = ("generate", "reward", "train")


def maybe_wedge(point: str) -> None:
    """Blocks forever when `<POSTTRAIN_FAULTS_DIR>/wedge-<point>` exists, consuming the file; returns otherwise."""
    root = os.environ.get(ENV)
    if not root:
        return
    trigger = os.path.join(root, f"wedge-{point}")
    try:
        os.rename(trigger, f"{trigger}.taken-by-{os.getpid()}")
    except OSError:  # not there, or another process took it first
        return
    threading.Event().wait()


def arm(faults_dir: str | Path, point: str) -> Path:
    """Makes the next `maybe_wedge(point)` call (in any process that sees `faults_dir`) wedge; returns the file."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; one of {', '.join(POINTS)}")
    path = Path(faults_dir) / f"wedge-{point}"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("")
    os.replace(tmp, path)  # appears whole: a caller never sees a half-made trigger
    return path


def engine_step_delay() -> float:
    """Seconds each engine step of an interruptible generate sleeps: the number in
    `<POSTTRAIN_FAULTS_DIR>/slow-engine-step`, 0 when the variable or the file is not there."""
    root = os.environ.get(ENV)
    if not root:
        return 0.0
    try:
        return float(Path(root, "slow-engine-step").read_text().strip() or 0)
    except (OSError, ValueError):
        return 0.0
