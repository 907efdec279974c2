"""The run's lifecycle: start (run dir, Ray, roles), resume, the steps, held-out evaluation, atomic checkpoints
every k steps, preemption on SIGTERM, and the summary at the finish. One step (rollout -> reward -> reference ->
advantage -> train -> sync) is step.py; the rollout fleet's remote calls are rollout/fleet.py. Roles are Ray actors
(orchestration/roles.py); the math is in algorithms/."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from posttrain import checkpoint as ckpt
from posttrain.config import RunConfig
from posttrain.errors import PosttrainError
from posttrain.evals.alarm_wiring import LoopAlarms, after_step_evals_and_alarms
from posttrain.evals.in_loop import InLoopEval
from posttrain.evals.no_signal import NoLearningSignal, NoSignalWatch
from posttrain.evals.progress import NoProgress, ProgressWatch
from posttrain.models.loading import PromptEncoder, check_model_dir, check_vocab, load_tokenizer
from posttrain.models.lora import check_lora_targets
from posttrain.models.tokenizer_match import check_teacher
from posttrain.one_step_off import OneStepOffRollout
from posttrain.orchestration.reform import (NodeWatch, Reform, create_roles_or_wait, node_left, reformed,
                                            roles_lost)
from posttrain.orchestration.roles import Roles, destroy_roles, role_actors, role_names
from posttrain.preemption import (ASSUMED_CHECKPOINT_BYTES_PER_S, ClusterStopped, Preempted, StepAbandoned,
                                  StopSignalWatch, StoppedWithoutCheckpoint, cluster_stopped_by,
                                  stop_if_cluster_stopped)
from posttrain.progress import StepProgress
from posttrain.remote.watchdog import RolesLost, Watchdog
from posttrain.rewards.functions import check_functions, check_resume, record_sources
from posttrain.rewards.reward_model import check_reward_model_dir
from posttrain.rewards.verifier import FailureBudget
from posttrain.rollout.fleet import heldout_accuracy, rollout_resync, sync_weights
from posttrain.rollout.lora_serving import check_adapter_serving
from posttrain.rollout.sampler import PromptSampler, data_fingerprint
from posttrain.run_files import (RunState, build_summary, load_resume_state, prepare_run_dir,
                                 resume_command, save_checkpoint)
from posttrain.step import run_step
from posttrain.stop_guard import StuckStopGuard
from posttrain.tasks import load_task
from posttrain.tasks.base import answer_needed
from posttrain.tasks.dataset import record_report
from posttrain.topology.placement import needed_cpus
from posttrain.tracking import MetricsWriter, open_run_log, read_metrics
from posttrain.tracking.notify import Notifier


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


def report_stuck_stop(cfg: RunConfig, signal_name: str, notify) -> None:
    """stop_guard.py's last resort (the main thread is blocked in C code): the message and the notification the
    run's end would have given, before the guard ends the process."""
    stopped = stopped_without_checkpoint(cfg, ClusterStopped(signal_name))
    os.write(sys.stderr.fileno(), f"{stopped}\n".encode())  # not through sys.stderr: the main thread may hold it
    notify_stopped_without_checkpoint(cfg, stopped, notify)


def notify_stopped_without_checkpoint(cfg: RunConfig, stopped: StoppedWithoutCheckpoint, notify) -> None:
    notify("run_preempted", step=stopped.step, checkpoint=stopped.newest, abandoned_step=None,
           resume=resume_command(cfg) if stopped.newest else None)


def stop_by_monitor(cfg: RunConfig, roles, state: RunState, last_ckpt_step: int, message: str,
                    error: type[Exception], action_key: str) -> Exception:
    """The stop of the zero-signal alarm (evals/no_signal.py: NoLearningSignal, EXIT_NO_SIGNAL) or of the learning
    monitor (evals/progress.py: NoProgress, EXIT_NO_PROGRESS): a checkpoint of the step, and the exception that
    makes the CLI exit with the monitor's code. `action_key`: the alarms key that lets the run go on."""
    saved = (save_checkpoint(cfg, roles, state) if last_ckpt_step != state.step
             else ckpt.latest_valid_checkpoint(cfg.run_dir / "checkpoints"))
    return error(f"stopped at step {state.step}: {message}; checkpoint {saved}. To go on anyway, "
                 f"{resume_command(cfg)} alarms.{action_key}=warn")


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
                resume = reforming.resume
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
        notify_stopped_without_checkpoint(cfg, e, notifier.emit)
        raise
    except BaseException as e:  # whoever is paged needs to know the run is gone
        last = ckpt.list_checkpoints(cfg.run_dir / "checkpoints")
        notifier.emit("run_failed", error=f"{type(e).__name__}: {e}", last_checkpoint=last[-1] if last else None,
                      resume=resume_command(cfg) if last else None)
        raise
    finally:
        notifier.close()  # bounded wait (CLOSE_TIMEOUT_S): the final event is sent before the process exits


