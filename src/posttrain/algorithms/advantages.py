"""The loop's advantage step for every RL algorithm, in one place: the loop hands over the step's rewards (and, for
the per-token algorithms, its logprobs, reference logprobs and critic values) and gets advantages back, one per
sequence [B] or one per token [B, T]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posttrain.algorithms.dapo import overlong_buffer_tokens, overlong_penalty
from posttrain.algorithms.distill import distill_advantages
from posttrain.algorithms.grpo import group_advantages
from posttrain.algorithms.ppo import gae, whiten
from posttrain.config.algorithm_presets import GROUP_ALGORITHMS, KL_IN_REWARD
from posttrain.algorithms.reinforce_pp import kl_shaped_token_rewards, reinforce_pp_advantages
from posttrain.algorithms.rloo import leave_one_out_advantages

if TYPE_CHECKING:
    from posttrain.config import AlgorithmConfig, RolloutConfig


@dataclass
class Advantages:
    advantages: torch.Tensor            # [B] per sequence, or [B, T] per token
    returns: torch.Tensor | None = None  # [B, T] critic targets (PPO only)


def uses_groups(acfg: "AlgorithmConfig") -> bool:
    return acfg.name in GROUP_ALGORITHMS


def kl_in_reward(acfg: "AlgorithmConfig") -> bool:
    """True when the KL to the reference is part of the per-token reward (not a loss term) for this algorithm."""
    return acfg.name in KL_IN_REWARD and acfg.kl_coef > 0


def sampled_token_budget(rcfg: "RolloutConfig") -> int:
    """The most tokens the engine samples for one sample: the constant of DAPO's overlong shaping and of Dr.GRPO's
    loss. max_new_tokens for one completion; a multi-turn episode samples up to max_new_tokens in each of max_turns
    assistant turns, so its budget is their product (environment and tool tokens are not sampled: not counted)."""
    return rcfg.max_new_tokens * rcfg.max_turns if rcfg.multi_turn else rcfg.max_new_tokens


def shape_rewards(acfg: "AlgorithmConfig", rewards: torch.Tensor, lengths: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """The rewards the advantage sees: the task/RM reward plus DAPO's overlong penalty when it is configured."""
    buffer = overlong_buffer_tokens(max_new_tokens, acfg.overlong_buffer_fraction)
    if buffer == 0:
        return rewards
    return rewards + overlong_penalty(lengths, max_new_tokens, buffer, acfg.overlong_penalty)


def compute_advantages(
    acfg: "AlgorithmConfig",
    rewards: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    teacher_logprobs: torch.Tensor | None = None,
    distill=None,
) -> Advantages:
    """rewards [B] laid out group by group (group_size samples per prompt); mask/logprobs/ref_logprobs/values [B, T]
    are needed only by the per-token algorithms (reinforce_pp, ppo); opd needs teacher_logprobs [B, T] and the
    run's `distill` section (coef, reward_coef)."""
    name = acfg.name
    if name in ("grpo", "dr_grpo", "dapo"):
        return Advantages(group_advantages(rewards, acfg.group_size, scale=acfg.scale_rewards))
    if name == "rloo":
        return Advantages(leave_one_out_advantages(rewards, acfg.group_size))
    if mask is None:
        raise ValueError(f"{name} needs the completion mask for per-token advantages")
    if name == "reinforce_pp":
        return Advantages(reinforce_pp_advantages(rewards, mask, logprobs, ref_logprobs, acfg.kl_coef))
    if name == "ppo":
        if values is None:
            raise ValueError("ppo needs the critic's values")
        token_rewards = kl_shaped_token_rewards(rewards, mask, logprobs, ref_logprobs, acfg.kl_coef)
        adv, returns = gae(token_rewards, values, mask, acfg.gamma, acfg.gae_lambda)
        return Advantages(whiten(adv, mask), returns)
    if name == "opd":
        if logprobs is None or teacher_logprobs is None or distill is None:
            raise ValueError("opd needs the student's logprobs, the teacher's and the distill section")
        return Advantages(distill_advantages(rewards, mask, logprobs, teacher_logprobs, distill.coef,
                                             distill.reward_coef, acfg.group_size, acfg.scale_rewards))
    raise ValueError(f"algorithm {name!r} has no online advantage (dpo trains offline: `posttrain dpo`)")
