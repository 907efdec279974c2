"""The step's metrics record and its samples record, built from what a step produced: the scored rollouts, the
trainer's and critic's numbers, and where the wall time went. Pure: no Ray, no I/O."""

from __future__ import annotations

import torch

from posttrain.config import RunConfig
from posttrain.rewards.functions import function_failure_counts
from posttrain.rewards.scoring import component_means
from posttrain.rewards.verifier import failure_counts
from posttrain.rollout.episode_metrics import episode_metrics
from posttrain.rollout.samples import StepSamples

TIME_KEYS = ("generate", "reward", "reference", "train", "sync")
# Trainer numbers every record carries (None when the step trained nothing), and those only some algorithms give.
TRAIN_KEYS = ("entropy", "clip_fraction", "loss", "grad_norm", "lr", "logprob_gap_mean", "logprob_gap_max")
OPTIONAL_TRAIN_KEYS = ("value_loss", "value_clip_fraction", "shaped_reward_mean", "distill/reverse_kl", "update_ratio")


def generated_tokens(generated: StepSamples) -> int:
    """Sampled tokens (a multi-turn completion also holds the environment's and tools' tokens, which the loss
    mask leaves out)."""
    if generated.loss_masks:
        return sum(sum(m) for m in generated.loss_masks)
    return sum(len(c) for c in generated.completions)


def truncated_share(generated: StepSamples, max_new_tokens: int) -> float | None:
    """Share of completions that reached rollout.max_new_tokens (cut at the length limit); None for multi-turn
    completions, whose tokens hold several turns and the environment's."""
    if generated.loss_masks or not generated.completions:
        return None
    return sum(len(c) >= max_new_tokens for c in generated.completions) / len(generated.completions)


def step_record(cfg: RunConfig, step: int, generated: StepSamples, kept: int, signal_share: float, rounds: int,
                train_metrics: dict, times: dict, turn_times: list[float], total_s: float,
                hangs: int | None) -> tuple[dict, dict]:
    """The step's metrics record and its samples record. `kept`: samples trained on; `times`: seconds per phase
    (TIME_KEYS, plus tools/environment); `turn_times`: multi-turn generate seconds per assistant turn; `hangs`:
    the watchdog's count so far in this process, None without a watchdog."""
    rewards = torch.tensor(generated.rewards, dtype=torch.float32)
    gen_tokens = generated_tokens(generated)
    record = {
        "step": step + 1,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "accuracy": float((torch.tensor(generated.verifier) >= 1.0).float().mean()),
        "response_length": gen_tokens / len(generated),
        "truncated_share": truncated_share(generated, cfg.rollout.max_new_tokens),
        "kept_groups": kept // cfg.algorithm.group_size,
        "signal_share": signal_share,
        "rollout_rounds": rounds,
        "reward_failures": sum(err is not None for err in generated.errors),
        **failure_counts(generated.errors),
        "tokens_per_s": gen_tokens / max(times["generate"], 1e-9),
        "kl": train_metrics.get("kl", 0.0),
        **{key: train_metrics.get(key) for key in TRAIN_KEYS},
    }
    record.update({key: train_metrics[key] for key in OPTIONAL_TRAIN_KEYS if key in train_metrics})
    # engine-vs-trainer mismatch (algorithms/rollout_correction.py): every step that trained, whatever the mode
    record.update({key: value for key, value in train_metrics.items() if key.startswith("mismatch/")})
    record.update(component_means({k: [c[k] for c in generated.components] for k in generated.components[0]}))
    if cfg.reward.functions:
        record.update(function_failure_counts([f.name for f in cfg.reward.functions], generated.function_errors))
    samples = {"step": step + 1,
               "samples": [[sid, it[3], float(r)] for sid, it, r in zip(generated.sample_ids, generated.items, rewards)],
               "reward_errors": {sid: err for sid, err in zip(generated.sample_ids, generated.errors) if err is not None}}
    if hangs is not None:
        record["hangs"] = hangs  # so far in this process (runs/<name>/interruptions.jsonl: each one)
    if generated.episodes:  # multi-turn: turns, tool calls, tool errors by kind, end reasons, tokens
        record.update(episode_metrics(generated.episodes))
        samples["episodes"] = dict(zip(generated.sample_ids, generated.episodes))
        record.update({f"time/generate_turn{k + 1}": s for k, s in enumerate(turn_times)})
    for k in (*TIME_KEYS, "tools", "environment"):
        if k in times:
            record[f"time/{k}"] = times[k]
    record["time/other"] = max(0.0, total_s - sum(times.values()))
    record["time/step"] = total_s
    return record, samples
