"""When roles are lost mid-run (a node died under a trainer rank, the watchdog killed a hung trainer, a rollout
worker could not come back), the run re-forms: every role is re-created on what the cluster has now and training
resumes from the last checkpoint, in process, exactly as `--resume` would. When the cluster cannot hold the plan any
more, the run waits `ops.capacity_wait_s` for capacity to return and then exits with EXIT_CAPACITY, naming what is
missing; `posttrain train <config> --resume` continues it once a node is back.

Ray's own view is the source of truth: alive nodes and their resources (`ray.nodes()`), which actor died and why
(the RayActorError the driver got)."""

from __future__ import annotations

from posttrain.errors import PosttrainError
from posttrain.orchestration.recovery import RolesLost

# After EX_TEMPFAIL (75, preempted): a distinct code for "the cluster lost capacity; resume when it is back".
EXIT_CAPACITY = 76


class CapacityLost(PosttrainError):
    """Roles were lost and the cluster could not hold the plan again within ops.capacity_wait_s."""


def lost_errors() -> tuple[type[BaseException], ...]:
    """The Ray errors that mean a role's process (or its node) is gone, not that its code raised."""
    from ray import exceptions as rx

    return (rx.RayActorError, rx.ObjectLostError, rx.OwnerDiedError, rx.NodeDiedError, rx.WorkerCrashedError,
            rx.GetTimeoutError, RolesLost)


def as_roles_lost(error: BaseException, names: dict[str, str]) -> RolesLost:
    """The RolesLost a lost-role error stands for, naming the role (`names`: actor id hex -> role, roles.py)."""
    if isinstance(error, RolesLost):
        return error
    actor = getattr(error, "actor_id", None)
    role = names.get(actor, f"actor {actor}") if actor else "a role"
    text = str(error).strip().splitlines()
    return RolesLost(role, f"{type(error).__name__}: {text[0] if text else ''}"[:500])


def alive_nodes() -> dict[str, dict]:
    """node id -> its resources, for every node Ray sees alive now."""
    import ray

    return {n["NodeID"]: dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")}


def capacity_text(nodes: dict[str, dict]) -> str:
    total: dict[str, float] = {}
    for res in nodes.values():
        for k in ("CPU", "GPU"):
            total[k] = total.get(k, 0.0) + res.get(k, 0.0)
    parts = ", ".join(f"{v:g} {k}" for k, v in total.items() if v)
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} alive ({parts or 'no resources'})"


def capacity_lost(needed: list[tuple[str, dict]], nodes: dict[str, dict], waited_s: float, step: int,
                  resume: str, reason: str) -> CapacityLost:
    """The error the run exits with: what the plan needs, what is alive, and the command that continues it."""
    total: dict[str, float] = {}
    for _, res in needed:
        for k, v in res.items():
            total[k] = total.get(k, 0.0) + v
    need = ", ".join(f"{v:g} {k}" for k, v in total.items())
    roles = ", ".join(f"{name} {res}" for name, res in needed)
    return CapacityLost(
        f"roles lost ({reason}) and the cluster cannot hold the run's roles again: they need {need} in all "
        f"({roles}); the cluster has {capacity_text(nodes)}, after waiting {waited_s:.0f} s "
        f"(ops.capacity_wait_s). The last checkpoint (step {step}) is on disk",
        hint=f"add a node (or free resources), then continue with `{resume}`",
    )
