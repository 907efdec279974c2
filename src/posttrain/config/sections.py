"""The run config's sections, RunConfig at their top: the keys of the one YAML file, their types, defaults, limits
and meanings. Reading, dotted overrides and validation errors are in config/io.py.

    posttrain train run.yaml algorithm.kl_coef=0.02 rollout.num_workers=2
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from posttrain.config.base import _Section
from posttrain.config.distill import DistillConfig
from posttrain.config.lora import AdapterConfig, LoraConfig
from posttrain.config.ops import OpsConfig
from posttrain.config.reward import RewardConfig
from posttrain.config.rollout import RolloutConfig
from posttrain.config.serve import ServeConfig


class ModelConfig(_Section):
    path: str = Field("runs/demo/sft-model", description="Local HF causal-LM directory (weights + tokenizer).")
    dtype: Literal["float32", "bfloat16", "auto", "float16", "float64"] = Field(
        "float32", description="Weights dtype for trainer, reference and engines. bfloat16 needs a CPU with native "
        "bfloat16 (AVX512-BF16 or AMX; refused at start elsewhere) and trains pure bfloat16 weights (see "
        "docs/real-models.md); auto: bfloat16 for an engine on a CUDA GPU, float32 on CPU, decided where each role's "
        "weights land. float64 is for numerics checks (tests compare two computation paths where no CPU kernel "
        "choice can matter): the trainer, reference, critic and the hf engine take it; vLLM does not.",
    )
    chat_template: Literal["auto", "never"] = Field(
        "auto", description="auto: use the tokenizer's chat template when it has one; never: plain prompts."
    )
    lora: LoraConfig | None = Field(
        None, description="LoRA adapters instead of full fine-tuning (absent = full). The keys below apply when set.",
    )


class TaskConfig(_Section):
    name: str = Field(
        "addition", description="Built-in task (addition, sorting, tool_arithmetic: the tools demo's), or 'dataset' "
        "(alias 'jsonl'): the user dataset at `path`.",
    )
    path: str | None = Field(
        None, description="The dataset when name is 'dataset'/'jsonl': a .parquet or .csv file, a directory written "
        "by datasets' save_to_disk, or JSON lines (any other suffix). See docs/datasets.md.",
    )
    prompt_column: str = Field(
        "prompt", description="Dataset column holding the prompt: a string or a chat-format list of {role, content} "
        "messages (rendered with the tokenizer's chat template).",
    )
    answer_column: str = Field(
        "answer", description="Dataset column holding the answer; needed only when the verifier is a reward source "
        "(reward.weights.verifier) or for SFT. Every column besides prompt, answer and id goes to reward functions.",
    )
    system_prompt: str | None = Field(
        None, description="Dataset: a system message put before every prompt (a row's own system message wins); "
        "without a chat template it is joined to the prompt with a space.",
    )
    train_size: int = Field(20000, gt=0, description="Number of training problems generated (built-in tasks).")
    heldout_size: int = Field(500, gt=0, description="Held-out problems, disjoint from every training problem.")
    heldout_path: str | None = Field(
        None, description="Dataset: a separate held-out file (same formats and columns); all of `path` then trains.",
    )
    heldout_fraction: float | None = Field(
        None, gt=0, lt=1, description="Dataset: hold out this seeded share of `path`'s rows (instead of heldout_size).",
    )
    strict_heldout: bool = Field(
        False, description="Dataset: refuse to start when a held-out prompt also occurs in the training data (exact "
        "text after whitespace normalisation); false: warn. The count is in runs/<name>/data_report.json.",
    )
    max_digits: int = Field(3, ge=1, le=8, description="Longest operand (addition); sorting lists are up to max_digits+2 long.")
    reward: Literal["exact", "digits", "last_number", "python"] = Field(
        "exact",
        description="exact: 1 for the exact answer, else 0; digits: share of answer digits right (aligned from the "
        "right, 1 only for the exact answer); last_number: 1 when the completion's last number is the answer ('The "
        "answer is 12.'); python: the completion is a program run in the sandbox "
        "(sandbox.py), 1 when it prints the answer. Held-out accuracy counts reward 1 as solved.",
    )

    @model_validator(mode="after")
    def _check(self) -> "TaskConfig":
        if self.heldout_path is not None and self.heldout_fraction is not None:
            raise ValueError("task.heldout_path and task.heldout_fraction are both set; the held-out split comes "
                             "from one of them: drop the other")
        dataset_only = [k for k in ("path", "heldout_path", "heldout_fraction", "system_prompt")
                        if getattr(self, k) is not None]
        if dataset_only and self.name in ("addition", "sorting", "tool_arithmetic"):
            raise ValueError(f"task.{dataset_only[0]} is set but task.name={self.name!r} is a built-in task; set "
                             "task.name=dataset to train on your data, or drop the key")
        return self


class RolloutCorrectionConfig(_Section):
    """Off-policy correction of the policy loss for the gap between the policy that sampled (the engine, maybe some
    updates behind) and the one being trained (algorithms/rollout_correction.py, docs/async.md)."""

    mode: Literal["none", "tis", "mis"] = Field(
        "none", description="none; tis: truncated importance sampling, each token's (or sequence's) loss weighted "
        "by min(pi_train/pi_rollout, cap); mis: masked importance sampling, tokens (or sequences) whose ratio leaves "
        "[1/cap, cap] are dropped from the loss, the rest weighted by their ratio.",
    )
    level: Literal["token", "sequence"] = Field(
        "token", description="token: one ratio per token; sequence: one per sample, the product of its tokens'."
    )
    cap: float = Field(2.0, description="C above (> 1): the truncation of tis, the band [1/C, C] of mis.")

    @model_validator(mode="after")
    def _check_cap(self) -> "RolloutCorrectionConfig":
        if not self.cap > 1:
            raise ValueError(f"algorithm.rollout_correction.cap={self.cap} must be greater than 1: it bounds the "
                             "importance ratio pi_train/pi_rollout from above (2 is typical)")
        return self


class AlgorithmConfig(_Section):
    name: Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo", "dpo", "opd"] = Field(
        "grpo",
        description="The algorithm; each name presets the knobs below that the config leaves unset (see "
        "docs/algorithms.md). dpo trains offline from preference pairs (`posttrain dpo`); opd distils the teacher named "
        "in the distill section on the student's own samples.",
    )
    group_size: int = Field(8, le=1024, description="Completions sampled per prompt (GRPO's group); at most 1024, each with a sampling seed of its own.")
    prompts_per_step: int = Field(32, gt=0, description="Prompts per step; the batch is prompts_per_step*group_size samples.")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip range of the importance ratio.")
    kl_coef: float = Field(0.02, ge=0, description="Weight of the k3 KL estimate to the reference; 0 = no reference.")
    loss_agg: Literal["token", "sequence", "constant"] = Field(
        "token", description="token: mean over all tokens of the batch; sequence: mean per sequence, then over "
        "sequences; constant: each sequence's token sum / rollout.max_new_tokens, mean over sequences (Dr.GRPO)."
    )
    clip_eps_high: float | None = Field(
        None, gt=0, lt=1, description="Upper clip range of the ratio (DAPO clip-higher); None = clip_eps."
    )
    dynamic_sampling_rounds: int = Field(
        0, ge=0, description="DAPO: extra rollout rounds per step that sample more prompts to refill the batch with "
        "groups whose rewards vary (0 = no refill)."
    )
    overlong_buffer_fraction: float = Field(
        0.0, ge=0, lt=1, description="DAPO overlong shaping: the last share of rollout.max_new_tokens in which the "
        "reward falls linearly to -overlong_penalty (0 = off)."
    )
    overlong_penalty: float = Field(1.0, ge=0, description="DAPO: the penalty at rollout.max_new_tokens.")
    gamma: float = Field(1.0, ge=0, le=1, description="PPO: discount per token in GAE.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="PPO: GAE lambda.")
    value_clip: float | None = Field(0.2, gt=0, description="PPO: clip range of the value update; None = no clipping.")
    critic_lr: float = Field(1e-3, gt=0, description="PPO: critic AdamW learning rate (constant).")
    dpo_beta: float = Field(0.1, gt=0, description="DPO: beta, the strength of the implicit KL to the reference.")
    scale_rewards: bool = Field(True, description="Divide group-centred rewards by the group std (GRPO).")
    skip_zero_variance_groups: bool = Field(True, description="Drop groups whose rewards are all equal.")
    updates_per_batch: int = Field(1, ge=1, description="Optimizer steps per rollout batch (>1 exercises clipping).")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per pass over the batch.")
    lr: float = Field(3e-4, gt=0, description="AdamW peak learning rate.")
    lr_schedule: Literal["constant", "linear"] = Field(
        "linear", description="constant, or linear decay from lr to lr*lr_final_fraction over train.steps."
    )
    lr_final_fraction: float = Field(0.1, ge=0, le=1, description="Learning rate at the last step, as a share of lr.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig, description="Off-policy correction for rollouts sampled by "
        "another policy than the one trained (staleness, engine kernels): mode, level, cap.",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        from posttrain.config.algorithm_presets import apply_preset

        return apply_preset(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check(self) -> "AlgorithmConfig":
        from posttrain.config.algorithm_presets import GROUP_ALGORITHMS

        if self.group_size < 1 or (self.group_size < 2 and self.name in GROUP_ALGORITHMS):
            raise ValueError(
                f"algorithm.group_size={self.group_size}: {self.name} needs at least 2 completions per prompt to form "
                "an advantage; set algorithm.group_size to 2 or more (8 is typical)"
            )
        if self.clip_eps_high is not None and self.clip_eps_high < self.clip_eps:
            raise ValueError(
                f"algorithm.clip_eps_high={self.clip_eps_high} is below algorithm.clip_eps={self.clip_eps}; "
                "clip-higher widens the upper range only (DAPO uses 0.28 with 0.2)"
            )
        if self.dynamic_sampling_rounds and self.name not in GROUP_ALGORITHMS:
            raise ValueError(
                f"algorithm.dynamic_sampling_rounds={self.dynamic_sampling_rounds}: dynamic sampling keeps groups "
                f"with reward variance, which {self.name} does not use; set it to 0"
            )
        if self.name == "dpo" and self.rollout_correction.mode != "none":
            raise ValueError(
                f"algorithm.rollout_correction.mode={self.rollout_correction.mode} with algorithm.name=dpo: DPO trains "
                "offline from preference pairs, with no rollout to correct; set algorithm.rollout_correction.mode=none"
            )
        total = self.prompts_per_step * self.group_size
        if total % self.minibatches:
            raise ValueError(
                f"algorithm.minibatches={self.minibatches} does not divide prompts_per_step*group_size={total}; "
                "pick a divisor"
            )
        return self


class TopologyConfig(_Section):
    """Logical CPU/GPU shares per role. On CPU machines devices are CPU slots (see DESIGN.md)."""

    rollout_cpus: float = Field(0.5, gt=0, description="Logical CPUs reserved per rollout worker.")
    trainer_cpus: float = Field(1.0, gt=0, description="Logical CPUs reserved for the trainer.")
    reference_cpus: float = Field(0.25, gt=0, description="Logical CPUs reserved for the reference model.")
    reward_cpus: float = Field(0.25, gt=0, description="Logical CPUs reserved for the reward worker.")
    critic_cpus: float = Field(0.5, gt=0, description="Logical CPUs reserved for PPO's critic (value model).")
    rollout_gpus: float = Field(0.0, ge=0, description="GPUs per rollout worker (fractions colocate).")
    trainer_gpus: float = Field(0.0, ge=0, description="GPUs for the trainer.")
    trainer_ranks: int = Field(
        1, ge=1, description="Data-parallel trainer ranks: 1 = one trainer actor; N > 1 = N actors in a "
        "torch.distributed group sharding the policy with FSDP2 (each rank takes trainer_cpus/trainer_gpus; the "
        "step batch is split across them). Checkpoints reload with any rank count.",
    )
    torch_threads: int = Field(2, ge=1, description="torch intra-op threads for the trainer and reference.")
    mode: Literal["manual", "auto", "colocated", "split_pairs", "split"] = Field(
        "manual",
        description="manual: one PACK placement group, a bundle per role from the shares above; auto: the planner's "
        "cheapest feasible layout on `cluster`; colocated / split_pairs / split: that layout (see `posttrain plan`).",
    )
    cluster: str | None = Field(None, description="Planner's cluster, NODESxDEVICESxTYPE[-MEMGB], e.g. 2x8xH100-80GB.")
    reward_model: str | None = Field(
        None, description="Planner: HF config (dir or config.json) of a reward model; None = rule-based verifier."
    )
    critic_model: str | None = Field(None, description="Planner: HF config of a critic (value) model; None = no critic.")
    micro_batch: int | None = Field(
        None, ge=1, description="Planner: sequences per device per forward/backward; None = the whole minibatch."
    )
    activation_checkpointing: bool = Field(False, description="Planner: assume full activation recomputation.")
    usd_per_device_hour: float | None = Field(
        None, gt=0, description="Price for plan costs and the run summary's cost; None = the price file's default."
    )


class TrainConfig(_Section):
    steps: int = Field(400, ge=0, description="GRPO steps (one rollout batch each).")
    packing: bool = Field(
        True, description="Trainer, reference and critic run over the batch's sequences packed end to end into rows "
        "(position ids restart per sequence, attention stays within it; the LM head over trained tokens only) "
        "instead of each padded to the longest: logprobs equal within 1e-5 in float32, 0.24-0.80x the time at mixed "
        "lengths, the same at uniform ones (benchmarks/results/packing.json). false = padded rows.",
    )
    micro_batch: int | None = Field(
        None, gt=0, description="Sequences per forward/backward pass: each minibatch's gradient is accumulated over "
        "micro-batches of this many sequences, each loss weighted by its share of the minibatch's (tokens for "
        "loss_agg=token, sequences otherwise), so the step is the whole minibatch's within float error while the "
        "trainer holds one micro-batch's activations at a time (SmolLM2-135M, 64 samples: docs/real-models.md). "
        "None = the whole minibatch in one pass.",
    )
    activation_checkpointing: bool = Field(
        False, description="The policy keeps only each decoder layer's input for the backward and recomputes the "
        "rest (transformers' gradient checkpointing): less activation memory for one more forward of the body.",
    )


class EvalConfig(_Section):
    every: int = Field(50, ge=0, description="Held-out evaluation every k steps (0 = only before and after).")
    max_new_tokens: int = Field(8, gt=0, description="Longest greedy completion in held-out evaluation.")
    stop_at_accuracy: float | None = Field(
        None, gt=0, le=1, description="End the run early at the first periodic held-out eval (eval.every) whose "
        "accuracy is at or above this: it checkpoints and finishes as at train.steps, and summary.json's "
        "stopped_at_accuracy names the step. The step-0 eval does not stop it; `--resume` trains on to train.steps. "
        "None = run train.steps.",
    )
    suites: list[str] = Field(
        default_factory=list,
        description="In-loop eval: suites (files or built-in names, as `posttrain eval --suite`) run on every saved "
        "checkpoint by an evaluator actor, without blocking training; each result is gated against the previous and "
        "the best checkpoint and runs/<name>/best.json follows the best. `run_reward` = this run's held-out split "
        "scored by its own reward (as `posttrain eval --from-run`). Empty = off.",
    )
    gate_margin: float = Field(0.0, ge=0, description="In-loop gate: tolerated drop of a suite's mean score.")
    gate_alpha: float = Field(0.05, gt=0, lt=1, description="In-loop gate: significance level after Holm correction.")
    evaluator_cpus: float = Field(0.5, gt=0, description="Logical CPUs reserved for the evaluator actor.")

    @model_validator(mode="after")
    def _check(self) -> "EvalConfig":
        if self.stop_at_accuracy is not None and self.every == 0:
            raise ValueError(f"eval.stop_at_accuracy={self.stop_at_accuracy} needs periodic held-out evals: set "
                             "eval.every to how often (in steps) to check it")
        return self


class AlarmRule(_Section):
    """One reward-hacking alarm (posttrain.evals.alarms), checked after every step."""

    kind: Literal["proxy_gold", "length_corr", "length_bucket", "kl_accel", "entropy_collapse", "repetition",
                  "rm_disagreement"] = Field(
        description="proxy_gold: proxy reward rising while reward/gold falls; length_corr: length-reward correlation; "
        "length_bucket: reward gain that vanishes within length buckets; kl_accel: KL slope speeding up; "
        "entropy_collapse; repetition: n-gram repetition; rm_disagreement: reward-model ensemble members "
        "disagreeing more than at the start (needs reward.rm_ensemble)."
    )
    action: Literal["warn", "stop", "rollback"] = Field(
        "warn", description="warn: log alarm/<kind>; stop: checkpoint and end the run; rollback: load the best "
        "checkpoint (eval.suites must be set) into trainer and engines and go on.",
    )
    threshold: float | None = Field(None, description="None = the detector's default (see docs/evals.md).")
    window: int = Field(5, ge=3, description="Steps the slope/correlation detectors look back over.")
    after_step: int = Field(0, ge=0, description="Ignore the alarm up to this step (warm-up).")
    drop: float | None = Field(
        None, gt=0, lt=1, description="proxy_gold: also fire when gold has fallen this share below its peak while the "
        "proxy stands above its value at that peak (None = slopes only).",
    )
    proxy: Literal["heldout", "train"] = Field(
        "heldout", description="proxy_gold: the proxy series: heldout = the reward of the held-out greedy completions "
        "(heldout/proxy), train = the training batch's reward_mean (what RL maximizes).",
    )


class AlarmsConfig(_Section):
    rules: list[AlarmRule] = Field(
        default_factory=list,
        description="Reward-hacking alarms checked every step (empty = none), each {kind, action, threshold, window, "
        "after_step}: kind proxy_gold (needs reward.log_gold), length_corr, length_bucket, kl_accel, entropy_collapse, "
        "repetition or rm_disagreement (needs reward.rm_ensemble); "
        "action warn, stop or rollback (to the best checkpoint; needs eval.suites); threshold None = the default; "
        "window in steps (>= 3, default 5); after_step: quiet until then. See docs/evals.md.",
    )
    no_signal_steps: int = Field(
        5, ge=0, description="Steps in a row without a learning signal (no group's rewards differ, or every reward "
        "failed) before the zero-signal alarm fires: said on the progress line, in metrics (alarm/no_signal) and "
        "through ops.notify (no_signal); 0 = off.",
    )
    no_signal_action: Literal["stop", "warn"] = Field(
        "stop", description="What the zero-signal alarm does: stop (exit 77, a checkpoint of the last step) or warn "
        "(the run goes on).",
    )
    no_progress_steps: int = Field(
        20, ge=0, description="The learning monitor's window: from this step on, when the training reward has not "
        "risen significantly (OLS trend, one-sided p < 0.05) over the last this many steps nor over the whole run "
        "while groups carry a signal, or rises while the held-out accuracy does not, the alarm names the likely "
        "cause with its figure (policy barely moves, policy jumps, few groups with signal, completions cut, "
        "held-out gap, reward not following): on the progress line, in metrics (alarm/no_progress), through "
        "ops.notify (no_progress) and in summary.json (no_progress: its first step); 0 = off. See docs/evals.md.",
    )
    no_progress_action: Literal["stop", "warn"] = Field(
        "warn", description="What the learning monitor does when it fires: warn (the run goes on) or stop (exit 78, "
        "a checkpoint of the step).",
    )
    repetition_n: int = Field(3, ge=1, description="n of the n-gram repetition rate (tokens).")
    heldout_problems: int = Field(
        64, ge=0, description="proxy_gold: after every step, greedy completions of this many fixed held-out problems "
        "are scored with the reward (heldout/proxy) and the gold function (heldout/gold), the low-noise series the "
        "alarm compares; 0 = compare the training samples' reward_mean and reward/gold instead.",
    )



class CheckpointConfig(_Section):
    every: int = Field(50, ge=0, description="Checkpoint every k steps (0 = only at the end).")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept (the newest valid one is never deleted).")
    keep_best: bool = Field(False, description="Also keep the valid checkpoint with the best held-out accuracy "
                            "(of the steps with an eval), however old.")
    grace_seconds: float = Field(
        30.0, gt=0, description="On SIGTERM a checkpoint is written within this many seconds and the run exits with "
        "code 75 (resume with --resume). A step that cannot finish in time (less the measured checkpoint time) is "
        "abandoned before its update and redone on resume; the exit message says when the checkpoint was late.",
    )


class LoggingConfig(_Section):
    sinks: list[Literal["jsonl", "tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"],
        description="Metric sinks: jsonl, tensorboard (runs/<name>/tensorboard/), mlflow, wandb; metrics.jsonl is "
        "always written. Secrets are redacted from the config they log.",
    )
    progress: bool = Field(True, description="Rich progress bar on a terminal (plain lines otherwise).")
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; None: a local sqlite store runs/<name>/mlflow.db (nothing leaves the machine)."
    )
    mlflow_experiment: str = Field("posttrain", description="MLflow experiment the run is logged under.")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="W&B mode; offline writes runs/<name>/wandb/ and uploads nothing (`wandb sync` later)."
    )
    wandb_project: str = Field("posttrain", description="W&B project.")
    wandb_entity: str | None = Field(None, description="W&B entity (team or user); None: your default.")


class RayConfig(_Section):
    address: str | None = Field(None, description="Join this Ray cluster; None starts an embedded one on 127.0.0.1.")
    num_cpus: float | None = Field(None, description="Logical CPUs of the embedded cluster (default: enough for the roles).")
    log_to_driver: bool = Field(
        False, description="Stream actors' logs to the console (they are always in /tmp/ray/session_latest/logs)."
    )


class SFTConfig(_Section):
    batch_size: int = Field(128, gt=0, description="SFT examples per step.")
    lr: float = Field(2e-3, gt=0, description="SFT peak learning rate (AdamW, linear warm-up).")
    warmup_steps: int = Field(50, ge=0, description="SFT warm-up steps.")
    max_steps: int = Field(1800, gt=0, description="SFT cap when the target is not reached.")
    eval_every: int = Field(50, gt=0, description="SFT held-out evaluation interval (steps); ~0.5 s per 500 problems.")
    target_accuracy: float = Field(
        0.1, ge=0, le=1, description="Stop SFT at the first held-out eval at or above this (RL needs room above it)."
    )
    out: str = Field("runs/demo/sft-model", description="Where the warm-started model directory is written.")


class DPOConfig(_Section):
    """Offline DPO (`posttrain dpo`): steps are train.steps, learning rate algorithm.lr, beta algorithm.dpo_beta."""

    pairs: str | None = Field(None, description="jsonl or parquet of {prompt, chosen, rejected} rows (strings or chat-format turns), the same format as rm.data.")
    batch_size: int = Field(32, gt=0, description="Preference pairs per optimizer step.")


class RMConfig(_Section):
    """Reward-model training (`posttrain rm train`) and the built-in preference pairs (`posttrain rm pairs`)."""

    data: str = Field("runs/rm/pairs.jsonl", description="Preference file (.jsonl/.parquet): prompt, chosen, rejected.")
    base: str = Field("runs/demo/sft-model", description="HF causal-LM directory the reward model starts from.")
    out: str = Field("runs/rm/model", description="Where the reward model (an HF sequence-classification dir) goes.")
    epochs: int = Field(2, ge=1, description="Passes over the training pairs.")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (constant).")
    batch_size: int = Field(32, gt=0, description="Preference pairs per optimizer step.")
    margin: float = Field(0.0, ge=0, description="Bradley-Terry margin (added to a row's own 'margin' field).")
    center_coef: float = Field(0.0, ge=0, description="Reward-centering coefficient: weight of mean((r_c + r_r)^2).")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="Share of pairs held out for accuracy and margin.")
    pairs: int = Field(4000, gt=0, description="Built-in pairs written by `posttrain rm pairs`.")
    label_noise: float = Field(0.1, ge=0, lt=0.5, description="Share of built-in pairs whose labels are swapped.")
    lora: AdapterConfig | None = Field(
        None, description="LoRA adapters on the reward model's body instead of full fine-tuning (absent = full); the "
        "score head is trained whole. rm.out is still the merged model (a plain HF directory), with the adapter in "
        "rm.out/adapter. The keys below apply when set.",
    )


class RunConfig(_Section):
    name: str = Field("demo", description="Run name: outputs go to <runs_dir>/<name>/.")
    runs_dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(0, description="Seeds data splits, batch order, sampling and init.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    alarms: AlarmsConfig = Field(default_factory=AlarmsConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    ops: OpsConfig = Field(default_factory=OpsConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    rm: RMConfig = Field(default_factory=lambda: RMConfig())
    distill: DistillConfig = Field(default_factory=DistillConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @model_validator(mode="after")
    def _check_float64_engine(self) -> "RunConfig":
        if self.model.dtype == "float64" and self.rollout.engine == "vllm":
            raise ValueError("model.dtype=float64 with rollout.engine=vllm: vLLM has no float64 kernels; float64 is "
                             "for numerics checks: set rollout.engine=hf, or model.dtype=float32")
        return self

    @model_validator(mode="after")
    def _check_distill(self) -> "RunConfig":
        d, name = self.distill, self.algorithm.name
        if name == "opd" and not d.teacher:
            raise ValueError("algorithm.name=opd needs distill.teacher: set it to the teacher model's directory (a "
                             "local HF causal LM with the student's tokenizer)")
        if name != "opd" and d.teacher:
            raise ValueError(f"distill.teacher={d.teacher} with algorithm.name={name}: only opd uses a teacher; set "
                             "algorithm.name=opd, or remove distill.teacher")
        if name == "opd" and self.rollout.temperature not in (0.0, 1.0):
            raise ValueError(f"algorithm.name=opd with rollout.temperature={self.rollout.temperature}: the reverse KL "
                             "compares the engine's raw (temperature-1) logprobs with the teacher's, which are taken "
                             "at the sampling temperature; set rollout.temperature=1.0")
        if name == "opd" and d.reward_coef > 0 and self.algorithm.group_size < 2:
            raise ValueError(f"distill.reward_coef={d.reward_coef} with algorithm.group_size="
                             f"{self.algorithm.group_size}: the reward's group advantage needs at least 2 samples "
                             "per prompt; set algorithm.group_size to 2 or more, or distill.reward_coef=0")
        return self

    def fingerprint(self, keys: tuple[str, ...] = ("model", "task", "algorithm", "seed")) -> str:
        """Hash of the parts that must not change across a resume; on opd the distill section too (the teacher, its
        coefficients), left out elsewhere so that other runs' checkpoints keep their fingerprints."""
        d = self.to_dict()
        keys = (*keys, "distill") if self.algorithm.name == "opd" else keys
        return hashlib.sha256(json.dumps({k: d[k] for k in keys}, sort_keys=True).encode()).hexdigest()[:16]

