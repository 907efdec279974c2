"""The service's state on the event loop: API keys, sessions, the futures store, the per-model queue, and the one
worker thread every backend call runs on (so the models need no locks and the requests of one model run in order).

Sessions end by `sessions/{id}/finish` or by expiry (no heartbeat for `session_timeout_s`; the SDK beats every
10 s): their models and samplers are freed; their checkpoints stay on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from posttrain.errors import PosttrainError
from posttrain.service.futures import FutureStore, Outcome
from posttrain.service.queue import SeqQueue

log = logging.getLogger("posttrain.service")


class AuthError(PosttrainError):
    pass


def owner_of_key(key: str) -> str:
    """Who owns models and checkpoints: a hash of the API key (the key itself is never stored)."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


@dataclass
class Session:
    owner: str
    last_beat: float
    models: set = field(default_factory=set)
    samplers: set = field(default_factory=set)


class ServiceState:
    def __init__(self, backend, *, api_keys: list[str], state_dir, session_timeout_s: float = 60.0,
                 long_poll_s: float = 30.0, gap_wait_s: float = 2.0):
        self.backend = backend
        self.api_keys = set(api_keys)
        self.state_dir = state_dir
        self.session_timeout_s = session_timeout_s
        self.long_poll_s = long_poll_s
        self.queue = SeqQueue(gap_wait_s)
        self.sessions: dict[str, Session] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="posttrain-service-worker")
        self.futures: FutureStore | None = None
        self.executed: dict[str, int] = {}  # request kind -> how many ran (GET /healthz shows it; tests use it)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.futures = FutureStore(loop, self.long_poll_s)

    # ---- keys and sessions -------------------------------------------------------------------------------------
    def owner(self, key: str | None) -> str:
        if not key or not key.startswith("tml-"):
            raise AuthError("X-API-Key: missing or not a tml-... key (set TINKER_API_KEY)")
        if self.api_keys and key not in self.api_keys:
            raise AuthError("X-API-Key: not one of this service's keys (serve.api_keys)")
        return owner_of_key(key)

    def session(self, session_id: str, owner: str) -> Session:
        s = self.sessions.get(session_id)
        if s is None or s.owner != owner:
            raise PosttrainError(f"session_id {session_id!r} is not a live session of this API key "
                                 "(it ended or expired)")
        return s

    def expired_sessions(self, now: float) -> list[str]:
        return [sid for sid, s in self.sessions.items() if now - s.last_beat > self.session_timeout_s]

    async def end_session(self, session_id: str) -> None:
        s = self.sessions.pop(session_id, None)
        if s is None:
            return
        for model_id in s.models:
            self.queue.forget_model(model_id)

        def free():
            for model_id in s.models:
                self.backend.free_model(model_id)
            for sid in s.samplers:
                self.backend.samplers.pop(sid, None)
            import gc
            gc.collect()
        await self.call(free)

    # ---- running work ------------------------------------------------------------------------------------------
    async def call(self, fn: Callable):
        """Runs fn on the worker and returns its value (for direct, non-future endpoints)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    def _run(self, request_id: str, kind: str, fn: Callable[[], Outcome]) -> None:
        try:
            outcome = fn()
            self.executed[kind] = self.executed.get(kind, 0) + 1
        except PosttrainError as e:
            outcome = Outcome({"error": str(e), "category": "user"})
        except Exception as e:  # a bug: the client gets its one line, the log the traceback
            log.error("request %s failed:\n%s", request_id, traceback.format_exc())
            outcome = Outcome({"error": f"internal error: {type(e).__name__}: {e}", "category": "server"})
        self.futures.resolve(request_id, outcome)

    def submit(self, request_id: str, owner: str, kind: str, fn: Callable[[], Outcome]) -> bool:
        """Starts fn as request `request_id` unless that id was submitted before (a retry): returns whether new."""
        if self.futures.owner_of(request_id) is not None:
            return False
        self.futures.create(request_id, owner)
        self.executor.submit(self._run, request_id, kind, fn)
        return True

    def submit_ordered(self, model_id: str, seq_id: int, owner: str, kind: str, fn: Callable[[], Outcome]) -> str:
        """Queues fn as the model's request seq_id; runs what is ready. A duplicate (model_id, seq_id) is dropped."""
        rid, new = self.queue.submit(model_id, seq_id, (kind, fn), time.monotonic())
        if new:
            self.futures.create(rid, owner)
        self.dispatch()
        return rid

    def dispatch(self) -> None:
        for rid, (kind, fn) in self.queue.ready(time.monotonic()):
            self.executor.submit(self._run, rid, kind, fn)

    async def housekeeping(self, every_s: float = 0.5) -> None:
        """Forever: runs requests a gap held past gap_wait_s, ends expired sessions, prunes old futures."""
        while True:
            await asyncio.sleep(every_s)
            self.dispatch()
            for sid in self.expired_sessions(time.monotonic()):
                log.warning("session %s expired (no heartbeat for %.0f s): its models are freed", sid,
                            self.session_timeout_s)
                await self.end_session(sid)
            self.futures.prune()
