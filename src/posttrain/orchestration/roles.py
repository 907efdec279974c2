"""Creating the run's roles as Ray actors in one placement group: a bundle per role, so what the config asks for
is what Ray reserves; with topology.mode other than manual, the planner's layout decides groups and bundles
(topology/placement.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.config import RunConfig
from posttrain.errors import PosttrainError


@dataclass
class Roles:
    trainer: Any
    rollout: list[Any]
    reward: Any
    reference: Any | None
    placement_group: Any  # the list of placement groups the placement spec reserved
    critic: Any | None = None  # PPO's value model
    reward_model: Any | None = None  # RewardModel actor (one RM or an ensemble), when reward.weights has an 'rm' weight
    judge: Any | None = None         # JudgeReward (in the driver: it only waits on HTTP), for a 'judge' weight
    evaluator: Any | None = None     # CheckpointEvaluator (evals/in_loop.py), when eval.suites is set
    watchdog: Any | None = None      # remote/watchdog.py: remote calls past their bound are hangs
    episodes: Any | None = None      # rollout/episodes.EpisodeRunner (in the driver), for multi-turn runs
    teacher: Any | None = None       # opd: a ReferenceModel on distill.teacher, scoring the student's samples


def create_roles(cfg: RunConfig, model_dir: str, reserve_timeout_s: float = 120.0) -> Roles:
    """Every role of the run as a Ray actor in the placement's bundles; start-up errors (a bad model directory, an
    engine that fails) surface here, before the first step."""
    import ray

    from posttrain.rewards.worker import RewardWorker
    from posttrain.topology.placement import actor_options, placement_for_run, reserve
    from posttrain.training.reference import ReferenceModel

    # The plan (or, in topology.mode=manual, one PACK group with a bundle per role) decides groups and bundles.
    spec = placement_for_run(cfg)
    pgs = reserve(spec, reserve_timeout_s)
    index = spec.actors
    cfg_dict = cfg.to_dict()

    def place(name: str, **extra):
        return dict(actor_options(spec, pgs, name), **extra)

    threads = {"env_vars": {"OMP_NUM_THREADS": str(cfg.topology.torch_threads)}}
    trainer = create_trainer(cfg, model_dir, place, threads)
    reference = critic = reward_model = judge = evaluator = None
    if "reference" in index:
        # fixed weights from model.path, so a restarted reference is the same function: Ray retries its calls
        reference = ray.remote(ReferenceModel).options(**place("reference", runtime_env=threads, max_restarts=3,
                                                               max_task_retries=3)).remote(cfg_dict, model_dir)
    teacher = None
    if "teacher" in index:  # opd: the reference's class on the teacher's weights (fixed too, so retried the same)
        teacher = ray.remote(ReferenceModel).options(**place("teacher", runtime_env=threads, max_restarts=3,
                                                             max_task_retries=3)).remote(cfg_dict, cfg.distill.teacher,
                                                                                             "distill.teacher")
    if "critic" in index:
        from posttrain.training.critic import Critic

        critic = ray.remote(Critic).options(**place("critic", runtime_env=threads)).remote(cfg_dict, model_dir)
    reward = ray.remote(RewardWorker).options(**place("reward", max_restarts=3, max_task_retries=3)).remote(cfg_dict)
    rollout = create_rollout(cfg, model_dir, place)
    if "reward_model" in index:
        from posttrain.rewards.reward_model import RewardModel

        # fixed weights, like the reference: a restart (after a crash or a hang) computes the same scores
        reward_model = ray.remote(RewardModel).options(**place("reward_model", max_restarts=3,
                                                               max_task_retries=3)).remote(
            [cfg.reward.rm_path, *cfg.reward.rm_ensemble], 1, cfg.model.chat_template)
    if cfg.reward.weights.get("judge"):
        from posttrain.rewards.judge import make_judge

        judge = make_judge(cfg, cfg.run_dir)
    if "evaluator" in index:
        evaluator = create_evaluator(cfg, place)
    roles = Roles(trainer=trainer, rollout=rollout, reward=reward, reference=reference, placement_group=pgs,
                  critic=critic, reward_model=reward_model, judge=judge, evaluator=evaluator, teacher=teacher)
    wait_until_started(roles)
    return roles


def create_trainer(cfg: RunConfig, model_dir: str, place, threads: dict):
    """The trainer actor, or with topology.trainer_ranks > 1 the sharded group (rank r on slot "trainer" for r = 0,
    f"trainer{r}" otherwise)."""
    import ray

    from posttrain.training.trainer import Trainer

    if cfg.topology.trainer_ranks > 1:
        from posttrain.orchestration.trainer_group import create_trainer_group

        return create_trainer_group(cfg, model_dir, lambda r: place(f"trainer{r or ''}", runtime_env=threads))
    return ray.remote(Trainer).options(**place("trainer", runtime_env=threads)).remote(cfg.to_dict(), model_dir)


def create_rollout(cfg: RunConfig, model_dir: str, place):
    """rollout.num_workers rollout workers in their bundles, restarted by Ray when a process dies (the driver redoes
    its share: remote/redo.py); with rollout.elastic, an ElasticFleet around them that adds extras beyond the
    placement group (never restarted)."""
    import ray

    from posttrain.remote.redo import REDO_ATTEMPTS
    from posttrain.rollout.lora_serving import lora_engine_options
    from posttrain.rollout.worker import RolloutWorker, behaviour_logprobs_mode, engine_threads, rollout_worker_env

    v = cfg.rollout.vllm
    engine_kwargs = dict(
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        max_model_len=v.max_model_len,
        kv_cache_gb=v.kv_cache_gb,
        gpu_memory_utilization=v.gpu_memory_utilization,
        enforce_eager=v.enforce_eager,
        logprobs=behaviour_logprobs_mode(cfg),  # sampled: the behaviour policy's, when the loss corrects for it
        **lora_engine_options(cfg),  # model.lora.sync=adapter: the engines serve the adapter
    )
    engine_omp = engine_threads(cfg)
    # partial rollouts: a threaded actor, so that interrupt() reaches the engine while generate runs (the worker
    # still lets one call at a time into the engine)
    threaded = {"max_concurrency": 2} if cfg.rollout.partial_rollouts else {}

    def rollout_worker(**options):
        return (ray.remote(RolloutWorker)
                .options(runtime_env={"env_vars": rollout_worker_env(v.kv_cache_gb, engine_omp)}, max_task_retries=0,
                         **threaded, **options)
                .remote(cfg.rollout.engine, model_dir, engine_kwargs))

    rollout = [rollout_worker(**place(f"rollout{i}", max_restarts=REDO_ATTEMPTS))
               for i in range(cfg.rollout.num_workers)]
    if not cfg.rollout.elastic:
        return rollout
    from posttrain.rollout.elastic import ElasticFleet

    t = cfg.topology
    return ElasticFleet(rollout, cfg.rollout.num_workers_max, lambda: rollout_worker(
        num_cpus=t.rollout_cpus, num_gpus=t.rollout_gpus, scheduling_strategy="SPREAD", max_restarts=0),
        t.rollout_cpus, t.rollout_gpus, cfg.run_dir)


def create_evaluator(cfg: RunConfig, place):
    """The in-loop evaluator (evals/in_loop.py), which scores saved checkpoints on eval.suites beside the run."""
    import ray

    from posttrain.evals.in_loop import CheckpointEvaluator
    from posttrain.rollout.worker import rollout_worker_env

    v = cfg.rollout.vllm
    engine = {"kind": cfg.rollout.engine, "dtype": cfg.model.dtype, "max_model_len": v.max_model_len,
              "kv_cache_gb": v.kv_cache_gb}
    return ray.remote(CheckpointEvaluator).options(**place(
        "evaluator", runtime_env={"env_vars": rollout_worker_env(v.kv_cache_gb)})).remote(
        cfg.eval.suites, engine, run_dir=str(cfg.run_dir.resolve()))


def wait_until_started(roles: Roles) -> None:
    """One cheap call to every actor, so a constructor's error (bad model dir, engine failure) surfaces as the
    user's error it was."""
    import ray

    try:
        ray.get([roles.trainer.ping.remote(), roles.reward.score.remote([])] + [w.pid.remote() for w in roles.rollout]
                + ([roles.reference.logprobs.remote([], [])] if roles.reference is not None else [])
                + ([roles.teacher.logprobs.remote([], [])] if roles.teacher is not None else [])
                + ([roles.critic.ping.remote()] if roles.critic is not None else [])
                + ([roles.reward_model.score.remote([])] if roles.reward_model is not None else [])
                + ([roles.evaluator.ping.remote()] if roles.evaluator is not None else []))
    except ray.exceptions.RayActorError as e:
        raise_user_error_of(e)


