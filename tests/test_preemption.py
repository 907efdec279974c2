"""The SIGTERM watch on its own, with real signals to this process (no Ray): when a step in progress is
abandoned, when it is let finish, and that the abandon comes by the deadline the grace period leaves."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from posttrain.preemption import SigtermWatch, StepAbandoned


def _sigterm_in(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
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
    w = SigtermWatch(grace_seconds=3.0, checkpoint_estimate_seconds=0.5).install()
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
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM)
    w = SigtermWatch(grace_seconds=1.0).install()
    assert signal.getsignal(signal.SIGTERM) == w._on_sigterm
    w.restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM)) == before
