"""The futures store of the Tinker-compatible service: every submit answers a request id at once, the work runs on
the backend's worker, and `retrieve_future` holds the poll up to `long_poll_s` seconds (the SDK polls with a 45 s
timeout) and answers either the result or `{"type": "try_again"}`, which the SDK re-polls at once.

Lives on the server's event loop; `resolve` may be called from the worker thread (it hops onto the loop).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

TRY_AGAIN = {"type": "try_again", "request_id": None, "queue_state": "active"}


@dataclass
class Outcome:
    """A finished request: `body` is a JSON-able dict, or bytes with `content_type` (protobuf answers)."""

    body: Any
    content_type: str = "application/json"
    status: int = 200


@dataclass
class _Future:
    owner: str
    event: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome | None = None
    created: float = field(default_factory=time.monotonic)


class FutureStore:
    def __init__(self, loop: asyncio.AbstractEventLoop, long_poll_s: float = 30.0, keep_s: float = 3600.0):
        self.loop = loop
        self.long_poll_s = long_poll_s
        self.keep_s = keep_s
        self._futures: dict[str, _Future] = {}

    def create(self, request_id: str, owner: str) -> None:
        if request_id not in self._futures:
            self._futures[request_id] = _Future(owner)

    def owner_of(self, request_id: str) -> str | None:
        f = self._futures.get(request_id)
        return None if f is None else f.owner

    def resolve(self, request_id: str, outcome: Outcome) -> None:
        """Thread-safe: sets the outcome on the loop."""
        self.loop.call_soon_threadsafe(self._set, request_id, outcome)

    def _set(self, request_id: str, outcome: Outcome) -> None:
        f = self._futures.get(request_id)
        if f is not None and f.outcome is None:
            f.outcome = outcome
            f.event.set()

    async def wait(self, request_id: str, timeout: float | None = None) -> Outcome | None:
        """The outcome, or None after the long poll (the caller answers try_again). KeyError: unknown id."""
        f = self._futures[request_id]
        if f.outcome is None:
            try:
                await asyncio.wait_for(f.event.wait(), self.long_poll_s if timeout is None else timeout)
            except asyncio.TimeoutError:
                return None
        return f.outcome

    def prune(self) -> None:
        """Forgets finished futures older than keep_s."""
        cutoff = time.monotonic() - self.keep_s
        for rid in [r for r, f in self._futures.items() if f.outcome is not None and f.created < cutoff]:
            del self._futures[rid]
