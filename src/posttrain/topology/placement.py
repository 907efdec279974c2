"""The plan made real: placement groups, bundles and each actor's slot. `placement_for_run` is what create_roles
uses; the pure part (`manual_placement`, `plan_placement`) maps a config or a LayoutPlan to a PlacementSpec, the
Ray part (`reserve`, `actor_options`, `release`) turns that spec into placement groups and actor options.

A plan's layout is laid out as one placement group per node, STRICT_PACK, a bundle per device ({device: 1, CPU}),
so bundle b of group n is device b of node n and a role's devices are the bundles the plan named. Actors that
share a device split its device and CPU shares evenly. The manual mode (the default) keeps today's single PACK
group with a bundle per role."""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import RunConfig
from posttrain.errors import PosttrainError
from posttrain.topology.devices import Cluster
from posttrain.topology.plan import LayoutPlan


@dataclass(frozen=True)
class GroupSpec:
    name: str
    bundles: list[dict[str, float]]
    strategy: str  # PACK | STRICT_PACK | SPREAD | STRICT_SPREAD (Ray's placement strategies)
    node: int | None = None  # the cluster node this group stands for (plan layouts)


@dataclass(frozen=True)
class Slot:
    """Where one actor goes: a bundle of a group, and the resources it takes from that bundle."""

    group: int
    bundle: int
    resources: dict[str, float]


@dataclass(frozen=True)
class PlacementSpec:
    groups: list[GroupSpec]
    actors: dict[str, Slot]


# Actor name -> the planner role whose devices it uses. The rule-based reward worker holds no model: it shares
# the trainer's first device (for CPU only) when the plan has no reward model.
def planner_role(actor: str) -> str:
    if actor.startswith("rollout"):
        return "rollout"
    if actor.startswith("trainer"):  # trainer, trainer1, ...: the ranks of a sharded trainer
        return "policy"
    return {"trainer": "policy", "reward_model": "reward", "evaluator": "rollout"}.get(actor, actor)


def role_bundles(cfg: RunConfig) -> list[tuple[str, dict[str, float]]]:
    """(role name, resources) per bundle, trainer first. The reference exists only when kl_coef > 0 and the
    policy is trained in full (with model.lora the trainer gives reference logprobs with its adapters off)."""
    t = cfg.topology

    def res(cpus: float, gpus: float = 0.0) -> dict[str, float]:
        return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}

    bundles = [("trainer", res(t.trainer_cpus, t.trainer_gpus))]
    bundles += [(f"trainer{r}", res(t.trainer_cpus, t.trainer_gpus)) for r in range(1, t.trainer_ranks)]
    if cfg.algorithm.kl_coef > 0 and cfg.model.lora is None:
        bundles.append(("reference", res(t.reference_cpus)))
    if cfg.distill.teacher:  # opd's teacher: forward only, like the reference (its CPU share too)
        bundles.append(("teacher", res(t.reference_cpus)))
    if cfg.algorithm.name == "ppo":
        bundles.append(("critic", res(t.critic_cpus)))
    bundles.append(("reward", res(t.reward_cpus)))
    if cfg.reward.weights.get("rm"):
        bundles.append(("reward_model", res(cfg.reward.rm_cpus)))
    bundles += [(f"rollout{i}", res(t.rollout_cpus, t.rollout_gpus)) for i in range(cfg.rollout.num_workers)]
    if cfg.eval.suites:
        bundles.append(("evaluator", res(cfg.eval.evaluator_cpus, t.rollout_gpus)))
    return bundles


def needed_cpus(cfg: RunConfig) -> float:
    return sum(r["CPU"] for _, r in role_bundles(cfg))


def run_actors(cfg: RunConfig) -> list[str]:
    """The loop's actors, trainer first (the names of role_bundles)."""
    return [name for name, _ in role_bundles(cfg)]


def manual_placement(cfg: RunConfig) -> PlacementSpec:
    """Today's behaviour: one PACK group, a bundle per role with the topology.*_cpus/_gpus shares."""
    bundles = role_bundles(cfg)
    group = GroupSpec(f"posttrain-{cfg.name}", [r for _, r in bundles], "PACK")
    return PlacementSpec([group], {name: Slot(0, i, dict(res)) for i, (name, res) in enumerate(bundles)})


