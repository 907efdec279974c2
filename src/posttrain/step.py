"""One RL step: rollout and scoring, reference logprobs, advantages, the policy update and the weight sync, with
the step's metrics and where its wall time went (`TIME_KEYS`). The run around it (start, resume, checkpoints,
preemption, finish) is loop.py; one-step-off rollout (one_step_off.py) runs the same pieces overlapped."""

from __future__ import annotations

import time

import torch

from posttrain.algorithms.advantages import compute_advantages, sampled_token_budget, shape_rewards, uses_groups
from posttrain.algorithms.dapo import fill_groups
from posttrain.algorithms.distill import mean_reverse_kl
from posttrain.algorithms.grpo import nonzero_variance_groups
from posttrain.config import RunConfig
from posttrain.models.loading import PromptEncoder
from posttrain.remote.watchdog import watched_get
from posttrain.preemption import point_of_no_return
from posttrain.rollout.fleet import sync_weights
from posttrain.rollout.sampler import PromptSampler
from posttrain.rollout.multi_turn import rollout_multi_turn
from posttrain.rollout.samples import StepSamples
from posttrain.rollout.single_turn import rollout_single_turn
from posttrain.step_metrics import TIME_KEYS, step_record
from posttrain.tasks import Problem
from posttrain.training.trainer import TrainBatch



def rollout_and_score(cfg: RunConfig, step: int, roles, encoder: PromptEncoder, problems: list[Problem],
                      first_index: int, times: dict) -> StepSamples:
    """The step's rollout of `problems`, scored: multi-turn episodes when the run has an environment or tools
    (rollout/multi_turn.py), else one completion per sample (rollout/single_turn.py); `first_index` numbers the
    problems within the step for their seeds. Adds to `times`."""
    rollout = rollout_multi_turn if getattr(roles, "episodes", None) is not None else rollout_single_turn
    return rollout(cfg, step, roles, encoder, problems, first_index, times)


def shaped_rewards(cfg: RunConfig, samples: StepSamples) -> torch.Tensor:
    # Multi-turn: the sampled tokens against the episode's budget, max_new_tokens * max_turns (sampled_token_budget).
    lengths = torch.tensor([sum(m) for m in samples.loss_masks] if samples.loss_masks
                           else [len(c) for c in samples.completions])
    return shape_rewards(cfg.algorithm, torch.tensor(samples.rewards, dtype=torch.float32), lengths,
                         sampled_token_budget(cfg.rollout))


