"""The topology planner: for a cluster and the run's models, enumerate layouts (everything colocated; policy +
reference apart from reward + critic; every role on its own devices), give each its per-device memory and headroom,
feasibility (with the reason when it does not fit), predicted step time and cost per step, and pick one.

Roles: `rollout` (the generation engine, policy weights + KV cache), `policy` (the trainer: weights, gradients,
Adam states, activations), `reference` (frozen policy copy, forward only; only with a KL term), `reward` (a reward
model, forward only; absent for rule-based verifiers), `critic` (value model, trained; absent for GRPO) and
`teacher` (on-policy distillation's teacher, its own shape, forward only in the reference's phase; only for opd).
With LoRA (`lora`) the trainer holds the frozen base once plus the adapters' training states, and there is no
reference role: the trainer's base with the adapters off gives the reference logprobs (topology/lora.py).
Phases run one after another (the loop's order), so a device's peak is its resident memory plus the largest
working set of any one phase; a colocated engine sleeps (releases weights and KV cache) while the trainer runs."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from posttrain.topology import flops as F
from posttrain.topology import lora as L
from posttrain.topology import memory as M
from posttrain.topology.devices import Cluster
from posttrain.topology.model_shape import ModelShape

USABLE_FRACTION = 0.9  # of device memory: the rest for the CUDA context, allocator fragmentation and buffers
LAYOUTS = ("colocated", "split_pairs", "split")
PHASES = ("generate", "reward", "reference", "values", "train_policy", "train_critic", "sync")


@dataclass(frozen=True)
class PlanInputs:
    cluster: Cluster
    policy: ModelShape
    workload: F.Workload
    dtype: str = "bfloat16"
    reference: bool = True
    reward: ModelShape | None = None
    critic: ModelShape | None = None
    checkpointing: bool = False
    usd_per_device_hour: float = 0.0
    lora: L.LoraShape | None = None  # None: full fine-tuning
    teacher: ModelShape | None = None  # opd's teacher (distill.teacher); None: no distillation

    @property
    def reference_in_trainer(self) -> bool:
        """LoRA with a KL term: the reference logprobs come from the trainer's base with the adapters off."""
        return self.reference and self.lora is not None

    @property
    def trainable_params(self) -> int:
        return L.lora_trainable_params(self.policy, self.lora) if self.lora else self.policy.params

    def roles(self) -> list[str]:
        """Roles that hold a model, in device-assignment order (the engine last, so it shares a node with the
        trainer it syncs from only when the others leave room)."""
        out = ["policy"]
        out += ["reference"] if self.reference and not self.lora else []
        out += ["teacher"] if self.teacher else []
        out += ["critic"] if self.critic else []
        out += ["reward"] if self.reward else []
        return out + ["rollout"]


@dataclass
class RoleMemory:
    """Bytes per device of one role on `devices` devices: always resident, and working set in its phase."""

    role: str
    devices: int
    resident: dict[str, float]
    working: dict[str, float]
    phase: str
    engine_tp: int = 0

    @property
    def total(self) -> float:
        return sum(self.resident.values()) + sum(self.working.values())


@dataclass
class LayoutPlan:
    layout: str
    feasible: bool
    reason: str
    devices: dict[str, list[int]]  # role -> global device ids (node = id // devices_per_node)
    memory: dict[str, dict] = field(default_factory=dict)  # role -> RoleMemory as a dict
    peak_bytes_per_device: float = 0.0
    headroom_bytes: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    step_seconds: float = math.inf
    usd_per_step: float = math.inf

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("step_seconds", "usd_per_step"):
            d[k] = None if math.isinf(d[k]) else d[k]
        return d


# ------------------------------------------------------------------------------------------ memory per role


def engine_tp(inp: PlanInputs, devices: int) -> int:
    """Tensor-parallel degree of each rollout engine: the smallest power of two (within a node and within the
    role's devices) at which the weights take at most half of the usable memory, leaving the rest for KV cache."""
    w = M.weight_bytes(inp.policy, inp.dtype)
    usable = inp.cluster.device.memory_bytes * USABLE_FRACTION
    limit = min(inp.cluster.devices_per_node, devices)
    tp = 1
    while w / tp > 0.5 * usable and tp * 2 <= limit:
        tp *= 2
    return tp