def _share(x: float, n: int) -> float:
    return int(x / n * 10_000) / 10_000  # Ray accepts resource fractions to 4 decimals


def plan_placement(plan: LayoutPlan, cluster: Cluster, actors: list[str], device_resource: str | None = None,
                   cpus_per_device: float = 1.0, name: str = "posttrain") -> PlacementSpec:
    """Groups, bundles and slots for a feasible plan. device_resource: the Ray resource of one device (default the
    device table's, GPU or CPU; tests pass a custom resource standing in for GPUs)."""
    if not plan.devices:
        raise PosttrainError(f"layout {plan.layout} cannot be placed: {plan.reason}")
    res = device_resource or cluster.device.ray_resource
    per_node = cluster.devices_per_node
    device_of: dict[str, int] = {}
    for role in {planner_role(a) for a in actors}:
        members = [a for a in actors if planner_role(a) == role]
        ids = plan.devices.get(role) or plan.devices["policy"][:1]
        for i, a in enumerate(members):
            device_of[a] = ids[(i * len(ids)) // len(members)]
    used_nodes = sorted({d // per_node for ids in plan.devices.values() for d in ids})
    group_of_node = {n: g for g, n in enumerate(used_nodes)}
    bundle = {res: 1.0} if res == "CPU" else {res: 1.0, "CPU": cpus_per_device}
    groups = [GroupSpec(f"{name}-node{n}", [dict(bundle) for _ in range(per_node)], "STRICT_PACK", n)
              for n in used_nodes]
    slots = {}
    for a, d in device_of.items():
        sharing = sum(1 for other in device_of.values() if other == d)
        slots[a] = Slot(group_of_node[d // per_node], d % per_node, {k: _share(v, sharing) for k, v in bundle.items()})
    return PlacementSpec(groups, slots)


def placement_for_run(cfg: RunConfig) -> PlacementSpec:
    """The spec create_roles executes: manual, or the layout topology.mode picks on topology.cluster."""
    if cfg.topology.mode == "manual":
        return manual_placement(cfg)
    from posttrain.topology.from_config import plan_for_config

    inp, _, chosen = plan_for_config(cfg)
    if chosen is None or not chosen.feasible:
        why = chosen.reason if chosen else "no layout fits"
        raise PosttrainError(f"topology.mode={cfg.topology.mode}: {why}",
                             hint="run `posttrain plan` on this config to see every layout")
    return plan_placement(chosen, inp.cluster, run_actors(cfg), name=f"posttrain-{cfg.name}")


# ------------------------------------------------------------------------------------------ Ray edge


class PlacementTimeout(PosttrainError):
    """Ray did not reserve every bundle of the placement within the timeout (a re-form waits for capacity on it)."""


def reserve(spec: PlacementSpec, timeout_s: float = 120.0) -> list:
    """Creates the placement groups and waits until Ray has reserved every bundle."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pgs = [placement_group(g.bundles, strategy=g.strategy, name=g.name) for g in spec.groups]
    ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=timeout_s)
    if len(ready) < len(pgs):
        for pg in pgs:
            remove_placement_group(pg)
        need = [f"{g.name}: {len(g.bundles)} x {g.bundles[0]} ({g.strategy})" for g in spec.groups]
        raise PlacementTimeout(f"Ray could not reserve the placement within {timeout_s:.0f} s: {'; '.join(need)}",
                             hint=f"the cluster has {ray.cluster_resources()}; check `ray status` or the plan's cluster")
    return pgs


def actor_options(spec: PlacementSpec, pgs: list, actor: str) -> dict:
    """ray.remote(...).options(**this) for one actor: its bundle and its share of the bundle's resources."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    slot = spec.actors[actor]
    res = dict(slot.resources)
    opts = dict(num_cpus=res.pop("CPU", 0), num_gpus=res.pop("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(pgs[slot.group],
                                                                     placement_group_bundle_index=slot.bundle))
    if res:
        opts["resources"] = res
    return opts


def release(pgs: list) -> None:
    from ray.util.placement_group import remove_placement_group

    for pg in pgs:
        remove_placement_group(pg)
