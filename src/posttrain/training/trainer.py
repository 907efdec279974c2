"""The trainer role: owns the policy weights and the optimizer, recomputes logprobs with its own weights, takes
GRPO steps, exports weights for the engines and saves/loads its half of a checkpoint. Made a Ray actor by the
driver (`ray.remote(Trainer)`), so it holds no Ray code itself."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posttrain.algorithms.advantages import kl_in_reward, sampled_token_budget
from posttrain.algorithms.grpo import clipped_policy_loss
from posttrain.config import RunConfig
from posttrain.models.loading import load_causal_lm
from posttrain.remote.faults import maybe_wedge
from posttrain.remote.stacks import ActorProcess
from posttrain.algorithms.off_policy import behaviour_logprobs
from posttrain.algorithms.rollout_correction import correction_weights, mismatch_metrics
from posttrain.training.accumulation import loss_share, micro_batches, nonempty_rows
from posttrain.training.batch import PackedBatch, completion_logprobs, pack
from posttrain.training.trainer_state import TRAINER_STATE, jsonable, load_sharded_optimizer, tuplify
from posttrain.training.update_size import squared_sums, update_ratio, weight_sample


# The metric parts of one update, in the order `_update` stacks them.
UPDATE_TERMS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")


@dataclass
class StepInputs:
    packed: PackedBatch
    mask: torch.Tensor            # [N, T] the completion tokens trained on (the loss mask where given)
    advantages: torch.Tensor      # [N, T]
    kl_loss_coef: float
    ref: torch.Tensor | None      # reference logprobs when the loss has a KL term
    engine_lp: torch.Tensor       # the engine's logprobs of the sampled tokens
    lr: float
    agg_constant: int             # tokens: the denominator of loss_agg=constant (Dr.GRPO)


@dataclass
class TrainBatch:
    """One step's training samples; every list has one entry per sample."""

    prompts: list[list[int]]
    completions: list[list[int]]
    advantages: list[float] | list[list[float]]  # one per sample, or one per completion token (PPO, REINFORCE++)
    engine_logprobs: list[list[float]]
    ref_logprobs: list[list[float]] | None = None
    # Multi-turn: per completion token 1 = sampled (trained), 0 = environment/tool (context only); None: all trained.
    loss_masks: list[list[int]] | None = None
    sample_ids: list[str] = field(default_factory=list)
    step: int = 0  # the driver's step index (0-based): sets the learning rate, so a resume follows the same schedule


def learning_rate(step: int, total_steps: int, lr: float, schedule: str, final_fraction: float) -> float:
    """Learning rate for 0-based `step` of `total_steps`: constant, or linear from lr down to lr*final_fraction at
    the last step."""
    if schedule == "constant" or total_steps <= 1:
        return lr
    progress = min(step, total_steps - 1) / (total_steps - 1)
    return lr * (1.0 - (1.0 - final_fraction) * progress)


def pad_rows(rows: list[list[float]], width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r[:width], dtype=dtype)
    return out


def values_dtype(cfg: RunConfig) -> torch.dtype:
    """The dtype of advantages, logprobs and values fed to the losses: float32, or float64 under model.dtype=float64
    (numerics checks), so that no input is rounded to float32 on one path and not the other."""
    return torch.float64 if cfg.model.dtype == "float64" else torch.float32