def role_memory(inp: PlanInputs, role: str, devices: int) -> RoleMemory:
    w = inp.workload
    micro = w.micro_batch_per_device(devices)
    if role == "policy" and inp.lora:
        return lora_policy_memory(inp, devices, micro)
    if role in ("policy", "critic"):
        shape = inp.policy if role == "policy" else inp.critic
        return RoleMemory(
            role, devices,
            resident={"train_states": M.train_state_bytes(shape, inp.dtype, devices)},
            working={"activations": M.activation_bytes(shape, w.seq_len, micro, inp.dtype, inp.checkpointing)},
            phase="train_" + role,
        )
    if role in ("reference", "reward", "teacher"):
        shape = {"reference": inp.policy, "reward": inp.reward, "teacher": inp.teacher}[role]
        one_layer = M.forward_activation_bytes(shape, w.seq_len, micro, inp.dtype)
        # the teacher scores the samples while the reference does (step.py): the same phase
        return RoleMemory(role, devices, resident={"weights": M.weight_bytes(shape, inp.dtype) / devices},
                          working={"activations": one_layer}, phase="reference" if role == "teacher" else role)
    tp = engine_tp(inp, devices)
    kv = M.kv_cache_bytes(inp.policy, inp.dtype, w.scored_tokens) / devices
    return RoleMemory(role, devices, resident={},
                      working={"engine_weights": M.weight_bytes(inp.policy, inp.dtype) / tp, "kv_cache": kv},
                      phase="generate", engine_tp=tp)


def lora_policy_memory(inp: PlanInputs, devices: int, micro: int) -> RoleMemory:
    """The LoRA trainer: frozen base + adapter states resident; its working set is the larger of the training pass
    (the full model's activations, since gradients flow back through every layer to the first adapter, plus the
    adapters' own) and, with a KL term, the reference forward it runs with the adapters off (no graph kept). On
    several ranks every rank holds the whole frozen base and the whole adapters (training/distributed.py does not
    shard a LoRA policy: it all-reduces the adapters' gradients), so nothing here divides by `devices`."""
    w, shape, lora = inp.workload, inp.policy, inp.lora
    train = M.activation_bytes(shape, w.seq_len, micro, inp.dtype, inp.checkpointing)
    if not inp.checkpointing:  # full recomputation recomputes the adapters' tensors too
        train += (w.seq_len * micro * L.lora_activation_elements_per_token(shape, lora)
                  * M.BYTES_PER_ELEMENT[inp.dtype])
    reference = M.forward_activation_bytes(shape, w.seq_len, micro, inp.dtype) if inp.reference else 0.0
    return RoleMemory(
        "policy", devices,
        resident={"frozen_weights": M.weight_bytes(shape, inp.dtype),
                  "adapter_states": M.adapter_state_bytes(inp.trainable_params, inp.dtype)},
        working={"activations": max(train, reference)}, phase="train_policy",
    )


def sync_bytes(inp: PlanInputs) -> float:
    """What one weight sync sends: every weight for full fine-tuning; with LoRA the adapted layers' merged weights
    (sync 'merged') or the adapters alone (sync 'adapter')."""
    if inp.lora is None:
        return M.weight_bytes(inp.policy, inp.dtype)
    elements = (L.adapted_weight_params(inp.policy, inp.lora) if inp.lora.sync == "merged"
                else L.lora_trainable_params(inp.policy, inp.lora))
    return elements * M.BYTES_PER_ELEMENT[inp.dtype]


