"""The two pieces of math one-step-off rollout needs (one_step_off.py): which logprobs the importance ratio
is taken against, and how stale a batch is. Pure functions, no Ray."""

from __future__ import annotations

import torch


def behaviour_logprobs(engine_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The old logprobs of the clipped ratio for samples the engine drew with weights the trainer no longer holds:
    the engine's own per-token logprobs [B, T] (0 where mask is 0). They are the behaviour policy's only at
    temperature 1 and top_p 1 (engines return raw logprobs); `check_one_step_off_config` enforces that."""
    return engine_logprobs * mask


def staleness(trainer_version: int, behaviour_version: int, bound: int = 1) -> int:
    """Updates between the weights that generated a batch (`behaviour_version`) and the weights it trains
    (`trainer_version`), both counted in optimizer steps taken; raises when it exceeds `bound` or is negative."""
    lag = trainer_version - behaviour_version
    if not 0 <= lag <= bound:
        raise RuntimeError(f"rollout staleness {lag} outside [0, {bound}]: trainer at version {trainer_version}, "
                           f"batch generated at version {behaviour_version}")
    return lag
