"""The device data table (peak rates, memory, assumed utilization) and cluster strings like `2x8xH100-80GB`.

Peak rates are datasheet dense figures; utilizations are the planner's assumptions (the MFU seen in practice for
training, lower for inference), overridable on the command line. Sources: /work/shared/reference
cost-and-memory-facts.md (Hopper ~990 TFLOP/s dense bf16; H100 80 GB at 3.35 TB/s; H200 141 GB at 4.8 TB/s; Llama 3.1
pre-training MFU 38-43%)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from posttrain.errors import PosttrainError

GB = 1e9


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: float  # per device
    peak_flops: float  # dense 16-bit FLOP/s (fp32 for CPU)
    memory_bandwidth: float  # bytes/s
    train_mfu: float  # assumed share of peak reached in training
    inference_mfu: float  # assumed share of peak reached in prefill/scoring forward passes
    link_bandwidth: float  # bytes/s between nodes (weight sync across a split)
    ray_resource: str  # the Ray resource that stands for one device


# Peak dense bf16 FLOP/s: H100/H200 SXM 989e12 (NVIDIA datasheet, "~990" in the facts file); A100 312e12; L40S 362e12.
# The CPU row is this project's 2-core test machine order of magnitude (fp32, AVX2): a stand-in, measured in
# benchmarks/plan_validation.py rather than quoted.
DEVICES: dict[str, Device] = {
    "H100-80GB": Device("H100-80GB", 80 * GB, 989e12, 3.35e12, 0.40, 0.30, 50e9, "GPU"),
    "H200-141GB": Device("H200-141GB", 141 * GB, 989e12, 4.8e12, 0.40, 0.30, 50e9, "GPU"),
    "A100-80GB": Device("A100-80GB", 80 * GB, 312e12, 2.0e12, 0.45, 0.30, 25e9, "GPU"),
    "A100-40GB": Device("A100-40GB", 40 * GB, 312e12, 1.56e12, 0.45, 0.30, 25e9, "GPU"),
    "L40S-48GB": Device("L40S-48GB", 48 * GB, 362e12, 0.864e12, 0.35, 0.25, 12.5e9, "GPU"),
    "CPU-8GB": Device("CPU-8GB", 8 * GB, 50e9, 20e9, 0.10, 0.10, 5e9, "CPU"),
}
ALIASES = {"H100": "H100-80GB", "H200": "H200-141GB", "A100": "A100-80GB", "L40S": "L40S-48GB", "CPU": "CPU-8GB"}


@dataclass(frozen=True)
class Cluster:
    nodes: int
    devices_per_node: int
    device: Device

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.devices_per_node}x{self.device.name}"


_CLUSTER = re.compile(r"^(?:(\d+)x)?(\d+)x([A-Za-z0-9]+)(?:-(\d+)GB)?$")


def lookup_device(name: str, memory_gb: float | None = None) -> Device:
    exact = f"{name}-{memory_gb:g}GB" if memory_gb is not None else name
    base = DEVICES.get(exact) or DEVICES.get(ALIASES.get(name, name))
    if base is None:
        stem = name.split("-")[0]
        base = DEVICES.get(ALIASES.get(stem, stem))
    if base is None:
        raise PosttrainError(
            f"unknown device {name!r}", hint=f"use one of {', '.join(DEVICES)} (or its short name {', '.join(ALIASES)})"
        )
    if memory_gb is not None and memory_gb * GB != base.memory_bytes:
        base = replace(base, name=f"{base.name.split('-')[0]}-{memory_gb:g}GB", memory_bytes=memory_gb * GB)
    return base


def parse_cluster(text: str) -> Cluster:
    """'2x8xH100-80GB' -> 2 nodes of 8 H100 80 GB; '8xH100' -> one node of 8; memory suffix optional."""
    m = _CLUSTER.match(text.strip())
    if not m:
        raise PosttrainError(
            f"cluster {text!r} is not of the form NODESxDEVICESxTYPE[-MEMGB]", hint="e.g. 2x8xH100-80GB or 8xH100"
        )
    nodes, per_node, kind, mem = m.groups()
    nodes_n, per_node_n = int(nodes or 1), int(per_node)
    if nodes_n < 1 or per_node_n < 1:
        raise PosttrainError(f"cluster {text!r}: nodes and devices per node must be at least 1")
    stem = kind.upper() if kind.upper() in ALIASES else kind
    return Cluster(nodes_n, per_node_n, lookup_device(stem, float(mem) if mem else None))