def device_peaks(mems: dict[str, RoleMemory], groups: dict[str, list[int]], n_devices: int) -> list[float]:
    """Peak bytes on each device: resident of every role there + the largest phase working set there."""
    peaks = []
    for d in range(n_devices):
        here = [mems[r] for r, ids in groups.items() if d in ids]
        resident = sum(sum(m.resident.values()) for m in here)
        by_phase: dict[str, float] = {}
        for m in here:
            by_phase[m.phase] = by_phase.get(m.phase, 0.0) + sum(m.working.values())
        peaks.append(resident + max(by_phase.values(), default=0.0))
    return peaks


# ------------------------------------------------------------------------------------------ time per phase


def phase_seconds(inp: PlanInputs, groups: dict[str, list[int]], mems: dict[str, RoleMemory]) -> dict[str, float]:
    dev, w = inp.cluster.device, inp.workload
    n = {r: len(ids) for r, ids in groups.items()}
    t = dict.fromkeys(PHASES, 0.0)
    N = inp.policy.params
    gen_flops = F.forward_flops(N, w.sequences * w.prompt_tokens) + F.forward_flops(N, w.generated_tokens)
    t["generate"] = max(
        F.compute_seconds(gen_flops, n["rollout"], dev.peak_flops, dev.inference_mfu),
        F.decode_seconds(mems["rollout"].working["engine_weights"], w.completion_tokens, dev.memory_bandwidth),
    )
    if inp.reward:
        t["reward"] = F.compute_seconds(F.forward_flops(inp.reward.params, w.scored_tokens), n["reward"],
                                        dev.peak_flops, dev.inference_mfu)
    if inp.reference:  # with LoRA on the trainer's devices, adapters off
        t["reference"] = F.compute_seconds(F.forward_flops(N, w.scored_tokens),
                                           n["policy" if inp.lora else "reference"], dev.peak_flops, dev.inference_mfu)
    if inp.teacher:  # concurrent with the reference, but perhaps on its devices: counted on top (an upper bound)
        t["reference"] += F.compute_seconds(F.forward_flops(inp.teacher.params, w.scored_tokens), n["teacher"],
                                            dev.peak_flops, dev.inference_mfu)
    trained = w.scored_tokens * w.train_passes
    if inp.critic:
        c = inp.critic.params
        t["values"] = F.compute_seconds(F.forward_flops(c, w.scored_tokens), n["critic"], dev.peak_flops,
                                        dev.inference_mfu)
        t["train_critic"] = F.compute_seconds(F.train_flops(c, trained), n["critic"], dev.peak_flops, dev.train_mfu)
    train = F.lora_train_flops(N, inp.trainable_params, trained) if inp.lora else F.train_flops(N, trained)
    t["train_policy"] = F.compute_seconds(train, n["policy"], dev.peak_flops, dev.train_mfu)
    # Weight sync: on the same devices it is a copy in device memory; across devices it crosses the node link.
    same = set(groups["rollout"]) <= set(groups["policy"])
    bw = dev.memory_bandwidth if same else dev.link_bandwidth
    t["sync"] = sync_bytes(inp) / bw
    return t


# ------------------------------------------------------------------------------------------ layouts


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def evaluate(inp: PlanInputs, layout: str, groups: dict[str, list[int]]) -> LayoutPlan:
    """Memory, feasibility, time and cost of one assignment of roles to devices."""
    c = inp.cluster
    mems = {r: role_memory(inp, r, len(ids)) for r, ids in groups.items()}
    peaks = device_peaks(mems, groups, c.devices)
    usable = c.device.memory_bytes * USABLE_FRACTION
    worst = max(range(c.devices), key=lambda d: peaks[d])
    plan = LayoutPlan(layout, True, "", groups, {r: asdict(m) for r, m in mems.items()}, peaks[worst],
                      c.device.memory_bytes - peaks[worst])
    if peaks[worst] > usable:
        roles_there = [r for r, ids in groups.items() if worst in ids]
        parts = ", ".join(f"{r} {_gb(mems[r].total)}" for r in roles_there)
        plan.feasible = False
        plan.reason = (f"device {worst} needs {_gb(peaks[worst])} ({parts}) > {_gb(usable)} usable of "
                       f"{_gb(c.device.memory_bytes)}")
    plan.phase_seconds = phase_seconds(inp, groups, mems)
    plan.step_seconds = sum(plan.phase_seconds.values())
    plan.usd_per_step = plan.step_seconds * c.devices * inp.usd_per_device_hour / 3600
    return plan