def raise_user_error_of(error: Exception) -> None:
    """An actor whose constructor raised a PosttrainError (a bad input found inside it) dies with only the remote
    traceback as text: re-raise that message as the PosttrainError it was, anything else as it is."""
    marker = "posttrain.errors.PosttrainError: "
    text = getattr(error, "error_msg", "") or str(error)
    if marker in text:
        message = text[text.rindex(marker) + len(marker):].strip()
        raise PosttrainError(f"a role failed to start: {message}") from None
    raise error


def role_actors(roles: Roles) -> dict[str, Any]:
    """role name -> actor handle: trainer (rank 0), trainer1 ..., rollout0 ..., reward, reference, critic,
    reward_model, evaluator (those the run has)."""
    trainers = getattr(roles.trainer, "ranks", [roles.trainer])  # a TrainerGroup's ranks, or the one trainer
    named = {"trainer" + (str(r) if r else ""): a for r, a in enumerate(trainers)}
    named.update((f"rollout{i}", w) for i, w in enumerate(roles.rollout))
    named.update((n, getattr(roles, n, None)) for n in ("reward", "reference", "teacher", "critic", "reward_model",
                                                        "evaluator"))
    return {n: a for n, a in named.items() if a is not None}


def role_names(roles: Roles | None) -> dict[str, str]:
    """Ray actor id (hex) -> the role's name, to say which one died."""
    if roles is None:
        return {}
    return {a._actor_id.hex(): n for n, a in role_actors(roles).items() if hasattr(a, "_actor_id")}


def destroy_roles(roles: Roles) -> None:
    import ray
    from posttrain.rollout.elastic import ElasticFleet
    from posttrain.topology.placement import release

    if roles.judge is not None:
        roles.judge.close()
    trainers = getattr(roles.trainer, "ranks", [roles.trainer])  # a TrainerGroup's actors, or the one trainer
    starting = [w for w, _, _ in roles.rollout.starting] if isinstance(roles.rollout, ElasticFleet) else []
    for actor in [*trainers, roles.reward, roles.reference, roles.teacher, roles.critic, roles.reward_model,
                  roles.evaluator, *roles.rollout, *starting]:
        if actor is not None:
            ray.kill(actor)
    release(roles.placement_group if isinstance(roles.placement_group, list) else [roles.placement_group])
