"""The run's lifecycle: start (run dir, Ray, roles), resume, the steps, held-out evaluation, atomic checkpoints
every k steps, preemption on SIGTERM, and the summary at the finish. One step (rollout -> reward -> reference ->
advantage -> train -> sync) is step.py; the rollout fleet's remote calls are rollout/fleet.py. Roles are Ray actors
(orchestration/roles.py); the math is in algorithms/."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from posttrain.config import RunConfig, dump_config
from posttrain.errors import PosttrainError
from posttrain.orchestration.recovery import RolesLost
from posttrain.orchestration.reform import NodeWatch, create_roles_or_wait, node_left, reformed, roles_lost
from posttrain.orchestration.watchdog import Watchdog
from posttrain.evals.alarm_wiring import LoopAlarms, after_step_evals_and_alarms
from posttrain.evals.in_loop import InLoopEval
from posttrain.evals.no_signal import NoLearningSignal, NoSignalWatch
from posttrain.models.loading import PromptEncoder, check_model_dir, check_vocab, load_tokenizer
from posttrain.models.lora import check_lora_targets, check_resume_kind
from posttrain.preemption import (ASSUMED_CHECKPOINT_BYTES_PER_S, ClusterStopped, Preempted, StepAbandoned,
                                  StopSignalWatch, StoppedWithoutCheckpoint, cluster_stopped_by,
                                  stop_if_cluster_stopped)
from posttrain.progress import StepProgress
from posttrain.rewards.functions import check_functions, check_resume, record_sources
from posttrain.rewards.verifier import FailureBudget
from posttrain.rollout.fleet import heldout_accuracy, rollout_resync, sync_weights
from posttrain.rollout.lora_serving import check_adapter_serving
from posttrain.rollout.sampler import Cursor, PromptSampler, data_fingerprint
from posttrain.step import TIME_KEYS, run_step
from posttrain.tasks import load_task
from posttrain.tasks.base import answer_needed
from posttrain.tasks.dataset import record_report
from posttrain.tracking import MetricsWriter, open_run_log
from posttrain.tracking.notify import Notifier
from posttrain.training import checkpoint as ckpt

@dataclass
class RunState:
    """The driver's half of a checkpoint (the trainer holds weights, optimizer and its RNG)."""

    step: int = 0
    cursor: Cursor = field(default_factory=Cursor)
    eval_history: list[dict] = field(default_factory=list)
    data_fingerprint: str | None = None  # of the training split the cursor walks (sampler.data_fingerprint)
    reward_functions: dict = field(default_factory=dict)  # name -> {fn, file, sha256, form} (reward.functions)
    data_rows: int | None = None  # rows of that split: says what changed when the fingerprint does
    data_changes: list[dict] = field(default_factory=list)  # resumes onto changed data (--allow-data-change)

    def to_json(self, fingerprint: str) -> dict:
        return {"step": self.step, "cursor": vars(self.cursor), "eval_history": self.eval_history,
                "config_fingerprint": fingerprint, "data_fingerprint": self.data_fingerprint,
                "data_rows": self.data_rows,
                **({"reward_functions": self.reward_functions} if self.reward_functions else {}),
                **({"data_changes": self.data_changes} if self.data_changes else {})}

    @classmethod
    def from_json(cls, d: dict) -> "RunState":
        return cls(d["step"], Cursor(**d["cursor"]), d["eval_history"], d.get("data_fingerprint"),
                   d.get("reward_functions", {}), d.get("data_rows"), d.get("data_changes", []))


def heldout(cfg: RunConfig, roles, encoder: PromptEncoder, task) -> dict:
    """Held-out accuracy by the rollout engines (greedy): {"eval/heldout_accuracy": ...}; for multi-turn runs the
    success of whole episodes, and the tool-call validity too (rollout/episodes.py)."""
    if roles.episodes is not None:
        from posttrain.rollout.episodes import episode_heldout

        got = episode_heldout(roles.episodes, roles.rollout, task, task.heldout, cfg.eval.max_new_tokens,
                              rollout_resync(roles), roles.watchdog)
        out = {"eval/heldout_accuracy": got["success"]}
        if got["tool_call_validity"] is not None:
            out["eval/tool_call_validity"] = got["tool_call_validity"]
        return out
    return {"eval/heldout_accuracy": heldout_accuracy(roles.rollout, encoder, task, task.heldout,
                                                      cfg.eval.max_new_tokens, rollout_resync(roles), roles.watchdog)}


