"""The stop guard (stop_guard.py) with real signals to a real process whose main thread is blocked inside C code
the way a synchronous Ray GCS call blocks it: locking a pthread mutex it already holds, a wait that no signal
interrupts, so Python never runs the stop-signal handler. Without the guard that process would hang until killed
(as a driver hangs until Ray's 60 s GCS reconnect ends it with exit 1)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

from posttrain.preemption import EXIT_PREEMPTED
from posttrain.stop_guard import STUCK_SECONDS

# The process: the watch and the guard as the loop installs them; the "cluster" has stopped once the file
# `cluster_gone` exists; then the main thread blocks for good in pthread_mutex_lock (ctypes releases the GIL).
BLOCKED_DRIVER = textwrap.dedent("""
    import ctypes, os, sys
    from pathlib import Path
    from posttrain.preemption import StopSignalWatch
    from posttrain.stop_guard import StuckStopGuard

    gone = Path(sys.argv[1])
    watch = StopSignalWatch(cluster_stopped=gone.exists).install()
    say = lambda name: os.write(2, f"stopped by {name}: newest checkpoint step_000003\\n".encode())  # noqa: E731
    StuckStopGuard(watch, say).start()
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER, a normal (non-recursive) mutex
    libc = ctypes.CDLL(None)
    libc.pthread_mutex_lock(mutex)
    print(ctypes.addressof(mutex), flush=True)
    libc.pthread_mutex_lock(mutex)  # never returns
""")


def _start_blocked(tmp_path) -> tuple[subprocess.Popen, object]:
    """The process, once its main thread waits inside pthread_mutex_lock. A signal sent before that (while it still
    runs the bytecode up to the call) would run the watch's handler, and the guard would rightly give it 15 s."""
    gone = tmp_path / "cluster_gone"
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED_DRIVER, str(gone)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip().isdigit(), proc.communicate(timeout=30)
    _wait_until_blocked_on(proc.pid, int(line))
    return proc, gone


def _wait_until_blocked_on(pid: int, address: int, timeout: float = 30) -> None:
    """/proc/PID/syscall: the main thread's system call in progress and its arguments; the futex wait of a locked
    glibc mutex has the mutex's own address as its first argument ("running" while the thread is not in one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = open(f"/proc/{pid}/syscall").read().split()
        if len(fields) > 1 and int(fields[1], 16) == address:
            return
        time.sleep(0.01)
    raise TimeoutError(f"process {pid} did not block on its mutex within {timeout} s")


def test_a_main_thread_blocked_in_c_when_the_cluster_goes_exits_75_with_the_message(tmp_path):
    proc, gone = _start_blocked(tmp_path)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    gone.touch()  # the cgroup kill took the cluster's processes too
    try:
        _, err = proc.communicate(timeout=STUCK_SECONDS + 10)
    finally:
        proc.kill()
    exited = time.monotonic() - sent
    assert proc.returncode == EXIT_PREEMPTED, err
    assert err.strip() == "stopped by SIGTERM: newest checkpoint step_000003"  # one message, no traceback
    # STUCK_SECONDS after the cluster was seen gone, seen within a poll (0.5 s); 2 s for a busy machine
    assert STUCK_SECONDS <= exited < STUCK_SECONDS + 2.5, exited


def test_while_the_cluster_still_runs_a_blocked_main_thread_is_left_alone(tmp_path):
    """SIGTERM to the driver's group alone leaves the cluster running: the main thread may be in a long call that
    ends, and then checkpoints (test_stop_signals.py); the guard must not end it."""
    proc, _ = _start_blocked(tmp_path)
    proc.send_signal(signal.SIGTERM)
    time.sleep(STUCK_SECONDS + 2)
    still_running = proc.poll() is None
    proc.kill()
    proc.communicate()
    assert still_running


def test_the_loops_report_names_the_run_and_notifies_as_the_main_thread_would(tmp_path, capfd):
    """What the loop gives the guard to say (loop.report_stuck_stop): the StoppedWithoutCheckpoint message on
    stderr and the run_preempted notification (here before any checkpoint: the command starts the run again)."""
    from posttrain import preemption
    from posttrain.config import load_config
    from posttrain.loop import report_stuck_stop

    cfg = load_config(None, ["name=stuck", f"runs_dir={tmp_path}"])
    sent = []
    preemption.mark_cluster_stopped("SIGTERM")  # as the guard does before it reports
    try:
        report_stuck_stop(cfg, "SIGTERM", lambda event, **fields: sent.append((event, fields)))
    finally:
        preemption._cluster_stopped_by = None
    err = capfd.readouterr().err
    assert err == (f"preempted (SIGTERM): the run's Ray cluster (GCS, raylet, workers) was stopped with it by SIGTERM, "
                   f"so no checkpoint was written now; no checkpoint was written yet; start the run again with "
                   f"`posttrain train {(tmp_path / 'stuck' / 'config.yaml').resolve()}`\n")
    assert sent == [("run_preempted", {"step": None, "checkpoint": None, "abandoned_step": None, "resume": None})]
