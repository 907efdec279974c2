"""Redoing a worker's share of the work after its process died.

Rollout actors are created with `max_restarts`, so Ray starts a fresh process when one dies; its constructor runs
again and loads the weights of `model.path`, not the policy's current ones. The driver therefore waits until the
restarted actor answers, lets the caller bring it up to date (`resync`: push the trainer's current weights) and
resubmits exactly the same share (same prompts, same sampling seeds), so no sample is lost or produced twice.
An error raised *inside* a task (a bug, a bad request) is not a dead process: it propagates unchanged. A worker
the watchdog found hung (remote/watchdog.py) is killed and restarted, and its share is redone the same way.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from posttrain.preemption import stop_if_cluster_stopped
from posttrain.remote.watchdog import RolesLost, watched_get

REDO_ATTEMPTS = 3          # a share is redone at most this many times (the actors' max_restarts is the same)
RESTART_TIMEOUT_S = 600.0  # a vLLM engine restart takes 20-60 s on a loaded 2-core machine


class _Left:
    def __repr__(self) -> str:
        return "LEFT"


LEFT = _Left()  # gather_with_redo's result for a share whose worker left an elastic fleet


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def wait_until_alive(actor: Any, timeout_s: float = RESTART_TIMEOUT_S) -> int:
    """Blocks until `actor` (restarting after a crash) answers `pid()`; returns its new process id."""
    import ray
    from ray.exceptions import ActorDiedError, RayActorError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(actor.pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
        except ActorDiedError:
            raise  # restarts exhausted: the actor is gone for good
        except (RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def gather_with_redo(
    workers: list[Any],
    submit: Callable[[int], Any],
    *,
    resync: Callable[[Any], None] | None = None,
    what: str = "work",
    log: Callable[[str], None] = _stderr,
    watchdog: Any | None = None,
    kind: str = "generate",
    leave: Callable[[Any, BaseException], bool] | None = None,
) -> list[Any]:
    """`submit(i)` sends worker i its share and returns the ObjectRef; returns the results in worker order.
    A share whose worker process died is redone on the restarted worker (after `resync(worker)`). With a
    `watchdog` (remote/watchdog.py), a share running past the bound of its `kind` is a hang: the watchdog
    restarts worker i, and its share is redone the same way. `leave(worker, error)` (an elastic fleet's,
    rollout/elastic.py) is asked first: True when the dead worker was an extra and has left the fleet; its
    result is then LEFT, for the caller to redo on the workers still there."""
    from ray.exceptions import RayActorError

    refs = [submit(i) for i in range(len(workers))]
    submitted = time.monotonic()
    results = []
    for i, ref in enumerate(refs):
        started = submitted
        for attempt in range(REDO_ATTEMPTS + 1):
            try:
                if ref is None:  # the worker died: wait for its restart, bring it up to date, resubmit
                    t = time.perf_counter()
                    pid = wait_until_alive(workers[i])
                    if resync is not None:
                        resync(workers[i])
                    log(f"rollout worker {i} is back (pid {pid}) after {time.perf_counter() - t:.1f} s; redoing its {what}")
                    ref, started = submit(i), time.monotonic()
                results.append(watched_get(watchdog, [(ref, kind, f"rollout{i}")], started)[0])
                break
            except RayActorError as e:
                if leave is not None and leave(workers[i], e):
                    results.append(LEFT)
                    break
                stop_if_cluster_stopped()  # after a stop signal, a worker that died with its cluster is not restarted
                if attempt == REDO_ATTEMPTS:
                    raise RolesLost(f"rollout{i}", f"died {attempt + 1} times while doing {what}") from e
                log(f"rollout worker {i} died during {what} ({type(e).__name__}); waiting for its restart to redo it")
                ref = None
    return results

