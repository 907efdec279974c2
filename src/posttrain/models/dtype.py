"""`model.dtype` -> the dtype a role holds its weights in, decided where the weights land (trainer, reference,
critic and the hf engine on this machine's CPU; a vLLM engine on its own platform), not when the config is
validated: `posttrain plan` or `config show` for a cluster may run on a machine unlike the cluster's.

- auto: bfloat16 on a CUDA GPU (vLLM's native path there), float32 on CPU. On CPU float32 stays the default even
  where bfloat16 is native: a pure-bfloat16 AdamW step rounds away most updates at RL learning rates, and every
  learning result on CPU so far was measured in float32 (docs/real-models.md has the numbers).
- bfloat16 on a CPU without native bfloat16 (machine.has_native_bf16) is refused: torch would emulate it, slower
  than float32 and with bfloat16's rounding — one message naming model.dtype and the CPU, never a silent fallback.
"""

from __future__ import annotations

from posttrain.errors import PosttrainError
from posttrain.machine import BF16_FLAGS, cpu_flags, cpu_model, has_native_bf16


def resolve_dtype(setting: str, *, cuda: bool) -> str:
    """The dtype name for `model.dtype` = `setting` on a CUDA GPU (`cuda`) or on CPU; auto is the only one that
    depends on where."""
    if setting == "auto":
        return "bfloat16" if cuda else "float32"
    return setting


def bf16_refusal(cpu: str) -> PosttrainError:
    return PosttrainError(
        f"model.dtype=bfloat16: this CPU ({cpu}) has no native bfloat16 (neither of {', '.join(BF16_FLAGS)} is in "
        "its /proc/cpuinfo flags), so the trainer, reference and engines on it would emulate bfloat16: slower than "
        "float32, with bfloat16's rounding",
        hint="set model.dtype=float32 (or auto, which is float32 on CPU), or run on a CPU with AVX512-BF16 or AMX",
    )


def weights_dtype(setting: str, *, cuda: bool = False, flags: str | None = None) -> str:
    """The dtype name the weights are held in here: `resolve_dtype`, and bfloat16 on CPU only where this CPU
    (`flags`: its /proc/cpuinfo flags line; None reads them) has native bfloat16, else a PosttrainError."""
    dtype = resolve_dtype(setting, cuda=cuda)
    if dtype == "bfloat16" and not cuda and not has_native_bf16(cpu_flags() if flags is None else flags):
        raise bf16_refusal(cpu_model())
    return dtype
