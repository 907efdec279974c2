"""When roles are lost mid-run (a node died under a trainer rank, the watchdog killed a hung trainer, a rollout
worker could not come back), the run re-forms: every role is re-created on what the cluster has now and training
resumes from the last checkpoint, in process, exactly as `--resume` would. When the cluster cannot hold the plan any
more, the run waits `ops.capacity_wait_s` for capacity to return and then exits with EXIT_CAPACITY, naming what is
missing; `posttrain train <config> --resume` continues it once a node is back.

Ray's own view is the source of truth: alive nodes and their resources (`ray.nodes()`), which actor died and why
(the RayActorError the driver got)."""

from __future__ import annotations

import re

from posttrain.errors import PosttrainError
from posttrain.orchestration.recovery import RolesLost

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
    before this run started is not this run's loss. No nodes on an embedded cluster that was stopped."""

    def __init__(self):
        self.seen: set[str] = set()
        self.reported: set[str] = set()

    def look(self) -> tuple[dict[str, dict], list[str]]:
        """(alive node id -> resources, node ids newly gone)."""
        import ray

        if not ray.is_initialized():
            return {}, []
        alive = alive_nodes()
        self.seen |= set(alive)
        gone = sorted(self.seen - set(alive) - self.reported)
        self.reported |= set(gone)
        return alive, gone


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