def _contiguous(sizes: dict[str, int]) -> dict[str, list[int]]:
    out, start = {}, 0
    for role, k in sizes.items():
        out[role] = list(range(start, start + k))
        start += k
    return out


def colocated(inp: PlanInputs) -> LayoutPlan:
    all_ids = list(range(inp.cluster.devices))
    return evaluate(inp, "colocated", {r: all_ids for r in inp.roles()})


def _best(plans: list[LayoutPlan]) -> LayoutPlan:
    """Fastest feasible, or when none fits the one that misses by the least memory."""
    feasible = [p for p in plans if p.feasible]
    if feasible:
        return min(feasible, key=lambda p: p.step_seconds)
    return min(plans, key=lambda p: p.peak_bytes_per_device)


def split_pairs(inp: PlanInputs) -> LayoutPlan:
    """policy + reference (+ teacher, rollout engine) on one device set, reward + critic on the other."""
    a = [r for r in inp.roles() if r in ("policy", "reference", "teacher", "rollout")]
    b = [r for r in inp.roles() if r in ("reward", "critic")]
    n = inp.cluster.devices
    if not b or n < 2:
        why = "no reward model or critic to place apart (rule-based reward, no critic)" if not b else "needs 2+ devices"
        return LayoutPlan("split_pairs", False, f"not applicable: {why}", {})
    plans = []
    for kb in range(1, n):
        ids_a, ids_b = list(range(0, n - kb)), list(range(n - kb, n))
        plans.append(evaluate(inp, "split_pairs", {**{r: ids_a for r in a}, **{r: ids_b for r in b}}))
    return _best(plans)


def min_devices(inp: PlanInputs, role: str) -> int | None:
    """Fewest devices on which the role alone fits, or None when it fits on none of the cluster's."""
    usable = inp.cluster.device.memory_bytes * USABLE_FRACTION
    for k in range(1, inp.cluster.devices + 1):
        if role_memory(inp, role, k).total <= usable:
            return k
    return None


def split(inp: PlanInputs) -> LayoutPlan:
    """Every role on its own devices: each gets the fewest that hold it, then spare devices go one by one to the
    role whose phase time drops the most (the step is the sum of the phases)."""
    roles, n = inp.roles(), inp.cluster.devices
    if n < len(roles):
        return LayoutPlan("split", False, f"not applicable: {len(roles)} roles need at least {len(roles)} devices", {})
    need = {r: min_devices(inp, r) for r in roles}
    if any(v is None for v in need.values()):
        r = next(r for r, v in need.items() if v is None)
        all_in = role_memory(inp, r, n)
        return LayoutPlan("split", False, f"{r} alone needs {_gb(all_in.total)} per device even on all {n} devices", {})
    if sum(need.values()) > n:
        return LayoutPlan("split", False, f"roles need {sum(need.values())} devices at least ({need}), cluster has {n}", {})
    sizes = dict(need)
    for _ in range(n - sum(sizes.values())):
        def step_with(role):
            trial = {**sizes, role: sizes[role] + 1}
            return evaluate(inp, "split", _contiguous(trial)).step_seconds
        sizes[min(roles, key=step_with)] += 1
    return evaluate(inp, "split", _contiguous(sizes))


def plan_layouts(inp: PlanInputs) -> list[LayoutPlan]:
    return [colocated(inp), split_pairs(inp), split(inp)]


def choose(plans: list[LayoutPlan], mode: str) -> LayoutPlan | None:
    """mode 'auto': the cheapest feasible plan (ties: fewer seconds); a layout name: that plan. None if none fits."""
    if mode in LAYOUTS:
        return next(p for p in plans if p.layout == mode)
    feasible = [p for p in plans if p.feasible]
    return min(feasible, key=lambda p: (p.usd_per_step, p.step_seconds)) if feasible else None
