"""The last resort of a stop signal: when the run's own Ray cluster went with the signal (a cgroup kill) and the
main thread cannot end the run because it is blocked inside C code, end the process from another thread.

Python runs a signal handler only when the main thread next executes Python. A main thread blocked in one of
Ray's synchronous GCS calls (looking up nodes, actors, resources) when the GCS is killed stays there until Ray's
GCS reconnect gives up after 60 s and ends the process with exit 1 ("Failed to connect to GCS within 60
seconds"): the StopSignalWatch (preemption.py) never gets to run. Seen once, in a clean-clone `make test`, in
the test that signals every process of a run at once (its reruns passed).

So the guard learns of the signal where the main thread is not needed: `signal.set_wakeup_fd` makes the
interpreter's C-level handler write the signal's number to a pipe, which a daemon thread reads. Once a stop
signal came and a process of the embedded cluster has exited, the main thread gets STUCK_SECONDS to show that it
runs (the watch's Python handler has recorded the signal), else ENDING_SECONDS in all to end the run (close()).
If it does neither, the guard says what the main thread would have said (`report`: the newest valid checkpoint
and the command that continues) and exits with the signal's exit code (75 for SIGTERM)."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Callable

from posttrain.preemption import CLUSTER_POLL_SECONDS, StopSignalWatch, exit_code_for, mark_cluster_stopped

# After the cluster is seen stopped: how long a main thread whose handler never ran is waited for (it runs within
# about a second when it is in a Ray wait, which polls for signals), and how long one that did run may take to end
# the run (close_run: ray.shutdown spends ~5 s of RPC timeouts on a dead GCS; the whole exit measured ~8 s).
STUCK_SECONDS = 3.0
ENDING_SECONDS = 15.0
_STOP_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}


class StuckStopGuard:
    """Started after `watch` is installed (main thread), closed when the run has ended (the watch is restored
    before the run's clean-up, which the guard still covers). From the watch it reads whether the main thread's
    handler has recorded a stop signal and whether a process of the run's cluster has exited; `report(signal_name)`
    says how the run stopped, before the exit."""

    def __init__(self, watch: StopSignalWatch, report: Callable[[str], None]):
        self.watch, self.report = watch, report
        self._closed = threading.Event()
        self._read_fd = self._write_fd = -1
        self._previous_fd: int | None = None

    def start(self) -> "StuckStopGuard":
        if threading.current_thread() is not threading.main_thread():
            return self  # set_wakeup_fd works only there, as signal handlers do
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # the C handler must never block
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="posttrain-stop-guard", daemon=True).start()
        return self

    def close(self) -> None:
        if self._previous_fd is None:
            return
        self._closed.set()
        signal.set_wakeup_fd(self._previous_fd)
        self._previous_fd = None
        os.close(self._write_fd)  # the thread reads end-of-file and closes its end

    def _watch(self) -> None:
        signal_name, cluster_gone_at = None, None
        try:
            while not self._closed.is_set():
                readable, _, _ = select.select([self._read_fd], [], [], CLUSTER_POLL_SECONDS)
                if readable:
                    received = os.read(self._read_fd, 64)
                    if not received:
                        return
                    signal_name = signal_name or next((_STOP_SIGNALS[n] for n in received if n in _STOP_SIGNALS), None)
                if signal_name is None:
                    continue
                if cluster_gone_at is None and self._cluster_gone():
                    cluster_gone_at = time.monotonic()
                if cluster_gone_at is not None and self._main_thread_overdue(cluster_gone_at):
                    self._exit(signal_name)
        finally:
            os.close(self._read_fd)

    def _cluster_gone(self) -> bool:
        try:
            return self.watch.cluster_stopped()
        except Exception:  # noqa: BLE001 - the main thread may be changing Ray's process table; look again later
            return False

    def _main_thread_overdue(self, cluster_gone_at: float) -> bool:
        waited = time.monotonic() - cluster_gone_at
        return waited >= ENDING_SECONDS or (waited >= STUCK_SECONDS and not self.watch.requested)

    def _exit(self, signal_name: str) -> None:
        if self._closed.is_set():  # the run ended meanwhile: its own message is on the way
            return
        mark_cluster_stopped(signal_name)
        try:
            self.report(signal_name)
        finally:
            os._exit(exit_code_for(signal_name))
