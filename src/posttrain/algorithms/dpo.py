"""DPO (Rafailov et al. 2023): offline preference optimisation. With sequence logprobs (summed over completion
tokens) of the chosen and rejected answers under the policy and under the frozen reference, the implicit reward of
an answer is beta * (log pi(y|x) - log pi_ref(y|x)) and the loss is -log sigmoid(reward_chosen - reward_rejected)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def implicit_reward(logprob: torch.Tensor, ref_logprob: torch.Tensor, beta: float) -> torch.Tensor:
    """beta * (log pi(y|x) - log pi_ref(y|x)) per sequence; usable as a reward-model score. [B] -> [B]."""
    return beta * (logprob - ref_logprob)


@dataclass
class DPOLossOutput:
    loss: torch.Tensor             # scalar, differentiable
    rewards_chosen: torch.Tensor   # scalar, mean implicit reward of the chosen answers
    rewards_rejected: torch.Tensor
    margin: torch.Tensor           # mean of (reward_chosen - reward_rejected)
    accuracy: torch.Tensor         # share of pairs with reward_chosen > reward_rejected


def dpo_loss(
    chosen_logprob: torch.Tensor, rejected_logprob: torch.Tensor,
    ref_chosen_logprob: torch.Tensor, ref_rejected_logprob: torch.Tensor, beta: float,
) -> DPOLossOutput:
    """Sequence logprobs [B] (sums over completion tokens) -> mean DPO loss and the logged implicit-reward stats."""
    r_c = implicit_reward(chosen_logprob, ref_chosen_logprob, beta)
    r_r = implicit_reward(rejected_logprob, ref_rejected_logprob, beta)
    margin = r_c - r_r
    loss = -F.logsigmoid(margin).mean()
    return DPOLossOutput(
        loss=loss,
        rewards_chosen=r_c.detach().mean(),
        rewards_rejected=r_r.detach().mean(),
        margin=margin.detach().mean(),
        accuracy=(margin.detach() > 0).float().mean(),
    )
