"""An elastic rollout fleet (`rollout.num_workers: MIN..MAX`): the MIN workers are reserved with the run's roles
(placement-group bundles; Ray restarts one that dies and its share is redone on it, remote/redo.py).
Up to MAX-MIN extras run on whatever the cluster has beyond that, outside the placement group:

- **join**: at each step boundary (`grow`), an extra that has finished starting gets the trainer's current weights
  and joins the fleet, so it generates from that step on; when fewer than MAX workers exist and the cluster has
  room for one more rollout worker (`ray.available_resources()`, a node added, say), one more extra is started,
  one at a time. Starting never blocks a step: an engine's start-up overlaps the steps;
- **leave**: an extra whose process or node dies mid-call leaves the fleet at once (`leave`, asked by the gather
  that saw it die); its prompts, with their seeds, are redone on the workers still there (rollout/fleet.py), so
  the step completes with the same samples. Extras have no restarts: nobody waits for one to come back.

Every prompt's samples come from its own seed (rollout/sampler.py sample_seed), not from the worker or the batch
it lands in, so the fleet's size changes which worker generates a prompt, not what it generates: on the hf engine
on CPU the samples of a step are identical whatever the fleet's size (tests/test_elastic.py)."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from posttrain.rollout.fleet import rollout_resync
from posttrain.tracking.interruptions import record_interruption


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ElasticFleet(list):
    """roles.rollout when rollout.num_workers is a range: the live rollout workers, the MIN reserved ones first,
    then the extras in the order they joined. It is the list every caller already holds (generation, weight sync,
    evals), grown and shrunk in place. `start_extra()` creates one extra RolloutWorker actor (no restarts);
    `cpus`/`gpus`: the resources one takes (topology.rollout_cpus, rollout_gpus)."""

    def __init__(self, reserved: list, max_workers: int, start_extra: Callable[[], Any], cpus: float, gpus: float,
                 run_dir):
        super().__init__(reserved)
        self.max_workers, self.start_extra, self.cpus, self.gpus, self.run_dir = (max_workers, start_extra, cpus,
                                                                                  gpus, run_dir)
        self.extras: list = []       # the extras in the fleet (handles)
        self.starting: list = []     # [(handle, its pid() ref, monotonic start)]: at most one
        self.step = 0                # the step in progress, as metrics.jsonl numbers it (for the records)
        self.log: Callable[[str], None] = _stderr
        self.watchdog = None         # roles.watchdog: it may have killed a hung extra
        self.joined = self.left = 0  # since the last metrics()

    def grow(self, roles, step: int, log: Callable[[str], None] = _stderr) -> None:
        """At the boundary before `step` (1-based): extras done starting join with the trainer's current weights;
        one more is started when the fleet is below its maximum and the cluster has room. Never waits for a start."""
        import ray
        from ray.exceptions import RayError

        self.step, self.log, self.watchdog = step, log, roles.watchdog
        for worker, ref, t0 in list(self.starting):
            if not ray.wait([ref], timeout=0)[0]:
                continue
            self.starting.remove((worker, ref, t0))
            try:
                pid = ray.get(ref)
                rollout_resync(roles)(worker)
            except RayError as e:  # its constructor failed, or its node went while it started
                ray.kill(worker)
                log(f"an extra rollout worker failed to start ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                    f"the fleet stays at {len(self)}")
                continue
            self.append(worker)
            self.extras.append(worker)
            self.joined += 1
            log(f"rollout worker rollout{len(self) - 1} (pid {pid}) joined the fleet before step {step}, started in "
                f"{time.monotonic() - t0:.1f} s, with the current weights; {len(self)} workers")
        if not self.starting and len(self) < self.max_workers and self._room():
            worker = self.start_extra()
            self.starting.append((worker, worker.pid.remote(), time.monotonic()))

    def _room(self) -> bool:
        """Does the cluster have, unreserved, what one more rollout worker takes?"""
        import ray

        free = ray.available_resources()
        return free.get("CPU", 0.0) >= self.cpus and free.get("GPU", 0.0) >= self.gpus

    def leave(self, worker, error: BaseException) -> bool:
        """`worker`'s call failed with a dead actor (`error`): an extra leaves the fleet (True); a reserved worker
        stays, to be waited for while Ray restarts it (False)."""
        import ray

        if not any(worker is w for w in self.extras):
            return False
        t = time.perf_counter()
        role = f"rollout{self.index(worker)}"
        self.remove(worker)
        self.extras.remove(worker)
        ray.kill(worker)  # dead, or unreachable on a lost node: make sure it does not come back holding resources
        self.left += 1
        hang = self.watchdog.forget(role) if self.watchdog is not None else None
        if hang is not None:
            reason = f"hung: its {hang.kind} call ran {hang.elapsed_s:.0f} s, past its bound; killed by the watchdog"
        else:
            reason = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
        self.log(f"rollout worker {role} left the fleet at step {self.step} ({reason.split(':')[0]}); its share is "
                 f"redone on the {len(self)} workers left")
        # a hang the watchdog caught is a hang (stacks on disk), recovered by dropping the extra; else a lost worker
        record_interruption(self.run_dir, "hang" if hang is not None else "worker_lost", step=self.step, role=role,
                            recovery_s=time.perf_counter() - t,
                            action=f"extra rollout worker dropped; its share redone on the {len(self)} left",
                            reason=reason, workers=len(self))
        return True

    def metrics(self) -> dict:
        """For the step's record: fleet/workers (live workers after the step: those that generated it),
        fleet/joined and fleet/left since the last call."""
        out = {"fleet/workers": len(self), "fleet/joined": self.joined, "fleet/left": self.left}
        self.joined = self.left = 0
        return out
