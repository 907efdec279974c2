"""PPO with a learned critic (Schulman et al. 2017; the RLHF form of Ouyang et al. 2022): per-token rewards are the
sequence reward on the last token minus kl_coef * (log pi_old - log pi_ref) on every token (reinforce_pp.py builds
them), advantages and returns come from GAE(gamma, lambda) over the critic's values, and the critic is trained on
the returns with a clipped value loss. Shapes: [B, T], right-padded, mask 1 on completion tokens."""

from __future__ import annotations

import torch

from posttrain.algorithms.common import masked_mean


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation. values[b, t] is V(state before token t); the value after the last token is 0
    (the episode ends). delta_t = r_t + gamma * V_{t+1} - V_t; A_t = delta_t + gamma * lam * A_{t+1};
    returns R_t = A_t + V_t (the critic's regression target). Both 0 where masked.

    The mask may have holes: a multi-turn episode's environment and tool tokens are not actions, so GAE runs over
    each row's masked-in tokens in order (t+1 is the next sampled token, across a tool turn) and leaves 0 at the
    holes. Without holes the gather and scatter are the identity."""
    index, valid = _masked_in_positions(mask)
    valid = valid.to(values.dtype)
    adv, returns = _gae_contiguous(token_rewards.gather(1, index) * valid, values.gather(1, index) * valid, valid,
                                   gamma, lam)

    def scatter(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(values).scatter_(1, index, x * valid)

    return scatter(adv), scatter(returns)


def _masked_in_positions(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each row's masked-in entries are, in order, left-aligned: index [B, W] into the row and valid [B, W]
    (bool, True for the row's first count entries), W the largest count (at least 1)."""
    counts = (mask > 0).sum(-1)
    width = max(1, int(counts.max()) if counts.numel() else 0)
    # A stable sort of "is masked out" puts the masked-in positions first, in their order.
    index = torch.sort((mask <= 0).to(torch.uint8), dim=-1, stable=True).indices[:, :width]
    return index, torch.arange(width).unsqueeze(0) < counts.unsqueeze(1)


def _gae_contiguous(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gae` for a mask of 1s then padding in each row."""
    mask = mask.to(values.dtype)
    B, T = values.shape
    adv = torch.zeros_like(values)
    next_value = torch.zeros(B, dtype=values.dtype)
    next_adv = torch.zeros(B, dtype=values.dtype)
    for t in range(T - 1, -1, -1):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a_t = (delta + gamma * lam * next_adv) * m
        adv[:, t] = a_t
        # Padding (m == 0) passes nothing backwards: the next real token sees V=0 and A=0 beyond the end.
        next_value = values[:, t] * m
        next_adv = a_t
    returns = (adv + values) * mask
    return adv, returns


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Batch-normalised advantages (mean 0, std 1 over unmasked tokens), as the usual PPO implementations do."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return (values - mean) / (var.sqrt() + eps) * mask


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """0.5 * max((V - R)^2, (V_clipped - R)^2) averaged over unmasked tokens, V_clipped = V_old + clip(V - V_old,
    -clip, clip); without clip, 0.5 * (V - R)^2. Returns (loss, share of tokens where the clipped branch is larger)."""
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * masked_mean(unclipped, mask), torch.zeros(())
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (v_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).to(values.dtype).detach(), mask)
