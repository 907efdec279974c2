"""When roles are lost mid-run (a node died under a trainer rank, the watchdog killed a hung trainer, a rollout
worker could not come back), the run re-forms: every role is re-created on what the cluster has now and training
resumes from the last checkpoint, in process, exactly as `--resume` would. When the cluster cannot hold the plan any
more, the run waits `ops.capacity_wait_s` for capacity to return and then exits with EXIT_CAPACITY, naming what is
missing; `posttrain train <config> --resume` continues it once a node is back.

Ray's own view is the source of truth: alive nodes and their resources (`ray.nodes()`), which actor died and why
(the RayActorError the driver got)."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field

from posttrain.errors import PosttrainError
from posttrain.remote.watchdog import RolesLost
from posttrain.tracking.interruptions import record_interruption
from posttrain import checkpoint as ckpt

# After EX_TEMPFAIL (75, preempted): a distinct code for "the cluster lost capacity; resume when it is back".
EXIT_CAPACITY = 76
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the remote traceback's header


class CapacityLost(PosttrainError):
    """Roles were lost and the cluster could not hold the plan again within ops.capacity_wait_s."""


def lost_errors() -> tuple[type[BaseException], ...]:
    """The Ray errors that mean a role's process (or its node) is gone, not that its code raised."""
    from ray import exceptions as rx

    return (rx.RayActorError, rx.ObjectLostError, rx.OwnerDiedError, rx.NodeDiedError, rx.WorkerCrashedError,
            rx.GetTimeoutError, RolesLost)


def as_roles_lost(error: BaseException, names: dict[str, str]) -> RolesLost:
    """The RolesLost a lost-role error stands for, naming the role (`names`: actor id hex -> role, roles.py). A task
    that failed because an actor it waited on was lost (the trainer group's rank-0 gather) names that actor."""
    from ray.exceptions import RayTaskError

    if isinstance(error, RolesLost):
        return error
    cause = getattr(error, "cause", None) if isinstance(error, RayTaskError) else None
    if cause is not None and getattr(cause, "actor_id", None):
        error = cause
    actor = getattr(error, "actor_id", None)
    role = names.get(actor, f"actor {actor}") if actor else "a role"
    text = ANSI.sub("", str(error)).strip().splitlines()
    return RolesLost(role, f"{type(error).__name__}: {text[0] if text else ''}"[:500])


def dead_roles(actors: dict[str, object], timeout_s: float = 15.0) -> list[str]:
    """The roles (name -> actor, roles.role_actors) whose actor is gone: its `process()` call raises an actor error
    within timeout_s. Used when a role's task failed with an ordinary error that a lost peer can cause (a gloo
    collective whose other rank died: "Connection closed by peer"): that is a lost role, not a bug."""
    import ray
    from ray.exceptions import RayActorError

    refs = {name: actor.process.remote() for name, actor in actors.items()}
    ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    dead = []
    for name, ref in refs.items():
        try:
            ray.get(ref, timeout=0)
        except RayActorError:
            dead.append(name)
        except Exception:  # noqa: BLE001 - busy or slow is not dead
            pass
    return dead


def alive_nodes() -> dict[str, dict]:
    """node id -> its resources, for every node Ray sees alive now."""
    import ray

    return {n["NodeID"]: dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")}


class NodeWatch:
    """The Ray nodes a run has seen alive, and which of them are gone since (each reported once), so a node lost
    before this run started is not this run's loss. No nodes on an embedded cluster that was stopped. `alive` (node
    id -> resources) is Ray's view, asked when not given."""

    def __init__(self):
        self.seen: set[str] = set()
        self.reported: set[str] = set()

    def start(self, alive: dict[str, dict] | None = None) -> None:
        """Adds the nodes alive now to those seen, reporting none: called as each attempt of a run starts. A node
        that died before a re-form, and that Ray declares dead only after this, is still reported by a later look."""
        self.seen |= set(_ask_ray() if alive is None else alive)

    def look(self, alive: dict[str, dict] | None = None) -> tuple[dict[str, dict], list[str]]:
        """(alive node id -> resources, node ids newly gone)."""
        alive = _ask_ray() if alive is None else alive
        self.seen |= set(alive)
        gone = sorted(self.seen - set(alive) - self.reported)
        self.reported |= set(gone)
        return alive, gone


def _ask_ray() -> dict[str, dict]:
    import ray

    return alive_nodes() if ray.is_initialized() else {}


def capacity_text(nodes: dict[str, dict]) -> str:
    total: dict[str, float] = {}
    for res in nodes.values():
        for k in ("CPU", "GPU"):
            total[k] = total.get(k, 0.0) + res.get(k, 0.0)
    parts = ", ".join(f"{v:g} {k}" for k, v in total.items() if v)
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} alive ({parts or 'no resources'})"


def capacity_lost(spec, nodes: dict[str, dict], waited_s: float, step: int, resume: str,
                  reason: str) -> CapacityLost:
    """The error the run exits with: what the placement (`spec`, topology/placement.py) needs, group by group with
    its roles, what is alive, and the command that continues the run."""
    roles: dict[int, list[str]] = {}
    for name, slot in spec.actors.items():
        roles.setdefault(slot.group, []).append(name)
    need = "; ".join(f"{len(g.bundles)} x {g.bundles[0]} ({g.strategy}) for {', '.join(roles.get(i, []))}"
                     for i, g in enumerate(spec.groups))
    return CapacityLost(
        f"roles lost ({reason}) and the cluster cannot hold the run's roles again: they need {need}; the cluster "
        f"has {capacity_text(nodes)}, after waiting {waited_s:.0f} s (ops.capacity_wait_s). The last checkpoint "
        f"(step {step}) is on disk",
        hint=f"add a node (or free resources), then continue with `{resume}`",
    )


