"""FLOPs per RL step and time per phase. 2N FLOPs per token for a forward pass (generation, reference and reward
scoring), 6N per trained token (forward + backward) -- EleutherAI "Transformer Math 101"; the attention term is left
out (small at RL sequence lengths; PaLM appendix B gives it)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    """One RL step's token counts. sequences = prompts_per_step * group_size."""

    sequences: int
    prompt_tokens: int  # per sequence
    completion_tokens: int  # per sequence (max_new_tokens: an upper bound)
    train_passes: int = 1  # optimizer passes over the batch (updates_per_batch)
    minibatches: int = 1  # optimizer steps per pass: a minibatch is sequences / minibatches
    micro_batch: int | None = None  # sequences per device per forward/backward (gradient accumulation); None: all

    def micro_batch_per_device(self, devices: int) -> int:
        whole = math.ceil(self.sequences / self.minibatches / devices)
        return min(whole, self.micro_batch) if self.micro_batch else whole

    @property
    def seq_len(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def scored_tokens(self) -> int:
        return self.sequences * self.seq_len

    @property
    def generated_tokens(self) -> int:
        return self.sequences * self.completion_tokens


def forward_flops(params: float, tokens: float) -> float:
    return 2.0 * params * tokens


def train_flops(params: float, tokens: float) -> float:
    return 6.0 * params * tokens


def lora_train_flops(params: float, trainable: float, tokens: float) -> float:
    """A LoRA step per token: the frozen base's forward (2N) and its input gradients (2N) but no weight gradients,
    plus the adapters' own forward and backward (6 per trainable parameter)."""
    return (4.0 * params + 6.0 * trainable) * tokens


def compute_seconds(flops: float, devices: int, peak_flops: float, utilization: float) -> float:
    return flops / (devices * peak_flops * utilization)


def decode_seconds(weight_bytes_per_device: float, steps: int, memory_bandwidth: float) -> float:
    """Lower bound for token-by-token decoding: every step reads the engine's weights once (memory-bound)."""
    return steps * weight_bytes_per_device / memory_bandwidth