MAX_REFORMS = 5  # re-forms of one `train` call; more means something keeps killing the roles: fail, with the error


@dataclass(frozen=True)
class Prepared:
    """What preflight checked and built before any actor starts."""

    task: Any
    functions: dict  # reward.functions: name -> its source (file, sha256, form)
    tokenizer: Any
    encoder: PromptEncoder
    episodes: Any | None  # rollout/episodes.EpisodeRunner for multi-turn runs


@dataclass
class OpenRun:
    """A run between `open_run` and `finish`: its directory, state, logs and the driver-side pieces of the loop.
    `roles`, `in_loop` and the last checkpoint's step change as the run goes."""

    cfg: RunConfig
    prepared: Prepared
    run_dir: Path
    bar: StepProgress
    state: RunState
    resume_path: Path | None
    writer: Any = None  # metrics.jsonl + logging.sinks
    sample_log: MetricsWriter | None = None
    sampler: PromptSampler | None = None
    ahead: Any | None = None  # one_step_off.OneStepOffRollout
    alarms: LoopAlarms | None = None
    no_signal: NoSignalWatch | None = None
    progress: ProgressWatch | None = None  # the learning monitor
    reward_budget: FailureBudget | None = None
    roles: Roles | None = None
    in_loop: InLoopEval | None = None
    last_ckpt_step: int = -1
    stopped_by: Any = None  # the alarm that stopped the run
    reached: dict | None = None  # eval.stop_at_accuracy reached

    @property
    def already_done(self) -> bool:
        return self.resume_path is not None and self.state.step >= self.cfg.train.steps


def _train(cfg: RunConfig, resume: bool, progress: bool, notify, reforming: Reform | None = None,
           nodes: NodeWatch | None = None, allow_data_change: bool = False) -> dict:
    """One attempt at the run: preflight, open the run, start Ray and the roles, run the steps, finish."""
    import ray

    from posttrain.orchestration.runtime import embedded_cluster_stopped, start_ray

    wall0 = time.perf_counter()
    run = open_run(cfg, preflight(cfg), resume, progress, allow_data_change, notify)
    if run.already_done:
        run.bar.log(f"run {cfg.name} is already at step {run.state.step} of train.steps={cfg.train.steps}: nothing "
                    "to train (raise train.steps to continue it)")
        run.bar.close()
        return build_summary(cfg, run.state, run.resume_path, time.perf_counter() - wall0)
    open_step_loop(run, resume, notify)
    started_ray = not ray.is_initialized()
    start_ray(cfg.ray, needed_cpus(cfg))
    if nodes is not None:
        nodes.start()  # the nodes this run starts with: a node gone later is a node this run lost
    stop_signals = StopSignalWatch(cfg.checkpoint.grace_seconds, ckpt.checkpoint_bytes_estimate(cfg.model.path)
                                   / ASSUMED_CHECKPOINT_BYTES_PER_S, cluster_stopped=embedded_cluster_stopped,
                                   note=run.bar.note).install()  # SIGTERM and SIGINT; after ray.init, which sets its own
    guard = StuckStopGuard(stop_signals, lambda signal_name: report_stuck_stop(cfg, signal_name, notify)).start()
    try:
        start_roles(run, reforming, notify)
        run_steps(run, stop_signals, nodes, notify)
        final_ckpt = finish(run)
    except BaseException as e:
        raise_roles_lost_if_lost(e, run.roles)
        raise
    finally:
        try:
            close_run(run, stop_signals, started_ray)
        finally:
            guard.close()
    return summarize(run, final_ckpt, wall0)