def signal_groups(cfg: RunConfig, samples: StepSamples) -> list[bool]:
    """Per group: does it carry a learning signal? Always True for algorithms without groups (PPO, REINFORCE++)."""
    a = cfg.algorithm
    if not (uses_groups(a) and a.skip_zero_variance_groups):
        return [True] * (len(samples) // a.group_size)
    return nonzero_variance_groups(shaped_rewards(cfg, samples), a.group_size).tolist()


def signal_share(cfg: RunConfig, samples: StepSamples) -> float:
    """Share of the step's groups whose shaped rewards differ (for algorithms without groups: 1.0 when any two
    rewards of the batch differ), whatever algorithm.skip_zero_variance_groups says: the zero-signal alarm's input."""
    if cfg.algorithm.name == "opd":  # the teacher's per-token reverse KL is a signal whatever the rewards are
        return 1.0
    rewards = shaped_rewards(cfg, samples)
    if not uses_groups(cfg.algorithm):
        return float(len(rewards) > 1 and float(rewards.max() - rewards.min()) > 0)
    return float(nonzero_variance_groups(rewards, cfg.algorithm.group_size).float().mean())


def run_step(cfg: RunConfig, step: int, roles, sampler: PromptSampler, encoder: PromptEncoder) -> tuple[dict, dict]:
    """One RL step; returns its metrics (including where its wall time went) and its samples
    (id, completion text, reward) for runs/<name>/samples.jsonl."""
    a = cfg.algorithm
    n = a.group_size
    times = dict.fromkeys(TIME_KEYS, 0.0)
    t_start = time.perf_counter()

    generated = rollout_and_score(cfg, step, roles, encoder, sampler.next_batch(a.prompts_per_step), 0, times)
    signal = signal_groups(cfg, generated)
    train_set = generated.select_groups(signal, n)
    rounds = 1
    # DAPO dynamic sampling: sample more prompts until the batch holds prompts_per_step groups with reward variance.
    while len(train_set) < a.prompts_per_step * n and rounds <= a.dynamic_sampling_rounds:
        missing = a.prompts_per_step - len(train_set) // n
        extra = rollout_and_score(cfg, step, roles, encoder, sampler.next_batch(missing), len(generated) // n, times)
        generated.extend(extra)
        train_set.extend(extra.select_groups(fill_groups(signal_groups(cfg, extra), len(train_set) // n,
                                                         a.prompts_per_step), n))
        rounds += 1
    return finish_step(cfg, step, roles, generated, train_set, rounds, times, t_start)


def finish_step(cfg: RunConfig, step: int, roles, generated: StepSamples, train_set: StepSamples, rounds: int,
                times: dict, t_start: float, sync=sync_weights) -> tuple[dict, dict]:
    """The rest of a step once its samples are scored: reference, advantages, train, `sync(roles)`, and the
    step's metrics and samples (see `run_step`). one_step_off.py calls it with its own rollouts."""
    turn_times = times.pop("generate_turns", [])  # multi-turn: generate seconds per assistant turn
    train_metrics = train_and_sync(cfg, step, roles, train_set, times, sync) if len(train_set) else {}
    hangs = roles.watchdog.hangs if roles.watchdog is not None else None
    return step_record(cfg, step, generated, len(train_set), signal_share(cfg, generated), rounds, train_metrics,
                       times, turn_times, time.perf_counter() - t_start, hangs)


def train_and_sync(cfg: RunConfig, step: int, roles, train_set: StepSamples, times: dict, sync) -> dict:
    """Reference logprobs, advantages, the policy (and critic) update and `sync(roles)` on the kept samples; the
    trainer's numbers. Adds the seconds of each phase to `times`."""
    k_prompts, k_comps = train_set.prompts, train_set.completions
    ref_lp, teacher_lp, calls = None, None, []
    if roles.reference is not None:
        calls.append((roles.reference.logprobs.remote(k_prompts, k_comps), "reference", "reference"))
    elif cfg.model.lora is not None and cfg.algorithm.kl_coef > 0:  # LoRA: the trainer's base model, adapters off
        calls.append((roles.trainer.reference_logprobs.remote(k_prompts, k_comps), "reference", "trainer"))
    teacher = getattr(roles, "teacher", None)
    if teacher is not None:  # opd: the teacher scores the same samples, at the same time as the reference
        calls.append((teacher.logprobs.remote(k_prompts, k_comps), "reference", "teacher"))
    if calls:
        t = time.perf_counter()
        got = watched_get(roles.watchdog, calls)
        teacher_lp = got.pop() if teacher is not None else None
        ref_lp = got[0] if got else None
        times["reference"] = time.perf_counter() - t
    adv, token_stats = step_advantages(cfg, roles, train_set, ref_lp, teacher_lp)
    batch = TrainBatch(
        prompts=k_prompts, completions=k_comps, advantages=adv, engine_logprobs=train_set.engine_logprobs,
        ref_logprobs=ref_lp, loss_masks=train_set.loss_masks or None, sample_ids=train_set.sample_ids, step=step,
    )
    t = time.perf_counter()
    point_of_no_return()  # a SIGTERM from here on lets the step finish (preemption.py)
    calls = [(roles.trainer.train_step.remote(batch), "train", "trainer")]
    if roles.critic is not None:
        calls.append((roles.critic.train_step.remote(k_prompts, k_comps, token_stats.pop("returns"),
                                                     token_stats.pop("values"), train_set.loss_masks or None),
                      "train", "critic"))
    train_metrics: dict = {}
    for part in watched_get(roles.watchdog, calls):
        train_metrics.update(part)
    train_metrics.update(token_stats)
    times["train"] = time.perf_counter() - t
    t = time.perf_counter()
    sync(roles)
    times["sync"] = time.perf_counter() - t
    return train_metrics


def step_advantages(cfg: RunConfig, roles, batch: StepSamples, ref_lp, teacher_lp=None) -> tuple[list, dict]:
    """Advantages for the training samples through algorithms.advantages, one per sample or one per token, and the
    extra per-step numbers: the KL when it is part of the reward, PPO's critic values and returns, and (opd, with
    the teacher's logprobs `teacher_lp`) the mean per-token reverse KL to the teacher, distill/reverse_kl."""
    from posttrain.training.trainer import pad_rows

    a = cfg.algorithm
    rewards = shaped_rewards(cfg, batch)
    stats: dict = {"shaped_reward_mean": float(rewards.mean())}
    if uses_groups(a):
        return compute_advantages(a, rewards).advantages.tolist(), stats
    lengths = [len(c) for c in batch.completions]
    T = max(1, max(lengths))
    # Multi-turn: the loss mask, so environment and tool tokens get no KL, no reward and no advantage (GAE and the
    # returns run over the sampled tokens only: algorithms/ppo.gae); single-turn: every completion token.
    mask = pad_rows(batch.loss_masks or [[1.0] * k for k in lengths], T)
    logprobs = pad_rows(batch.engine_logprobs, T)  # pi_old for the KL in the reward (gap to the trainer's: ~1e-7)
    ref = pad_rows(ref_lp, T) if ref_lp is not None else None
    values = None
    if roles.critic is not None:
        call = roles.critic.values.remote(batch.prompts, batch.completions, batch.loss_masks or None)
        stats["values"] = watched_get(roles.watchdog, [(call, "values", "critic")])[0]
        values = pad_rows(stats["values"], T)
    teacher = pad_rows(teacher_lp, T) if teacher_lp is not None else None
    out = compute_advantages(a, rewards, mask=mask, logprobs=logprobs, ref_logprobs=ref, values=values,
                             teacher_logprobs=teacher, distill=cfg.distill)
    if teacher is not None:
        stats["distill/reverse_kl"] = mean_reverse_kl(logprobs, teacher, mask)
    if ref is not None:
        stats["kl"] = float(((logprobs - ref) * mask).sum() / mask.sum())
    if out.returns is not None:
        stats["returns"] = [out.returns[i, :k].tolist() for i, k in enumerate(lengths)]
    return [out.advantages[i, :k].tolist() for i, k in enumerate(lengths)], stats