class Trainer(ActorProcess):
    def __init__(self, cfg_dict: dict, model_dir: str):
        self.cfg = RunConfig.model_validate(cfg_dict)
        torch.set_num_threads(self.cfg.topology.torch_threads)
        torch.manual_seed(self.cfg.seed)
        random.seed(self.cfg.seed)
        self.model, self.tokenizer = load_causal_lm(model_dir, self.cfg.model.dtype)
        self.lora = None  # model.lora: the PeftModel around self.model, whose targets now carry the adapters
        if self.cfg.model.lora is not None:
            from posttrain.models.loading import model_content_hash
            from posttrain.models.lora import apply_lora

            self.lora = apply_lora(self.model, self.cfg.model.lora, model_dir)
            # which base the adapter belongs to: --resume and export check it (models/lora.py)
            self.lora_base = {"model_path": str(model_dir), "model_hash": model_content_hash(model_dir)}
        self.model.train()
        if self.cfg.train.activation_checkpointing:  # each layer's input kept, the rest recomputed in the backward
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        a = self.cfg.algorithm
        self.optimizer = torch.optim.AdamW(  # with LoRA only the adapters require grad
            [p for p in self.model.parameters() if p.requires_grad], lr=a.lr, betas=tuple(a.betas),
            weight_decay=a.weight_decay,
        )
        self.pad_id = self.tokenizer.pad_token_id
        self.updates = 0

    # ------------------------------------------------------------------ training

    def _step_inputs(self, batch: TrainBatch) -> StepInputs:
        """The batch as padded tensors, and the step's learning rate set on the optimizer (shared by the ranks of
        the sharded trainer, which pack the whole batch the same way). `mask` is the loss mask where the batch has
        one: every loss term, logprob and metric below counts sampled tokens only."""
        a = self.cfg.algorithm
        packed = pack(batch.prompts, batch.completions, self.pad_id, batch.loss_masks,
                      packed_rows=self.cfg.train.packing)
        T = packed.completion_mask.shape[1]
        dtype = values_dtype(self.cfg)
        # PPO and REINFORCE++ put the KL into the reward (the loop did); the others add a k3 term to the loss.
        kl_loss_coef = 0.0 if kl_in_reward(a) else a.kl_coef
        lr = learning_rate(batch.step, self.cfg.train.steps, a.lr, a.lr_schedule, a.lr_final_fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return StepInputs(
            packed=packed, mask=packed.completion_mask, advantages=_advantage_tensor(batch.advantages, T, dtype),
            kl_loss_coef=kl_loss_coef, engine_lp=pad_rows(batch.engine_logprobs, T, dtype), lr=lr,
            agg_constant=sampled_token_budget(self.cfg.rollout),
            ref=pad_rows(batch.ref_logprobs, T, dtype) if batch.ref_logprobs is not None and kl_loss_coef > 0 else None,
        )

    def train_step(self, batch: TrainBatch) -> dict:
        """One step of the clipped policy update: updates_per_batch passes over the batch in a fresh random order,
        one optimizer step per minibatch. Written once for both trainers: the hooks below (`_local_micro_batches`,
        `_gradient_scale`, `_sum_over_ranks`, `_reduce_gradients`, `_extra_metrics`, `single_pass_update`) are the
        one-rank case here and a rank's share in ShardedTrainer."""
        maybe_wedge("train")  # a recovery test's hang (remote/faults.py); a sharded rank's peers wait in a collective
        a = self.cfg.algorithm
        x = self._step_inputs(batch)  # the whole batch, on every rank: the same padding as one rank
        n, T = x.mask.shape
        t0 = time.perf_counter()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        before = weight_sample(trainable)  # the update's size relative to the weights (training/update_size.py)
        # One update on the whole batch: the gradient pass's own logprobs are the pre-update ones (ratio 1), so the
        # separate no-grad forward would be a third of the step's compute spent on a copy (as TRL skips it too).
        single_pass = a.updates_per_batch == 1 and a.minibatches == 1 and self.single_pass_update
        if single_pass:  # filled by the gradient pass, micro-batch by micro-batch
            trainer_lp = torch.zeros(n, T, dtype=values_dtype(self.cfg))
            entropy = torch.zeros(n, T, dtype=values_dtype(self.cfg))
        else:
            trainer_lp, entropy = self._pre_update_logprobs(x.packed)
        old_lp = trainer_lp
        if self.cfg.rollout.asynchronous and a.rollout_correction.mode == "none":
            # Asynchronous, uncorrected: the samples came from older weights; the ratio is against that behaviour
            # policy, whose logprobs the engine returned (rollout.worker.behaviour_logprobs_mode: "sampled").
            # Corrected, the ratio is against the trainer's own (the proximal policy) and importance weights
            # correct for the behaviour policy (_micro_batch_loss).
            old_lp = behaviour_logprobs(x.engine_lp, x.mask)
        record = (trainer_lp, entropy) if single_pass else None
        mb_size = n // a.minibatches if n >= a.minibatches else n
        stats: dict[str, list[float]] = {}
        for _ in range(a.updates_per_batch):
            order = torch.randperm(n)  # the same on every rank of the sharded trainer: they share the RNG state
            for start in range(0, n, mb_size):
                for k, v in self._update(x, order[start : start + mb_size], old_lp, record).items():
                    stats.setdefault(k, []).append(v)
        gap = (x.engine_lp - trainer_lp).abs() * x.mask
        tokens = float(x.mask.sum())
        metrics = {k: sum(v) / len(v) for k, v in stats.items()}
        metrics.update(
            {
                "entropy": float(entropy.sum() / max(tokens, 1.0)),
                "logprob_gap_mean": float(gap.sum() / max(tokens, 1.0)),
                "logprob_gap_max": float(gap.max()) if tokens else 0.0,
                "trained_tokens": tokens,
                "train_compute_s": time.perf_counter() - t0,
                "lr": x.lr,
                "update_ratio": update_ratio(self._sum_over_ranks(squared_sums(before, weight_sample(trainable)))),
                **self._correction_metrics(trainer_lp, x),
                **self._extra_metrics(),
            }
        )
        return metrics

    def _correction_metrics(self, trainer_lp: torch.Tensor, x: StepInputs) -> dict:
        """Engine-vs-trainer mismatch of the batch's pre-update logprobs, and the share of tokens the configured
        correction capped or dropped."""
        c = self.cfg.algorithm.rollout_correction
        out = mismatch_metrics(trainer_lp, x.engine_lp, x.mask)
        corrected = correction_weights(trainer_lp, x.engine_lp, x.mask, mode=c.mode, level=c.level, cap=c.cap)
        return {**out, "mismatch/capped_share": corrected.capped_share, "mismatch/masked_share": corrected.masked_share}

    def _pre_update_logprobs(self, packed: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, T] logprobs and entropies of the whole batch with the current weights, no gradients, in micro-batches
        of train.micro_batch rows (the forward's working set is one micro-batch's). A sharded rank computes its own
        rows and the sum over ranks fills in the rest (x + 0 is exact)."""
        temp = self.cfg.rollout.temperature or 1.0
        n, T = packed.completion_mask.shape
        self.model.eval()  # no dropout in these models, but be explicit: old logprobs come from the same function
        with torch.no_grad():
            parts = [(rows, completion_logprobs(self.model, packed.select(nonempty_rows(rows)), temp,
                                                with_entropy=True))
                     for rows in self._local_micro_batches(torch.arange(n))]
        self.model.train()
        dtype = parts[0][1][0].dtype
        lp, entropy = torch.zeros(n, T, dtype=dtype), torch.zeros(n, T, dtype=dtype)
        for rows, (part_lp, part_entropy) in parts:
            if len(rows):
                lp[rows], entropy[rows] = part_lp, part_entropy
        return self._sum_over_ranks(lp), self._sum_over_ranks(entropy)

    def _update(self, x: StepInputs, idx: torch.Tensor, old_lp: torch.Tensor, record) -> dict[str, float]:
        """One optimizer step on the minibatch rows `idx`: the gradient accumulated over micro-batches of
        train.micro_batch rows (a sharded rank: of its share of `idx`), each loss weighted by its share of the
        minibatch's (`loss_share`), so the step is the whole minibatch's. Metrics likewise: loss terms summed by loss
        share, per-token means by token share, then summed over ranks. `record`: the single pass's (logprobs,
        entropy) [N, T], filled here with the pre-update values."""
        a = self.cfg.algorithm
        parts = torch.zeros(len(UPDATE_TERMS), dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        for local in self._local_micro_batches(idx):
            out = self._micro_batch_loss(x, nonempty_rows(local), old_lp, record)
            share = loss_share(x.mask[local], x.mask[idx], a.loss_agg) if len(local) else 0.0
            tokens = loss_share(x.mask[local], x.mask[idx], "token") if len(local) else 0.0
            (out.loss * (share * self._gradient_scale())).backward()
            terms = torch.stack([out.loss.detach(), out.policy_loss, out.kl, out.clip_fraction, out.ratio_mean])
            parts += terms.double() * torch.tensor([share, share, tokens, tokens, tokens], dtype=torch.float64)
        self._reduce_gradients()
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        sums = dict(zip(UPDATE_TERMS, self._sum_over_ranks(parts).tolist()))
        return {**sums, "grad_norm": float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)}  # FSDP: a DTensor

    def _micro_batch_loss(self, x: StepInputs, rows: torch.Tensor, old_lp: torch.Tensor, record):
        """The policy loss of batch rows `rows` alone (PolicyLossOutput), its logprobs with gradients."""
        a = self.cfg.algorithm
        sub = x.packed.select(rows)
        temp = self.cfg.rollout.temperature or 1.0
        if record is None:
            lp = completion_logprobs(self.model, sub, temp)
        else:  # single pass: this pass gives the pre-update logprobs (old_lp reads them) and the entropy
            lp, ent = completion_logprobs(self.model, sub, temp, with_entropy=True)
            record[0][rows], record[1][rows] = lp.detach(), ent
        weights, c = None, a.rollout_correction
        if c.mode != "none":  # old_lp holds the trainer's pre-update logprobs (train_step); dropped tokens weigh 0
            weights = correction_weights(old_lp[rows], x.engine_lp[rows], sub.completion_mask, mode=c.mode,
                                         level=c.level, cap=c.cap).weights
        return clipped_policy_loss(
            lp, old_lp[rows], x.advantages[rows], sub.completion_mask, clip_eps=a.clip_eps,
            clip_eps_high=a.clip_eps_high, ref_logprobs=x.ref[rows] if x.ref is not None else None,
            kl_coef=x.kl_loss_coef, agg=a.loss_agg, agg_constant=x.agg_constant, is_weights=weights,
        )

    # ------------------------------------------------------------------ the hooks ShardedTrainer overrides

    # The single pass above (updates_per_batch == 1 and minibatches == 1). ShardedTrainer keeps the separate
    # no-grad pass: its gradient pass would fill only its own rows of the pre-update logprobs.
    single_pass_update = True

    def _local_micro_batches(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """The rows of `idx` this trainer computes, in micro-batches of train.micro_batch rows: all of them."""
        return micro_batches(idx, self.cfg.train.micro_batch)

    def _gradient_scale(self) -> int:
        """What each part's loss share is multiplied by before its backward: 1 (no averaging over ranks to undo)."""
        return 1

    def _sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks (pre-update logprobs, metric parts): `t` itself for one rank."""
        return t

    def _reduce_gradients(self) -> None:
        """After the minibatch's backwards, before clipping: nothing for one rank."""

    def _extra_metrics(self) -> dict:
        return {}

    def reference_logprobs(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """With LoRA, the reference is the base model: these weights with the adapters off (ReferenceModel.logprobs'
        answer, without a second copy of the weights)."""
        from posttrain.training.reference import sample_logprobs

        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.lora.disable_adapter():
                return sample_logprobs(self.cfg, self.model, self.pad_id, prompts, completions)
        finally:
            self.model.train(training)

    # ------------------------------------------------------------------ weights and checkpoints

    def export_weights(self) -> bytes:
        from posttrain.models.weights import export_weights, payload_as_safetensors

        if self.lora is not None:  # the same payload as export_arrays (partial, or the adapter), as bytes
            return payload_as_safetensors(self.export_arrays())
        return export_weights(self.model)

    def export_arrays(self) -> dict:
        """The weights as an array payload (models/weights.py): what the loop syncs engines with."""
        from posttrain.models.weights import arrays_from_tensors, export_arrays

        if self.lora is not None and self.cfg.model.lora.sync == "adapter":  # the adapter itself, served by vLLM
            from posttrain.models.lora import adapter_payload

            return adapter_payload(self.lora)
        if self.lora is not None:  # only what changed: the adapted layers, merged (the rest is the engines' base)
            from posttrain.models.lora import sync_weights_of_adapted

            return arrays_from_tensors(sync_weights_of_adapted(self.lora), partial=True)
        return export_arrays(self.model)

    def save(self, ckpt_tmp_dir: str) -> None:
        """Writes `model/` (HF dir, safetensors, with tokenizer; with LoRA the merged model, and the adapter in
        `adapter/`) and the trainer state into the temp checkpoint dir."""
        d = Path(ckpt_tmp_dir)
        if self.lora is not None:  # the adapter in peft's format; model/ the merged model, for evals and export
            from posttrain.models.lora import ADAPTER_DIR, save_adapter, save_merged_model

            save_adapter(self.lora, d / ADAPTER_DIR, self.lora_base)
            save_merged_model(self.lora, self.tokenizer, d / "model")
        else:
            self.model.save_pretrained(str(d / "model"), safe_serialization=True)
            self.tokenizer.save_pretrained(str(d / "model"))
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(), "updates": self.updates,
             "python_rng": list(jsonable(random.getstate()))},
            d / TRAINER_STATE,
        )

    def load(self, ckpt_dir: str) -> None:
        """Restores weights (with LoRA: the adapter), optimizer and RNG from a verified checkpoint directory."""
        d = Path(ckpt_dir)
        if self.lora is not None:
            from posttrain.models.lora import ADAPTER_DIR, load_adapter

            load_adapter(self.lora, d / ADAPTER_DIR)
        else:
            self._load_full_weights(d)
        ts = torch.load(d / TRAINER_STATE, weights_only=True)
        if "optimizer" in ts:
            self.optimizer.load_state_dict(ts["optimizer"])
        else:  # written by the sharded trainer (topology.trainer_ranks > 1): the states are in its shards
            load_sharded_optimizer(self.model, self.optimizer, d)
        torch.set_rng_state(ts["torch_rng"])
        random.setstate(tuplify(ts["python_rng"]))
        self.updates = int(ts["updates"])

    def _load_full_weights(self, d: Path) -> None:
        from safetensors.torch import load_file

        state = {}
        for f in sorted((d / "model").glob("*.safetensors")):
            state.update(load_file(str(f)))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and self.model.config.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {d} does not match the policy: missing {missing}, unexpected {unexpected}")

    def ping(self) -> int:
        import os

        return os.getpid()


def _advantage_tensor(advantages, width: int, dtype: torch.dtype) -> torch.Tensor:
    """[B] from one advantage per sample, [B, width] from one per completion token."""
    if advantages and isinstance(advantages[0], (list, tuple)):
        return pad_rows(advantages, width, dtype)
    return torch.tensor(advantages, dtype=dtype)