# ---------------------------------------------------------------------------------------------- the run


def prepare_run_dir(cfg: RunConfig, resume: bool) -> Path:
    run_dir = cfg.run_dir
    ckpt_root = run_dir / "checkpoints"
    if not resume and ckpt.list_checkpoints(ckpt_root):
        raise PosttrainError(
            f"run directory {run_dir} already holds checkpoints",
            hint="pass --resume to continue it, or choose another run with name=<new name>",
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise PosttrainError(f"runs_dir: cannot write to {run_dir} ({e.strerror})", hint="choose a writable runs_dir") from None
    for stale in ("metrics.jsonl", "samples.jsonl", "summary.json", "interruptions.jsonl"):
        if not resume and (run_dir / stale).exists():
            (run_dir / stale).unlink()
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return run_dir


def save_checkpoint(cfg: RunConfig, roles, state: RunState) -> Path:
    import ray

    root = cfg.run_dir / "checkpoints"
    tmp = ckpt.begin_checkpoint(root, state.step)
    try:
        ray.get([roles.trainer.save.remote(str(tmp))] + ([roles.critic.save.remote(str(tmp))] if roles.critic else []))
        (tmp / "state.json").write_text(json.dumps(state.to_json(cfg.fingerprint()), indent=1))
        final = ckpt.finalize_checkpoint(tmp, state.step)
    except Exception as e:
        if not ckpt.is_disk_full(e):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise PosttrainError(f"checkpoint at step {state.step}: no space left on the disk of {root}",
                             hint="free disk space, lower checkpoint.keep_last, then continue with --resume") from None
    best = ckpt.best_checkpoint(root, {e["step"]: e["heldout_accuracy"] for e in state.eval_history}) \
        if cfg.checkpoint.keep_best else None
    ckpt.prune_checkpoints(root, cfg.checkpoint.keep_last, protect=(best,) if best else ())
    return final


def timed_checkpoint(cfg: RunConfig, roles, state: RunState, stop_signals: StopSignalWatch) -> Path:
    """save_checkpoint, its duration told to the stop-signal watch (the part of the grace period it keeps back)."""
    t = time.monotonic()
    path = save_checkpoint(cfg, roles, state)
    stop_signals.checkpoint_written(time.monotonic() - t)
    return path


def preempt(cfg: RunConfig, roles, state: RunState, stop_signals: StopSignalWatch, last_ckpt_step: int,
            abandoned: bool = False) -> Preempted:
    """After SIGTERM or Ctrl-C: the checkpoint of the last completed step (written unless it exists), as the
    exception that makes the CLI exit with EXIT_PREEMPTED (EXIT_INTERRUPTED for Ctrl-C)."""
    saved = (save_checkpoint(cfg, roles, state) if last_ckpt_step != state.step
             else ckpt.latest_valid_checkpoint(cfg.run_dir / "checkpoints"))
    return Preempted(saved, state.step, stop_signals.seconds_since(), cfg.checkpoint.grace_seconds,
                     abandoned_step=state.step + 1 if abandoned else None, resume=resume_command(cfg),
                     signal_name=stop_signals.signal_name or "SIGTERM")


def stopped_without_checkpoint(cfg: RunConfig, error: BaseException) -> StoppedWithoutCheckpoint | None:
    """When `error` ended a run that a stop signal stopped where no checkpoint could be written (its own cluster
    went with it, whatever Ray raised then; a second Ctrl-C): the error naming the newest valid checkpoint and the
    command that continues from it. None for any other error."""
    by = cluster_stopped_by()
    if by is not None and not isinstance(error, (Preempted, PosttrainError)):  # those say what happened already
        why, signal_name = str(ClusterStopped(by)), by
    elif isinstance(error, KeyboardInterrupt):
        why, signal_name = "a second Ctrl-C (or one during start-up) stops at once", "SIGINT"
    else:
        return None
    newest = ckpt.latest_valid_checkpoint(cfg.run_dir / "checkpoints", warn=lambda _: None)
    command = resume_command(cfg) if newest else f"posttrain train {(cfg.run_dir / 'config.yaml').resolve()}"
    return StoppedWithoutCheckpoint(why, signal_name, newest, int(newest.name[len(ckpt.PREFIX):]) if newest else None,
                                    command)


def stop_without_signal(cfg: RunConfig, roles, state: RunState, last_ckpt_step: int, message: str) -> NoLearningSignal:
    """The zero-signal alarm's stop (evals/no_signal.py): a checkpoint of the step, and the exception that makes the
    CLI exit with EXIT_NO_SIGNAL."""
    saved = (save_checkpoint(cfg, roles, state) if last_ckpt_step != state.step
             else ckpt.latest_valid_checkpoint(cfg.run_dir / "checkpoints"))
    return NoLearningSignal(f"stopped at step {state.step}: {message}; checkpoint {saved}. To go on anyway, "
                            f"{resume_command(cfg)} alarms.no_signal_action=warn")


def load_resume_state(cfg: RunConfig, warn, data: str | None = None, rows: int | None = None,
                      allow_data_change: bool = False) -> tuple[Path, RunState]:
    """The newest valid checkpoint and its RunState, after the checks that make resuming it safe. `data`/`rows`:
    the training split's fingerprint and row count now; a difference is an error unless `allow_data_change`, which
    records it in the state (and so in every later checkpoint and the summary) instead."""
    root = cfg.run_dir / "checkpoints"
    path = ckpt.latest_valid_checkpoint(root, warn=warn)
    if path is None:
        raise PosttrainError(
            f"--resume: no valid checkpoint under {root}", hint="start the run without --resume",
        )
    check_resume_kind(cfg.model.lora, cfg.model.path, path)  # before the fingerprint: says what differs
    saved = json.loads((path / "state.json").read_text())
    if saved.get("config_fingerprint") != cfg.fingerprint():
        raise PosttrainError(
            f"--resume: the config's model/task/algorithm/seed differ from the checkpoint {path}",
            hint="resume with the run's own config (runs/<name>/config.yaml), changing only train.steps, eval or logging",
        )
    state = RunState.from_json(saved)
    old = saved.get("data_fingerprint")
    if data is not None and old not in (None, data):  # None: a checkpoint from before data fingerprints
        change = data_change(cfg, path, state, data, rows)
        if not allow_data_change:
            raise PosttrainError(
                f"--resume: {change['what']}; its data cursor would skip or repeat samples",
                hint="restore the dataset the run started with, start a new run (name=<new name>) on the new data, "
                     "or pass --allow-data-change to go on from the same cursor over the new data",
            )
        warn(f"--allow-data-change: {change['what']}; going on from data cursor {vars(state.cursor)} over the new "
             "data (recorded in the checkpoints' state.json and summary.json as data_changes)")
        state.data_changes.append({k: v for k, v in change.items() if k != "what"})
    return path, state


def data_change(cfg: RunConfig, path: Path, state: RunState, data: str, rows: int | None) -> dict:
    """What differs between the training data a checkpoint was trained on and the data now, as one sentence
    ("what") and as a record: the step resumed, the old and new fingerprints and row counts."""
    where = f"task.path {cfg.task.path}" if cfg.task.path else f"task {cfg.task.name}"
    count = f"; training rows {state.data_rows} -> {rows}" if state.data_rows is not None and rows is not None else ""
    what = (f"the training data of {where} differ from those the checkpoint {path} was trained on (fingerprint "
            f"{state.data_fingerprint} -> {data}{count})")
    return {"what": what, "step": state.step, "checkpoint": str(path), "data": where,
            "old_fingerprint": state.data_fingerprint, "new_fingerprint": data, "old_rows": state.data_rows,
            "new_rows": rows}


def resume_command(cfg: RunConfig) -> str:
    """The command that continues this run: its own resolved config, which the run dir keeps (prepare_run_dir)."""
    return f"posttrain train {(cfg.run_dir / 'config.yaml').resolve()} --resume"


def train(cfg: RunConfig, *, resume: bool = False, progress: bool = True, allow_data_change: bool = False) -> dict:
    """Runs (or resumes) an online RL run (algorithm.name: grpo, dr_grpo, dapo, rloo, reinforce_pp, ppo) and returns its
    summary (also written to runs/<name>/summary.json). The run's end, whichever it is, goes to `ops.notify`.
    `allow_data_change`: a resume goes on over training data that differ from the checkpoint's (recorded)."""
    notifier = Notifier.from_config(cfg)
    try:
        reforming, nodes = None, NodeWatch()
        for attempt in range(MAX_REFORMS + 1):
            try:
                summary = _train(cfg, resume, progress, notifier.emit, reforming, nodes, allow_data_change)
                break
            except BaseException as e:
                stopped = stopped_without_checkpoint(cfg, e)  # not a lost role to re-form: the run was stopped
                if stopped is not None:
                    raise stopped from None
                if not isinstance(e, RolesLost) or attempt == MAX_REFORMS:
                    raise
                reforming = roles_lost(cfg, e, nodes, notifier.emit)
                resume = reforming["resume"]
        notifier.emit("run_finished", steps=summary["steps"], heldout_before=summary["heldout_accuracy_before"],
                      heldout_after=summary["heldout_accuracy_after"], wall_s=round(summary["train_wall_seconds"], 1),
                      final_checkpoint=summary["final_checkpoint"], stopped_by_alarm=summary.get("stopped_by_alarm"),
                      stopped_at_accuracy=summary.get("stopped_at_accuracy"),
                      best_checkpoint=summary.get("best_checkpoint"))
        return summary
    except Preempted as e:
        notifier.emit("run_preempted", step=e.step, checkpoint=e.checkpoint, abandoned_step=e.abandoned_step,
                      resume=resume_command(cfg))
        raise
    except StoppedWithoutCheckpoint as e:
        notifier.emit("run_preempted", step=e.step, checkpoint=e.newest, abandoned_step=None,
                      resume=resume_command(cfg) if e.newest else None)
        raise
    except BaseException as e:  # whoever is paged needs to know the run is gone
        last = ckpt.list_checkpoints(cfg.run_dir / "checkpoints")
        notifier.emit("run_failed", error=f"{type(e).__name__}: {e}", last_checkpoint=last[-1] if last else None,
                      resume=resume_command(cfg) if last else None)
        raise
    finally:
        notifier.close()  # bounded wait (CLOSE_TIMEOUT_S): the final event is sent before the process exits


MAX_REFORMS = 5  # re-forms of one `train` call; more means something keeps killing the roles: fail, with the error


def _train(cfg: RunConfig, resume: bool, progress: bool, notify, reforming: dict | None = None,
           nodes: NodeWatch | None = None, allow_data_change: bool = False) -> dict:
    import ray

    from posttrain.orchestration.reform import as_roles_lost, dead_roles, lost_errors
    from posttrain.orchestration.roles import destroy_roles, needed_cpus, role_actors, role_names
    from posttrain.orchestration.runtime import embedded_cluster_stopped, start_ray, stop_ray

    if cfg.algorithm.name == "dpo":
        raise PosttrainError("algorithm.name=dpo trains offline from preference pairs, not in the RL loop",
                             hint="run `posttrain dpo cfg.yaml` (or `posttrain train` with the same config)")
    wall0 = time.perf_counter()
    task = load_task(cfg.task, cfg.seed, need_answer=answer_needed(cfg.reward.weights))
    check_model_dir(cfg.model.path)
    if cfg.model.lora is not None:  # here, not first inside the trainer actor
        check_lora_targets(cfg.model.lora, cfg.model.path)
        check_adapter_serving(cfg)  # model.lora.sync=adapter needs vLLM engines
    if cfg.reward.weights.get("rm"):  # here, not first inside the reward-model actor
        from posttrain.rewards.rm_train import check_reward_model_dir

        for i, rm_dir in enumerate([cfg.reward.rm_path, *cfg.reward.rm_ensemble]):
            check_reward_model_dir(rm_dir, "reward.rm_path" if i == 0 else f"reward.rm_ensemble.{i - 1}")
    functions = check_functions(cfg.reward.functions, getattr(task, "columns", ()))  # user code: imported here, before any actor, to fail early
    tokenizer = load_tokenizer(cfg.model.path)
    check_vocab(cfg.model.path, tokenizer)  # here, not first inside a Ray actor
    encoder = PromptEncoder(tokenizer, cfg.model.chat_template)
    episodes = None
    if cfg.rollout.multi_turn:  # environment, tools and chat template checked here, before any actor
        from posttrain.rollout.episodes import EpisodeRunner

        episodes = EpisodeRunner(cfg, tokenizer, cfg.model.path)
        encoder = episodes.prompt_encoder()
    longest = max(len(encoder.encode(p.prompt)) for p in task.train[:2000] + task.heldout)
    if longest + cfg.rollout.max_new_tokens > cfg.rollout.vllm.max_model_len:
        raise PosttrainError(
            f"rollout.vllm.max_model_len={cfg.rollout.vllm.max_model_len} is shorter than the longest prompt "
            f"({longest} tokens) + rollout.max_new_tokens ({cfg.rollout.max_new_tokens})",
            hint="raise rollout.vllm.max_model_len or shorten the prompts",
        )
    run_dir = prepare_run_dir(cfg, resume)
    record_sources(run_dir / "config.yaml", functions)
    ckpt.check_disk_space(run_dir, cfg.model.path)
    bar = StepProgress(cfg.algorithm.name, cfg.train.steps, enabled=progress and cfg.logging.progress,
                       fields=("reward", "acc", "tok/s"))
    data = data_fingerprint(task.train)
    state = RunState(data_fingerprint=data, data_rows=len(task.train))
    resume_path = None
    if resume:
        resume_path, state = load_resume_state(cfg, bar.log, data, len(task.train), allow_data_change)
        state.data_fingerprint, state.data_rows = data, len(task.train)
        check_resume(state.reward_functions, functions, cfg.reward.strict_resume, resume_path, bar.log)
        bar.log(f"resuming from {resume_path} (step {state.step}, data cursor {vars(state.cursor)})")
    state.reward_functions = {n: vars(src) for n, src in functions.items()}
    record_report(task, run_dir, bar.log)  # dataset tasks: runs/<name>/data_report.json, held-out overlap warning
    notify("run_started", step=state.step, steps=cfg.train.steps, resumed_from=resume_path,
           algorithm=cfg.algorithm.name, model=cfg.model.path, config_fingerprint=cfg.fingerprint(), run_dir=run_dir)
    if resume_path is not None and state.step >= cfg.train.steps:
        bar.log(f"run {cfg.name} is already at step {state.step} of train.steps={cfg.train.steps}: nothing to train "
                "(raise train.steps to continue it)")
        bar.close()
        return build_summary(cfg, state, resume_path, time.perf_counter() - wall0)
    writer = open_run_log(cfg, run_dir, resume_from_step=state.step if resume else None)  # metrics.jsonl + logging.sinks
    sample_log = MetricsWriter(run_dir, resume_from_step=state.step if resume else None, filename="samples.jsonl")
    sampler = PromptSampler(task.train, cfg.seed, state.cursor)
    reward_budget = FailureBudget(cfg.reward.max_failure_fraction, cfg.reward.failure_window_steps)
    ahead = None
    if cfg.rollout.async_one_step_off:  # rollout of step t+1 overlaps training of step t
        from posttrain.rollout.one_step_off import OneStepOffRollout

        ahead = OneStepOffRollout(cfg, sampler, encoder)
    alarms = LoopAlarms(cfg, tokenizer, notify)  # reward-hacking alarms (alarms.rules), fed every step
    no_signal = NoSignalWatch(cfg.alarms.no_signal_steps, cfg.alarms.no_signal_action, notify, bar.log)
    in_loop = stopped_by = reached = None

    started_ray = not ray.is_initialized()
    start_ray(cfg.ray, needed_cpus(cfg))
    if nodes is not None:
        nodes.start()  # the nodes this run starts with: a node gone later is a node this run lost
    stop_signals = StopSignalWatch(cfg.checkpoint.grace_seconds, ckpt.checkpoint_bytes_estimate(cfg.model.path)
                                   / ASSUMED_CHECKPOINT_BYTES_PER_S, cluster_stopped=embedded_cluster_stopped,
                                   note=bar.note).install()  # SIGTERM and SIGINT; after ray.init, which sets its own
    roles = None
    try:
        roles = create_roles_or_wait(cfg, reforming, notify, resume_command(cfg))
        roles.episodes = episodes
        fleet = roles.rollout if cfg.rollout.elastic else None  # an ElasticFleet (rollout/elastic.py)
        if cfg.ops.watchdog:  # bounds every remote call of the run (orchestration/watchdog.py)
            roles.watchdog = Watchdog(cfg, roles, notify, bar.log)
        in_loop = (InLoopEval(cfg, roles.evaluator, bar.log, notify, watchdog=roles.watchdog)
                   if roles.evaluator is not None else None)
        alarms.attach(roles, encoder, task.heldout)
        if resume_path is not None:
            ray.get([roles.trainer.load.remote(str(resume_path))]
                    + ([roles.critic.load.remote(str(resume_path))] if roles.critic else []))
            sync_weights(roles)
        if reforming is not None:
            reformed(cfg, roles, reforming, notify)
        if in_loop is not None and resume_path is None and state.step < cfg.train.steps:  # 0 steps: final = start
            in_loop.submit_start(cfg.model.path)  # step 0, the base model; the first steps do not wait for it
        if state.step == 0 and not state.eval_history:
            got = heldout(cfg, roles, encoder, task)
            acc = got["eval/heldout_accuracy"]
            state.eval_history.append({"step": 0, "heldout_accuracy": acc})
            writer.write({"step": 0, **got})
            bar.log(f"held-out accuracy before RL: {acc:.3f} ({len(task.heldout)} problems)")
        bar.update(state.step)
        last_ckpt_step = state.step if resume_path is not None else -1
        while state.step < cfg.train.steps:
            if nodes is not None:
                node_left(cfg, nodes, state.step, notify)
            if fleet is not None:  # extras done starting join with the current weights; one more starts if room
                fleet.grow(roles, state.step + 1, bar.log)
            try:
                if roles.watchdog is not None:
                    roles.watchdog.step = state.step + 1  # the step in progress, as metrics.jsonl numbers it
                stop_signals.begin_step()
                record, samples = (ahead.run_step(state.step, roles) if ahead is not None
                                   else run_step(cfg, state.step, roles, sampler, encoder))
            except StepAbandoned:  # SIGTERM, and the step could not finish within checkpoint.grace_seconds
                raise preempt(cfg, roles, state, stop_signals, last_ckpt_step, abandoned=True) from None
            finally:
                stop_signals.end_step()
            sample_log.write(samples)
            state.step += 1
            state.cursor = ahead.cursor if ahead is not None else sampler.cursor
            record.update(fleet.metrics() if fleet is not None else {})  # fleet/workers, fleet/joined, fleet/left
            if cfg.eval.every and state.step % cfg.eval.every == 0 and state.step < cfg.train.steps:
                t = time.perf_counter()
                got = heldout(cfg, roles, encoder, task)
                acc = got["eval/heldout_accuracy"]
                record.update(got)
                record["time/eval"] = time.perf_counter() - t
                state.eval_history.append({"step": state.step, "heldout_accuracy": acc})
                if cfg.eval.stop_at_accuracy is not None and acc >= cfg.eval.stop_at_accuracy:
                    reached = {"step": state.step, "accuracy": acc, "target": cfg.eval.stop_at_accuracy}
                    bar.log(f"held-out accuracy {acc:.3f} at step {state.step} reached eval.stop_at_accuracy="
                            f"{cfg.eval.stop_at_accuracy}: the run ends here")
            record.update(alarms.observe(record, [s[1] for s in samples["samples"]], [s[2] for s in samples["samples"]]))
            nothing_learned = no_signal.after_step(record, len(samples["samples"]))  # the zero-signal alarm
            writer.write(record)
            reward_budget.check(record, samples)
            bar.update(state.step, reward=record["reward_mean"], acc=record["accuracy"], **{"tok/s": int(record["tokens_per_s"])})
            if cfg.checkpoint.every and state.step % cfg.checkpoint.every == 0 and state.step < cfg.train.steps:
                writer.log_checkpoint(state.step, timed_checkpoint(cfg, roles, state, stop_signals))
                last_ckpt_step = state.step
            if nothing_learned:
                raise stop_without_signal(cfg, roles, state, last_ckpt_step, nothing_learned)
            stopped_by = after_step_evals_and_alarms(cfg, roles, state.step, last_ckpt_step, in_loop, alarms, writer,
                                                     bar.log)
            if stopped_by or reached:
                break
            if stop_signals.requested and state.step < cfg.train.steps:
                raise preempt(cfg, roles, state, stop_signals, last_ckpt_step)
        if not state.eval_history or state.eval_history[-1]["step"] != state.step:
            got = heldout(cfg, roles, encoder, task)
            acc = got["eval/heldout_accuracy"]
            state.eval_history.append({"step": state.step, "heldout_accuracy": acc})
            writer.write({"step": state.step, **got})
        final_ckpt = save_checkpoint(cfg, roles, state) if last_ckpt_step != state.step else ckpt.latest_valid_checkpoint(run_dir / "checkpoints")
        writer.log_checkpoint(state.step, final_ckpt)
        if in_loop is not None:  # the final checkpoint too; waits for the evaluator
            if last_ckpt_step != state.step:  # else submitted when it was saved
                in_loop.submit(state.step, final_ckpt)
            for r in in_loop.finish():
                writer.write(r)
    except lost_errors() as e:  # a role's process or node is gone: train() re-forms the roles from the checkpoint
        stop_if_cluster_stopped()  # unless it went with the whole cluster, after a stop signal
        raise as_roles_lost(e, role_names(roles)) from e
    except ray.exceptions.RayTaskError as e:  # an error inside a task, or one a lost peer caused (a collective)
        stop_if_cluster_stopped()
        dead = dead_roles(role_actors(roles)) if roles is not None else []
        if dead:
            raise RolesLost(", ".join(dead), f"lost ({type(e.cause).__name__} in a peer: "
                                             f"{str(e.cause).splitlines()[0][:200]})") from e
        raise
    finally:
        stop_signals.restore()
        if ahead is not None:
            ahead.close()  # waits for a rollout still in flight before its actors go
        bar.close()
        writer.close()
        sample_log.close()
        if roles is not None and cluster_stopped_by() is None:  # else there is no GCS left to ask
            destroy_roles(roles)
        if episodes is not None:
            episodes.close()
        if started_ray:
            stop_ray(cluster_stopped=cluster_stopped_by() is not None)

    from posttrain.evals.run_plots import plot_run

    summary = build_summary(cfg, state, final_ckpt, time.perf_counter() - wall0)
    summary["curves"] = str(plot_run(run_dir))
    if state.reward_functions:
        summary["reward_functions"] = state.reward_functions
    summary.update(alarms.summary(), stopped_by_alarm=stopped_by, stopped_at_accuracy=reached,
                   **(in_loop.summary() if in_loop else {"best_checkpoint": None}))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def build_summary(cfg: RunConfig, state: RunState, final_ckpt: Path | None, wall: float) -> dict:
    from posttrain.cost.run_accounting import accounting_for_run
    from posttrain.tracking import read_metrics

    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    gaps = [m["logprob_gap_mean"] for m in steps if m.get("logprob_gap_mean") is not None]
    step_total = sum(m["time/step"] for m in steps) or 1e-9
    split = {k: sum(m[f"time/{k}"] for m in steps) / step_total for k in (*TIME_KEYS, "other")}
    return {
        "name": cfg.name,
        "steps": state.step,
        "heldout_accuracy_before": state.eval_history[0]["heldout_accuracy"] if state.eval_history else None,
        "heldout_accuracy_after": state.eval_history[-1]["heldout_accuracy"] if state.eval_history else None,
        "eval_history": state.eval_history,
        "train_wall_seconds": wall,
        "mean_step_seconds": step_total / max(len(steps), 1),
        "step_time_split": split,
        "logprob_gap_mean": sum(gaps) / len(gaps) if gaps else None,
        "final_checkpoint": str(final_ckpt) if final_ckpt else None,
        "accounting": accounting_for_run(cfg, steps),  # device-seconds, busy fraction per role, cost
        **({"data_changes": state.data_changes} if state.data_changes else {}),  # --allow-data-change resumes
    }


def remove_run(run_dir: Path) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)
