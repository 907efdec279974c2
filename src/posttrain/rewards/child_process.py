"""A spawned child process that answers requests, killed past a timeout: the isolation under the verifier
(rewards/verifier.py), user reward functions (rewards/functions.py) and environments (rollout/environment.py)."""

from __future__ import annotations

import multiprocessing as mp
from typing import Callable


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