def preflight(cfg: RunConfig) -> Prepared:
    """Every check that can fail on the user's files, before any actor starts (an actor's error is a remote one)."""
    if cfg.algorithm.name == "dpo":
        raise PosttrainError("algorithm.name=dpo trains offline from preference pairs, not in the RL loop",
                             hint="run `posttrain dpo cfg.yaml` (or `posttrain train` with the same config)")
    task = load_task(cfg.task, cfg.seed, need_answer=answer_needed(cfg.reward.weights))
    check_model_dir(cfg.model.path)
    if cfg.model.lora is not None:
        check_lora_targets(cfg.model.lora, cfg.model.path)
        check_adapter_serving(cfg)  # model.lora.sync=adapter needs vLLM engines
    if cfg.reward.weights.get("rm"):
        for i, rm_dir in enumerate([cfg.reward.rm_path, *cfg.reward.rm_ensemble]):
            check_reward_model_dir(rm_dir, "reward.rm_path" if i == 0 else f"reward.rm_ensemble.{i - 1}")
    functions = check_functions(cfg.reward.functions, getattr(task, "columns", ()))  # user code, imported here
    tokenizer = load_tokenizer(cfg.model.path)
    check_vocab(cfg.model.path, tokenizer)
    if cfg.distill.teacher:  # opd: the teacher scores the student's ids, so the tokenizers must agree
        check_teacher(cfg.model.path, tokenizer, cfg.distill.teacher)
    encoder = PromptEncoder(tokenizer, cfg.model.chat_template)
    episodes = None
    if cfg.rollout.agent is not None:  # the agent's command and the endpoint's port (docs/agents.md)
        from posttrain.rollout.agent_episodes import AgentEpisodeRunner

        episodes = AgentEpisodeRunner(cfg, tokenizer, cfg.model.path)
        encoder = episodes.prompt_encoder()
    elif cfg.rollout.multi_turn:  # environment, tools and chat template
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
    return Prepared(task, functions, tokenizer, encoder, episodes)


def open_run(cfg: RunConfig, prepared: Prepared, resume: bool, progress: bool, allow_data_change: bool,
             notify) -> OpenRun:
    """The run directory, the progress line and the run's state: new, or read from the newest valid checkpoint."""
    task, functions = prepared.task, prepared.functions
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
    return OpenRun(cfg, prepared, run_dir, bar, state, resume_path)


def open_step_loop(run: OpenRun, resume: bool, notify) -> None:
    """The driver-side pieces the steps use: logs, the prompt sampler, one-step-off rollout, alarms."""
    cfg, prepared, state = run.cfg, run.prepared, run.state
    from_step = state.step if resume else None
    run.writer = open_run_log(cfg, run.run_dir, resume_from_step=from_step)
    run.sample_log = MetricsWriter(run.run_dir, resume_from_step=from_step, filename="samples.jsonl")
    run.sampler = PromptSampler(prepared.task.train, cfg.seed, state.cursor)
    run.reward_budget = FailureBudget(cfg.reward.max_failure_fraction, cfg.reward.failure_window_steps)
    if cfg.rollout.asynchronous:  # the next steps' rollouts overlap training (rollout.max_staleness)
        run.ahead = OneStepOffRollout(cfg, run.sampler, prepared.encoder)
    run.alarms = LoopAlarms(cfg, prepared.tokenizer, notify)  # reward-hacking alarms (alarms.rules), fed every step
    run.no_signal = NoSignalWatch(cfg.alarms.no_signal_steps, cfg.alarms.no_signal_action, notify, run.bar.log)
    run.progress = ProgressWatch(cfg.alarms.no_progress_steps, cfg.alarms.no_progress_action, notify, run.bar.log)
    if resume:
        run.progress.replay(read_metrics(run.run_dir))  # the steps before the checkpoint, as the resume left them


def start_roles(run: OpenRun, reforming: Reform | None, notify) -> None:
    """The roles (waiting for capacity when re-forming), the watchdog, the in-loop evaluator, the resumed weights,
    and the held-out accuracy before RL."""
    import ray

    cfg, prepared, state = run.cfg, run.prepared, run.state
    run.roles = create_roles_or_wait(cfg, reforming, notify, resume_command(cfg))
    watchdog = None
    if cfg.ops.watchdog:  # bounds every remote call of the run (remote/watchdog.py); reads run.roles when it looks
        watchdog = Watchdog(cfg, lambda: role_actors(run.roles), notify, run.bar.log)
    run.roles = roles = replace(run.roles, episodes=prepared.episodes, watchdog=watchdog)
    if roles.evaluator is not None:
        run.in_loop = InLoopEval(cfg, roles.evaluator, run.bar.log, notify, watchdog=roles.watchdog)
    run.alarms.attach(roles, prepared.encoder, prepared.task.heldout)
    if run.resume_path is not None:
        ray.get([roles.trainer.load.remote(str(run.resume_path))]
                + ([roles.critic.load.remote(str(run.resume_path))] if roles.critic else []))
        sync_weights(roles)
        run.last_ckpt_step = state.step
    if reforming is not None:
        reformed(cfg, roles, reforming, notify)
    if run.in_loop is not None and run.resume_path is None and state.step < cfg.train.steps:  # 0 steps: final = start
        run.in_loop.submit_start(cfg.model.path)  # step 0, the base model; the first steps do not wait for it
    if state.step == 0 and not state.eval_history:
        got = record_heldout(run)
        run.writer.write({"step": 0, **got})
        run.bar.log(f"held-out accuracy before RL: {got['eval/heldout_accuracy']:.3f} "
                    f"({len(prepared.task.heldout)} problems)")
    run.bar.update(state.step)


