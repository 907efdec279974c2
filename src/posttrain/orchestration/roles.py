"""Creating the run's roles as Ray actors in one placement group: a bundle per role, so what the config asks for
is what Ray reserves (the topology planner of a later issue will choose the bundles and strategy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.config import RunConfig


@dataclass
class Roles:
    trainer: Any
    rollout: list[Any]
    reward: Any
    reference: Any | None
    placement_group: Any


def role_bundles(cfg: RunConfig) -> list[tuple[str, dict[str, float]]]:
    """(role name, resources) per bundle, trainer first. The reference exists only when kl_coef > 0."""
    t = cfg.topology

    def res(cpus: float, gpus: float = 0.0) -> dict[str, float]:
        return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}

    bundles = [("trainer", res(t.trainer_cpus, t.trainer_gpus))]
    if cfg.algorithm.kl_coef > 0:
        bundles.append(("reference", res(t.reference_cpus)))
    bundles.append(("reward", res(t.reward_cpus)))
    bundles += [(f"rollout{i}", res(t.rollout_cpus, t.rollout_gpus)) for i in range(cfg.rollout.num_workers)]
    return bundles


def needed_cpus(cfg: RunConfig) -> float:
    return sum(r["CPU"] for _, r in role_bundles(cfg))


def create_roles(cfg: RunConfig, model_dir: str) -> Roles:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from posttrain.orchestration.recovery import REDO_ATTEMPTS
    from posttrain.rewards.verifier import RewardWorker
    from posttrain.rollout.worker import RolloutWorker, rollout_worker_env
    from posttrain.training.reference import ReferenceModel
    from posttrain.training.trainer import Trainer

    bundles = role_bundles(cfg)
    pg = placement_group([r for _, r in bundles], strategy="PACK", name=f"posttrain-{cfg.name}")
    ray.get(pg.ready())
    index = {name: i for i, (name, _) in enumerate(bundles)}
    cfg_dict = cfg.to_dict()

    def place(name: str, **extra):
        res = bundles[index[name]][1]
        return dict(
            num_cpus=res["CPU"],
            num_gpus=res.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index[name]),
            **extra,
        )

    threads = {"env_vars": {"OMP_NUM_THREADS": str(cfg.topology.torch_threads)}}
    trainer = ray.remote(Trainer).options(**place("trainer", runtime_env=threads)).remote(cfg_dict, model_dir)
    reference = None
    if "reference" in index:
        # fixed weights from model.path, so a restarted reference is the same function: Ray retries its calls
        reference = ray.remote(ReferenceModel).options(**place("reference", runtime_env=threads, max_restarts=3,
                                                               max_task_retries=3)).remote(
            cfg_dict, model_dir
        )
    reward = ray.remote(RewardWorker).options(**place("reward", max_restarts=3, max_task_retries=3)).remote(cfg_dict)
    v = cfg.rollout.vllm
    engine_kwargs = dict(
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        max_model_len=v.max_model_len,
        kv_cache_gb=v.kv_cache_gb,
        gpu_memory_utilization=v.gpu_memory_utilization,
        enforce_eager=v.enforce_eager,
    )
    rollout = [
        ray.remote(RolloutWorker)
        # restarted by Ray when its process dies; the driver redoes its share (orchestration/recovery.py)
        .options(**place(f"rollout{i}", runtime_env={"env_vars": rollout_worker_env(v.kv_cache_gb)},
                         max_restarts=REDO_ATTEMPTS, max_task_retries=0))
        .remote(cfg.rollout.engine, model_dir, engine_kwargs)
        for i in range(cfg.rollout.num_workers)
    ]
    # Surface start-up errors (bad model dir, engine failure) here, before the first step.
    ray.get([trainer.ping.remote(), reward.score.remote([])] + [w.pid.remote() for w in rollout]
            + ([reference.logprobs.remote([], [])] if reference is not None else []))
    return Roles(trainer=trainer, rollout=rollout, reward=reward, reference=reference, placement_group=pg)


def destroy_roles(roles: Roles) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    for actor in [roles.trainer, roles.reward, roles.reference, *roles.rollout]:
        if actor is not None:
            ray.kill(actor)
    remove_placement_group(roles.placement_group)
