"""The critic role for PPO: a value model (the policy's HF backbone with a one-output token-classification head,
initialised from the policy's starting weights) that estimates V(state before each completion token) and is
regressed on the GAE returns with a clipped value loss. Made a Ray actor by the driver; saved with every
checkpoint under `critic/` so a resume continues with the same value estimates."""

from __future__ import annotations

from pathlib import Path

import torch

from posttrain.algorithms.common import at_least_float32
from posttrain.algorithms.ppo import clipped_value_loss
from posttrain.config import RunConfig
from posttrain.models.loading import check_model_dir, load_tokenizer
from posttrain.remote.stacks import ActorProcess
from posttrain.training.batch import PackedBatch, forward_at_completion_positions, pack

CRITIC_DIR = "critic"
CRITIC_STATE = "critic_state.pt"


def load_value_model(path: str | Path, dtype: str):
    """An HF backbone with a scalar head per position (AutoModelForTokenClassification, num_labels=1)."""
    from transformers import AutoModelForTokenClassification

    from posttrain.models.dtype import weights_dtype

    return AutoModelForTokenClassification.from_pretrained(str(path), num_labels=1,
                                                           dtype=getattr(torch, weights_dtype(dtype)))


class Critic(ActorProcess):
    def __init__(self, cfg_dict: dict, model_dir: str):
        self.cfg = RunConfig.model_validate(cfg_dict)
        torch.set_num_threads(self.cfg.topology.torch_threads)
        torch.manual_seed(self.cfg.seed + 1)  # the head's init; +1 keeps it independent of the trainer's stream
        check_model_dir(model_dir, field="critic (model.path)")
        self.model = load_value_model(model_dir, self.cfg.model.dtype)
        self.pad_id = load_tokenizer(model_dir).pad_token_id
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.algorithm.critic_lr)

    def _values(self, packed: PackedBatch) -> torch.Tensor:
        values = forward_at_completion_positions(lambda **kw: at_least_float32(self.model(**kw).logits), packed)
        return values.squeeze(-1) * packed.completion_mask

    @torch.no_grad()
    def values(self, prompts: list[list[int]], completions: list[list[int]],
               loss_masks: list[list[int]] | None = None) -> list[list[float]]:
        """V(state before token t) for each completion token; one list per sample, as long as its completion.
        With `loss_masks` (multi-turn), 0 on environment and tool tokens: they are not actions."""
        if not completions:
            return []
        self.model.eval()
        v = self._values(pack(prompts, completions, self.pad_id, loss_masks, packed_rows=self.cfg.train.packing))
        return [v[i, : len(c)].tolist() for i, c in enumerate(completions)]

    def train_step(self, prompts, completions, returns: list[list[float]], old_values: list[list[float]],
                   loss_masks: list[list[int]] | None = None) -> dict:
        """updates_per_batch passes of `minibatches` clipped value-loss steps each over the batch (like the policy);
        with `loss_masks` (multi-turn), the value loss counts sampled tokens only."""
        from posttrain.training.trainer import pad_rows, values_dtype

        a = self.cfg.algorithm
        packed = pack(prompts, completions, self.pad_id, loss_masks, packed_rows=self.cfg.train.packing)
        T = packed.completion_mask.shape[1]
        dtype = values_dtype(self.cfg)
        R, V_old = pad_rows(returns, T, dtype), pad_rows(old_values, T, dtype)
        n = len(completions)
        mb = max(1, n // a.minibatches)
        self.model.train()
        losses, clipped = [], []
        for _ in range(a.updates_per_batch):
            order = torch.randperm(n)
            for start in range(0, n, mb):
                idx = order[start:start + mb]
                sub = packed.select(idx)
                loss, frac = clipped_value_loss(self._values(sub), V_old[idx], R[idx], sub.completion_mask, a.value_clip)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.max_grad_norm)
                self.optimizer.step()
                losses.append(float(loss.detach()))
                clipped.append(float(frac))
        return {"value_loss": sum(losses) / len(losses), "value_clip_fraction": sum(clipped) / len(clipped)}

    def save(self, ckpt_tmp_dir: str) -> None:
        d = Path(ckpt_tmp_dir) / CRITIC_DIR
        self.model.save_pretrained(str(d), safe_serialization=True)
        torch.save({"optimizer": self.optimizer.state_dict()}, d / CRITIC_STATE)

    def load(self, ckpt_dir: str) -> None:
        d = Path(ckpt_dir) / CRITIC_DIR
        if not d.is_dir():
            raise RuntimeError(f"checkpoint {ckpt_dir} has no {CRITIC_DIR}/ (was it saved by a PPO run?)")
        self.model = load_value_model(d, self.cfg.model.dtype)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.algorithm.critic_lr)
        self.optimizer.load_state_dict(torch.load(d / CRITIC_STATE, weights_only=True)["optimizer"])

    def ping(self) -> int:
        import os

        return os.getpid()
