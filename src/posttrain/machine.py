"""What machine a number was measured on, and what its CPU can do. Float results, and so RL trajectories, depend on
the CPU's kernels (AVX-512 vs AVX2, oneDNN's and MKL's choices) and on the thread count, so every measured result
records them; bfloat16 weights are allowed only where the CPU computes in bfloat16 natively (`has_native_bf16`)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# Environment variables that force other numeric kernels (scripts/numerics_matrix.sh sets them).
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")


def cpu_model() -> str:
    """The CPU's model name as lscpu prints it (from /proc/cpuinfo) with its family and model numbers, which a
    VM's generic name ('Intel(R) Xeon(R) Processor') hides; platform.processor() elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown"
    return describe_cpuinfo(lines) or platform.processor() or "unknown"


def describe_cpuinfo(lines: list[str]) -> str | None:
    """'<model name> (family F model M)' from /proc/cpuinfo's lines (its first processor), or None without a name."""
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if not name:
        return None
    numbers = [f"{key} {fields[field]}" for key, field in (("family", "cpu family"), ("model", "model")) if fields.get(field)]
    return f"{name} ({' '.join(numbers)})" if numbers else name


# CPU flags (as /proc/cpuinfo spells them) of native bfloat16 arithmetic: x86's AVX512-BF16 (Cooper Lake, Zen 4 and
# later) and AMX-BF16 (Sapphire Rapids and later), Arm's BF16 (Armv8.6: Graviton3, Neoverse V1). Without them torch
# emulates bfloat16 through float32, slower than float32.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def has_native_bf16(flags: str) -> bool:
    """Whether a CPU whose flags line (space-separated, as in /proc/cpuinfo) is `flags` has native bfloat16."""
    return any(f in BF16_FLAGS for f in flags.split())


def cpu_flags() -> str:
    """The first CPU's flags line from /proc/cpuinfo (x86's "flags", Arm's "Features"; "" where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(("flags", "Features"))), "")


def describe_machine() -> dict:
    """CPU model, cores, memory, the vector ISA torch runs its kernels with, forced-kernel variables, versions."""
    import torch

    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem = next(int(ln.split()[1]) // 1024 // 1024 for ln in meminfo if ln.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem = None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "memory_gib": mem,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": has_native_bf16(cpu_flags()),
            "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__}