# ------------------------------------------------------------------------ one incident, as the run (loop.py) sees it


@dataclass
class Reform:
    """One incident, from RolesLost escaping a run to the roles re-formed: what the next attempt (`_train`'s
    `reforming`) needs. `nodes_lost` grows as Ray declares nodes dead."""

    detected_at: float  # time.time() when the loss reached train()
    resume: bool  # a valid checkpoint exists to resume from
    role: str
    reason: str
    from_step: int  # the checkpoint's step
    redone_steps: int  # steps after the checkpoint, to train again
    redone_s: float  # their seconds
    nodes: NodeWatch
    nodes_lost: list[str] = field(default_factory=list)


def roles_lost(cfg, lost: RolesLost, nodes: NodeWatch, notify) -> Reform:
    """After RolesLost escaped a run: the detection time, whether a checkpoint exists to resume from, the steps that
    will be trained again, the nodes lost so far."""
    from posttrain.tracking import read_metrics

    detected = time.time()
    last = ckpt.latest_valid_checkpoint(cfg.run_dir / "checkpoints", warn=lambda _: None)
    ckpt_step = int(last.name[len(ckpt.PREFIX):]) if last else 0
    done = [m for m in read_metrics(cfg.run_dir) if "time/step" in m and m["step"] > ckpt_step]
    reforming = Reform(detected_at=detected, resume=last is not None, role=lost.role, reason=lost.reason,
                       from_step=ckpt_step, redone_steps=len(done), redone_s=sum(m["time/step"] for m in done),
                       nodes=nodes)
    alive = nodes_lost(reforming, notify)
    where = capacity_text(alive) if alive else "a new embedded cluster"
    print(f"roles lost at step {ckpt_step + len(done)} ({lost}); re-forming them on {where} and resuming from the "
          f"checkpoint of step {ckpt_step}", file=sys.stderr, flush=True)
    return reforming


def nodes_lost(reforming: Reform, notify) -> dict:
    """Tells ops.notify of each node gone since the last look (Ray may declare a dead node dead only seconds after
    the roles on it failed), adds them to the incident, and returns the alive nodes."""
    alive, gone = reforming.nodes.look()
    for node in gone:
        notify("node_lost", node=node[:12], step=reforming.from_step + reforming.redone_steps,
               role=reforming.role, reason=reforming.reason, capacity=capacity_text(alive))
    reforming.nodes_lost += gone
    return alive


def node_left(cfg, nodes: NodeWatch, step: int, notify) -> None:
    """At a step boundary: a node Ray has declared dead since the last look, while no role had to be re-formed (it
    held only elastic rollout workers, or Ray declared it dead only after the re-form), is told and recorded."""
    alive, gone = nodes.look()
    for node in gone:
        notify("node_lost", node=node[:12], step=step, capacity=capacity_text(alive))
        record_interruption(cfg.run_dir, "node_lost", step=step, role="node", node=node,
                            action=f"node {node[:12]} left the cluster; the run goes on on {capacity_text(alive)}")


def create_roles_or_wait(cfg, reforming: Reform | None, notify, resume: str):
    """create_roles; when re-forming after a loss, Ray gets ops.capacity_wait_s to reserve the roles again, and a
    cluster that cannot hold them by then ends the run with CapacityLost (exit 76) instead of a config error."""
    from posttrain.orchestration.roles import create_roles
    from posttrain.topology.placement import PlacementTimeout, placement_for_run

    if reforming is None:
        return create_roles(cfg, cfg.model.path)
    t = time.monotonic()
    try:
        return create_roles(cfg, cfg.model.path, reserve_timeout_s=max(cfg.ops.capacity_wait_s, 1.0))
    except PlacementTimeout as e:
        nodes_lost(reforming, notify)
        record_interruption(cfg.run_dir, "capacity_exit", step=reforming.from_step, role=reforming.role,
                            detected_at=reforming.detected_at, automatic=False,
                            action=f"exit {EXIT_CAPACITY}: the cluster could not hold the roles again", reason=str(e),
                            nodes_lost=reforming.nodes_lost)
        raise capacity_lost(placement_for_run(cfg), reforming.nodes.look()[0], time.monotonic() - t, reforming.from_step,
                            resume, reforming.reason) from None


def reformed(cfg, roles, reforming: Reform, notify) -> None:
    """The roles are back and the checkpoint loaded: record how long it took and say so."""
    took = time.time() - reforming.detected_at
    where = capacity_text(nodes_lost(reforming, notify))
    record_interruption(cfg.run_dir, "roles_reformed", step=reforming.from_step, role=reforming.role,
                        detected_at=reforming.detected_at, recovery_s=took, redone_steps=reforming.redone_steps,
                        redone_s=reforming.redone_s, reason=reforming.reason, nodes_lost=reforming.nodes_lost,
                        action=f"roles re-created on {where}; resumed from the checkpoint of step "
                               f"{reforming.from_step} ({reforming.redone_steps} steps to train again)")
    if reforming.reason.startswith("hung:"):  # the watchdog killed a trainer, critic or evaluator
        notify("hang_recovered", step=reforming.from_step, role=reforming.role, seconds=round(took, 1),
               action="roles re-formed from the checkpoint")
    if reforming.nodes_lost:
        notify("node_recovered", step=reforming.from_step, seconds=round(took, 1), capacity=where,
               redone_steps=reforming.redone_steps)
