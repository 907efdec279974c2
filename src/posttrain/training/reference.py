"""The reference role: a frozen copy of the initial policy that gives per-token logprobs for the KL term.
Created only when algorithm.kl_coef > 0. Made a Ray actor by the driver."""

from __future__ import annotations

import torch

from posttrain.config import RunConfig
from posttrain.models.loading import load_causal_lm
from posttrain.remote.stacks import ActorProcess
from posttrain.training.batch import completion_logprobs, pack


class ReferenceModel(ActorProcess):
    def __init__(self, cfg_dict: dict, model_dir: str, field: str = "reference model"):
        """`field` names the model in a load error: the reference, or on opd the teacher (distill.teacher)."""
        self.cfg = RunConfig.model_validate(cfg_dict)
        torch.set_num_threads(self.cfg.topology.torch_threads)
        self.model, tok = load_causal_lm(model_dir, self.cfg.model.dtype, field=field)
        self.model.requires_grad_(False)
        self.pad_id = tok.pad_token_id

    @torch.no_grad()
    def logprobs(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """One list per sample with log p_ref of each completion token (same length as the completion). A multi-turn
        completion's environment and tool tokens get theirs too: the trainer and the step mask them out."""
        return sample_logprobs(self.cfg, self.model, self.pad_id, prompts, completions)


def sample_logprobs(cfg: RunConfig, model, pad_id: int, prompts: list[list[int]],
                    completions: list[list[int]]) -> list[list[float]]:
    """`model`'s logprobs of each completion token, one list per sample (the reference's answer; also the LoRA
    trainer's, with its adapters off: training/trainer.py)."""
    if not completions:
        return []
    packed = pack(prompts, completions, pad_id, packed_rows=cfg.train.packing)
    lp = completion_logprobs(model, packed, cfg.rollout.temperature or 1.0)
    return [lp[i, : len(c)].tolist() for i, c in enumerate(completions)]
