"""The stop-signal watch on its own, with real signals to this process (no Ray): when a step in progress is
abandoned, when it is let finish, that the abandon comes by the deadline the grace period leaves; Ctrl-C once
and twice; and that after a stop signal a cluster process that exits (a real child process here) ends the wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from posttrain.preemption import (CLUSTER_POLL_SECONDS, ClusterStopped, StepAbandoned, StopSignalWatch,
                                  stop_if_cluster_stopped)


def _sigterm_in(seconds: float, signum: int = signal.SIGTERM) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


def _busy(seconds: float) -> None:
    """Work in the main thread that, like ray.get(), lets signal handlers run."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


@pytest.fixture
def watch():
    # grace 3.0 s, a checkpoint of 0.5 s and the 1.5 s margin (SIGNAL_MARGIN_SECONDS) for a signal to reach a
    # Ray wait: a step still before its point of no return is abandoned 3.0 - 0.5 - 1.5 = 1.0 s after SIGTERM.
    w = StopSignalWatch(grace_seconds=3.0, checkpoint_estimate_seconds=0.5).install()
    yield w
    w.restore()


def test_a_step_that_runs_past_the_deadline_is_abandoned_at_the_deadline(watch):
    # grace 3.0 - (checkpoint 0.5 + margin 1.5) = abandon 1.0 s after the signal; no step duration known yet.
    watch.begin_step()
    _sigterm_in(0.2)
    t0 = time.monotonic()
    with pytest.raises(StepAbandoned):
        _busy(10)
    after_signal = time.monotonic() - watch.received_at
    assert 0.95 <= after_signal <= 1.3, after_signal
    assert time.monotonic() - t0 < 2
    watch.end_step()
    assert watch.requested


def test_a_step_known_to_be_too_long_is_abandoned_at_the_signal(watch):
    watch.step_seconds = 5.0  # the last step took 5 s; the deadline is 1 s after the signal
    watch.begin_step()
    _sigterm_in(0.2)
    with pytest.raises(StepAbandoned):
        _busy(10)
    assert watch.seconds_since() < 0.2


def test_a_short_step_finishes_and_the_loop_checkpoints_after_it(watch):
    watch.step_seconds = 0.3
    watch.begin_step()
    _sigterm_in(0.1)
    _busy(0.4)  # ends 0.3 s after the signal, before the 1.0 s deadline
    watch.end_step()
    _busy(1.2)  # the armed deadline must not fire between steps
    assert watch.requested


def test_past_the_point_of_no_return_a_step_is_never_abandoned(watch):
    watch.begin_step()
    watch.point_of_no_return()  # the trainer has the batch: its update cannot be taken back
    _sigterm_in(0.05)
    _busy(1.5)  # past the 1.0 s deadline
    watch.end_step()
    assert watch.requested


def test_the_abandon_passes_through_except_exception(watch):
    """Reward isolation turns an Exception into a per-sample failure; an abandon must not be swallowed there."""
    watch.step_seconds = 5.0
    watch.begin_step()
    _sigterm_in(0.05)
    with pytest.raises(StepAbandoned):
        try:
            _busy(5)
        except Exception:  # noqa: BLE001
            pytest.fail("StepAbandoned was caught as an Exception")


def test_restore_puts_back_the_previous_handlers():
    signums = (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)
    before = [signal.getsignal(s) for s in signums]
    w = StopSignalWatch(grace_seconds=1.0).install()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == (w._on_sigterm, w._on_sigint)
    w.restore()
    assert [signal.getsignal(s) for s in signums] == before


def test_ctrl_c_lets_the_step_finish_and_a_second_one_stops_at_once():
    notes = []
    w = StopSignalWatch(grace_seconds=3.0, checkpoint_estimate_seconds=0.5, note=notes.append).install()
    try:
        w.begin_step()
        _sigterm_in(0.05, signal.SIGINT)
        try:
            _busy(1.5)  # past where a SIGTERM would have abandoned it (1.0 s): Ctrl-C waits for the step boundary
        except (KeyboardInterrupt, StepAbandoned) as e:
            pytest.fail(f"the first Ctrl-C stopped the step ({type(e).__name__})")
        w.end_step()
        assert (w.requested, w.signal_name) == (True, "SIGINT")
        assert notes and "Ctrl-C again stops at once" in notes[0]
        _sigterm_in(0.05, signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            _busy(5)
    finally:
        w.restore()


@pytest.fixture
def cluster_process():
    """A real child process standing for the embedded cluster's GCS/raylet: `poll()` says when it has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_after_a_stop_signal_the_cluster_exiting_ends_the_wait_at_once(cluster_process):
    w = StopSignalWatch(grace_seconds=30.0, cluster_stopped=lambda: cluster_process.poll() is not None).install()
    try:
        w.begin_step()
        _sigterm_in(0.05)
        threading.Timer(0.5, cluster_process.terminate).start()  # the cgroup kill reaches the cluster too
        t0 = time.monotonic()
        with pytest.raises(ClusterStopped):
            _busy(10)  # e.g. ray.get on a worker that will never answer
        assert time.monotonic() - t0 < 0.5 + CLUSTER_POLL_SECONDS + 1.2  # + Ray's ~1 s signal poll margin
    finally:
        w.restore()


def test_without_a_stop_signal_a_dead_worker_is_not_taken_for_a_stopped_cluster(cluster_process):
    """A worker that dies on its own is restarted as before, and at once: without a stop signal the check neither
    waits for the cluster nor raises, even when a cluster process is gone, and nothing is raised between checks."""
    cluster_process.kill()
    cluster_process.wait()
    w = StopSignalWatch(cluster_stopped=lambda: cluster_process.poll() is not None).install()
    try:
        w.begin_step()
        t0 = time.monotonic()
        stop_if_cluster_stopped()
        assert time.monotonic() - t0 < 0.1
        _busy(2 * CLUSTER_POLL_SECONDS)
        w.end_step()
        assert not w.requested
    finally:
        w.restore()
