"""The per-token losses a Tinker-compatible `forward_backward` names (`loss_fn`), as pure tensor functions.

Each takes the trainer's log-probabilities of the target tokens `logprobs` (shape [T], one datum) and that datum's
`loss_fn_inputs` (tensors of shape [T], already aligned: position i scores target_tokens[i]) and returns the
elementwise loss [T]; the datum's loss is its sum and the batch's loss the sum over datums (the SDK's convention:
sums, not means, so a client that wants a mean scales its weights or advantages).

- cross_entropy: -logprobs x weights. Weights are any float, negative too (the SDK's forward_backward_custom sends
  -dC/dlogp as weights).
- importance_sampling: -exp(logprobs - sampling_logprobs) x advantages (inputs `logprobs` = the sampler's).
- ppo: -min(r x A, clip(r, low, high) x A) with r = exp(logprobs - sampling_logprobs).
- cispo: -stopgrad(clip(r, low, high)) x logprobs x A.

low/high are ratio bounds from `loss_fn_config` (clip_low_threshold, clip_high_threshold); our defaults 0.8 and 1.2.
"""

from __future__ import annotations

import torch

SUPPORTED = ("cross_entropy", "importance_sampling", "ppo", "cispo")
# loss name -> the loss_fn_inputs it needs besides target_tokens
REQUIRED_INPUTS = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
}
DEFAULT_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


def cross_entropy(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return -logprobs * weights


def importance_sampling(logprobs: torch.Tensor, sampling_logprobs: torch.Tensor,
                        advantages: torch.Tensor) -> torch.Tensor:
    return -torch.exp(logprobs - sampling_logprobs) * advantages


def ppo(logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor,
        low: float, high: float) -> torch.Tensor:
    ratio = torch.exp(logprobs - sampling_logprobs)
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)


def cispo(logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor,
          low: float, high: float) -> torch.Tensor:
    ratio = torch.exp(logprobs - sampling_logprobs).clamp(low, high).detach()
    return -ratio * logprobs * advantages


def elementwise_loss(loss_fn: str, logprobs: torch.Tensor, inputs: dict[str, torch.Tensor],
                     config: dict[str, float] | None = None) -> torch.Tensor:
    """The loss per target token [T] for `loss_fn` (one of SUPPORTED; the caller checked the name and inputs)."""
    if loss_fn == "cross_entropy":
        return cross_entropy(logprobs, inputs["weights"])
    if loss_fn == "importance_sampling":
        return importance_sampling(logprobs, inputs["logprobs"], inputs["advantages"])
    clip = {**DEFAULT_CLIP, **(config or {})}
    low, high = float(clip["clip_low_threshold"]), float(clip["clip_high_threshold"])
    fn = ppo if loss_fn == "ppo" else cispo
    return fn(logprobs, inputs["logprobs"], inputs["advantages"], low, high)