def record_heldout(run: OpenRun) -> dict:
    """Held-out accuracy of the current weights at `run.state.step`, added to the eval history."""
    got = heldout(run.cfg, run.roles, run.prepared.encoder, run.prepared.task)
    run.state.eval_history.append({"step": run.state.step, "heldout_accuracy": got["eval/heldout_accuracy"]})
    return got


def run_steps(run: OpenRun, stop_signals: StopSignalWatch, nodes: NodeWatch | None, notify) -> None:
    """Steps until train.steps, an alarm's stop, eval.stop_at_accuracy, or a stop signal (a checkpoint, then
    Preempted)."""
    cfg, roles, state = run.cfg, run.roles, run.state
    fleet = roles.rollout if cfg.rollout.elastic else None  # an ElasticFleet (rollout/elastic.py)
    while state.step < cfg.train.steps:
        if nodes is not None:
            node_left(cfg, nodes, state.step, notify)
        if fleet is not None:  # extras done starting join with the current weights; one more starts if room
            fleet.grow(roles, state.step + 1, run.bar.log)
        record, samples = one_step(run, stop_signals)
        record.update(fleet.metrics() if fleet is not None else {})  # fleet/workers, fleet/joined, fleet/left
        if cfg.eval.every and state.step % cfg.eval.every == 0 and state.step < cfg.train.steps:
            record.update(periodic_heldout(run))
        record.update(run.alarms.observe(record, [s[1] for s in samples["samples"]],
                                         [s[2] for s in samples["samples"]]))
        nothing_learned = run.no_signal.after_step(record, len(samples["samples"]))  # the zero-signal alarm
        not_learning = run.progress.after_step(record)  # the learning monitor
        run.writer.write(record)
        run.reward_budget.check(record, samples)
        run.bar.update(state.step, reward=record["reward_mean"], acc=record["accuracy"],
                       **{"tok/s": int(record["tokens_per_s"])})
        if cfg.checkpoint.every and state.step % cfg.checkpoint.every == 0 and state.step < cfg.train.steps:
            run.writer.log_checkpoint(state.step, timed_checkpoint(cfg, roles, state, stop_signals))
            run.last_ckpt_step = state.step
        if nothing_learned:
            raise stop_by_monitor(cfg, roles, state, run.last_ckpt_step, nothing_learned, NoLearningSignal,
                                  "no_signal_action")
        if not_learning:
            raise stop_by_monitor(cfg, roles, state, run.last_ckpt_step, not_learning, NoProgress,
                                  "no_progress_action")
        run.stopped_by = after_step_evals_and_alarms(cfg, roles, state.step, run.last_ckpt_step, run.in_loop,
                                                     run.alarms, run.writer, run.bar.log)
        if run.stopped_by or run.reached:
            break
        if stop_signals.requested and state.step < cfg.train.steps:
            raise preempt(cfg, roles, state, stop_signals, run.last_ckpt_step)


def one_step(run: OpenRun, stop_signals: StopSignalWatch) -> tuple[dict, dict]:
    """One step (step.py, or one-step-off rollout's), its samples logged and the state advanced."""
    cfg, roles, state = run.cfg, run.roles, run.state
    try:
        if roles.watchdog is not None:
            roles.watchdog.step = state.step + 1  # the step in progress, as metrics.jsonl numbers it
        stop_signals.begin_step()
        record, samples = (run.ahead.run_step(state.step, roles) if run.ahead is not None
                           else run_step(cfg, state.step, roles, run.sampler, run.prepared.encoder))
    except StepAbandoned:  # SIGTERM, and the step could not finish within checkpoint.grace_seconds
        raise preempt(cfg, roles, state, stop_signals, run.last_ckpt_step, abandoned=True) from None
    finally:
        stop_signals.end_step()
    run.sample_log.write(samples)
    state.step += 1
    state.cursor = run.ahead.cursor if run.ahead is not None else run.sampler.cursor
    return record, samples


def periodic_heldout(run: OpenRun) -> dict:
    """The eval.every held-out accuracy for the step's record; notes when eval.stop_at_accuracy is reached."""
    cfg, step = run.cfg, run.state.step
    t = time.perf_counter()
    got = record_heldout(run)
    acc = got["eval/heldout_accuracy"]
    if cfg.eval.stop_at_accuracy is not None and acc >= cfg.eval.stop_at_accuracy:
        run.reached = {"step": step, "accuracy": acc, "target": cfg.eval.stop_at_accuracy}
        run.bar.log(f"held-out accuracy {acc:.3f} at step {step} reached eval.stop_at_accuracy="
                    f"{cfg.eval.stop_at_accuracy}: the run ends here")
    return {**got, "time/eval": time.perf_counter() - t}


def finish(run: OpenRun) -> Path:
    """The final held-out accuracy and checkpoint, and the in-loop evaluator's last results; the final
    checkpoint's path."""
    cfg, roles, state = run.cfg, run.roles, run.state
    if not state.eval_history or state.eval_history[-1]["step"] != state.step:
        run.writer.write({"step": state.step, **record_heldout(run)})
    if run.last_ckpt_step != state.step:
        final_ckpt = save_checkpoint(cfg, roles, state)
    else:
        final_ckpt = ckpt.latest_valid_checkpoint(run.run_dir / "checkpoints")
    run.writer.log_checkpoint(state.step, final_ckpt)
    if run.in_loop is not None:  # the final checkpoint too; waits for the evaluator
        if run.last_ckpt_step != state.step:  # else submitted when it was saved
            run.in_loop.submit(state.step, final_ckpt)
        for r in run.in_loop.finish():
            run.writer.write(r)
    return final_ckpt


def raise_roles_lost_if_lost(error: BaseException, roles: Roles | None) -> None:
    """A role's process or node gone (or an error a lost peer caused in a collective) becomes RolesLost, which
    train() answers by re-forming the roles from the checkpoint, unless the whole cluster went after a stop
    signal. Anything else returns, to be raised as it is."""
    import ray

    from posttrain.orchestration.reform import as_roles_lost, dead_roles, lost_errors

    if isinstance(error, lost_errors()):
        stop_if_cluster_stopped()
        raise as_roles_lost(error, role_names(roles)) from error
    if isinstance(error, ray.exceptions.RayTaskError):
        stop_if_cluster_stopped()
        dead = dead_roles(role_actors(roles)) if roles is not None else []
        if dead:
            raise RolesLost(", ".join(dead), f"lost ({type(error.cause).__name__} in a peer: "
                                             f"{str(error.cause).splitlines()[0][:200]})") from error


def close_run(run: OpenRun, stop_signals: StopSignalWatch, started_ray: bool) -> None:
    """Whatever the run's end: signal handlers back, one-step-off's rollout in flight waited for, logs closed,
    the roles and (if this run started it) Ray stopped."""
    from posttrain.orchestration.runtime import stop_ray

    stop_signals.restore()
    if run.ahead is not None:
        run.ahead.close()  # waits for a rollout still in flight before its actors go
    run.bar.close()
    run.writer.close()
    run.sample_log.close()
    if run.roles is not None and cluster_stopped_by() is None:  # else there is no GCS left to ask
        destroy_roles(run.roles)
    if run.prepared.episodes is not None:
        run.prepared.episodes.close()
    if started_ray:
        stop_ray(cluster_stopped=cluster_stopped_by() is not None)


def summarize(run: OpenRun, final_ckpt: Path, wall0: float) -> dict:
    """runs/<name>/summary.json: the run's numbers, its curves picture, alarms and the in-loop evals' best."""
    from posttrain.evals.run_plots import plot_run

    summary = build_summary(run.cfg, run.state, final_ckpt, time.perf_counter() - wall0)
    summary["curves"] = str(plot_run(run.run_dir))
    if run.state.reward_functions:
        summary["reward_functions"] = run.state.reward_functions
    summary.update(run.alarms.summary(), **run.progress.summary(), stopped_by_alarm=run.stopped_by,
                   stopped_at_accuracy=run.reached,
                   **(run.in_loop.summary() if run.in_loop else {"best_checkpoint": None}))
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


