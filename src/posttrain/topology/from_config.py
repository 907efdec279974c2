"""The planner's inputs from a run config: cluster, model shapes (read from HF configs, no weights), the step's
token counts and the price. The only I/O of the planner (reading config.json files and the price file)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from posttrain.config import RunConfig
from posttrain.errors import PosttrainError
from posttrain.models.dtype import resolve_dtype
from posttrain.topology.devices import Cluster, parse_cluster
from posttrain.topology.flops import Workload
from posttrain.topology.lora import LoraShape, adapted_layers
from posttrain.topology.model_shape import read_model_shape
from posttrain.topology.plan import LayoutPlan, PlanInputs, choose, plan_layouts


def workload_from_config(cfg: RunConfig, prompt_tokens: int | None = None) -> Workload:
    """Token counts of one step. Without a measured prompt length, the longest the engine accepts
    (max_model_len - max_new_tokens) is used: an upper bound, like max_new_tokens for completions."""
    a, r = cfg.algorithm, cfg.rollout
    prompt = prompt_tokens or max(1, r.vllm.max_model_len - r.max_new_tokens)
    return Workload(a.prompts_per_step * a.group_size, prompt, r.max_new_tokens, a.updates_per_batch, a.minibatches,
                    cfg.topology.micro_batch)


def device_price(cluster: Cluster, price_file: str | None = None) -> float:
    """On-demand $/device-hour of the cluster's device at the price file's default provider; 0 for CPU slots."""
    from posttrain.cost.prices import load_prices

    if cluster.device.ray_resource == "CPU":
        return 0.0
    prices = load_prices(price_file)
    name = cluster.device.name
    for gpu in (name, name.split("-")[0]):
        if any(r.gpu == gpu and r.provider == prices.default_provider and r.kind == "on_demand" for r in prices.rows):
            return prices.price(gpu).usd_per_gpu_hour
    return 0.0


def lora_shape(cfg: RunConfig) -> LoraShape | None:
    """model.lora as the planner reads it; None for full fine-tuning."""
    lo = cfg.model.lora
    if lo is None:
        return None
    targets = lo.target_modules if isinstance(lo.target_modules, str) else tuple(lo.target_modules)
    return LoraShape(r=lo.r, target_modules=targets, dropout=lo.dropout, sync=lo.sync)


def plan_inputs(cfg: RunConfig, cluster: str | None = None, policy_config: str | None = None,
                prompt_tokens: int | None = None, usd_per_device_hour: float | None = None,
                price_file: str | None = None) -> PlanInputs:
    text = cluster or cfg.topology.cluster
    if not text:
        raise PosttrainError("no cluster to plan for", hint="pass --cluster 2x8xH100-80GB or set topology.cluster")
    c = parse_cluster(text)
    policy_path = policy_config or cfg.model.path
    if not (Path(policy_path) / "config.json").is_file() and not Path(policy_path).is_file():
        raise PosttrainError(
            f"model.path={policy_path!r} has no config.json to size the policy from",
            hint="pass --policy-config with an HF config directory or config.json (no weights needed)",
        )
    t = cfg.topology
    price = usd_per_device_hour or t.usd_per_device_hour
    policy, lora = read_model_shape(policy_path), lora_shape(cfg)
    if lora:
        adapted_layers(policy, lora.target_modules)  # a target naming no linear layer stops here, named
    return PlanInputs(
        cluster=c,
        policy=policy,
        lora=lora,
        workload=workload_from_config(cfg, prompt_tokens),
        dtype=resolve_dtype(cfg.model.dtype, cuda=c.device.ray_resource == "GPU"),  # auto, for the cluster's devices
        reference=cfg.algorithm.kl_coef > 0,
        reward=read_model_shape(t.reward_model) if t.reward_model else None,
        critic=read_model_shape(t.critic_model) if t.critic_model else None,
        teacher=read_model_shape(cfg.distill.teacher) if cfg.distill.teacher else None,
        checkpointing=t.activation_checkpointing,
        usd_per_device_hour=price if price is not None else device_price(c, price_file),
    )


def plan_for_config(cfg: RunConfig, **kw) -> tuple[PlanInputs, list[LayoutPlan], LayoutPlan | None]:
    """All layouts and the one topology.mode picks ('manual' and 'auto' both report the cheapest feasible)."""
    inp = plan_inputs(cfg, **kw)
    plans = plan_layouts(inp)
    mode = cfg.topology.mode if cfg.topology.mode not in ("manual",) else "auto"
    return inp, plans, choose(plans, mode)


def reference_placement(inp: PlanInputs) -> str:
    if not inp.reference:
        return "none (algorithm.kl_coef = 0)"
    return "in trainer (adapters off)" if inp.reference_in_trainer else "own actor (a frozen copy of the policy)"


def plan_document(inp: PlanInputs, plans: list[LayoutPlan], chosen: LayoutPlan | None) -> dict:
    """The JSON written by `posttrain plan --out`."""
    return {
        "cluster": str(inp.cluster),
        "device": asdict(inp.cluster.device),
        "policy": {**asdict(inp.policy), "params": inp.policy.params},
        "reward": {**asdict(inp.reward), "params": inp.reward.params} if inp.reward else None,
        "critic": {**asdict(inp.critic), "params": inp.critic.params} if inp.critic else None,
        "teacher": {**asdict(inp.teacher), "params": inp.teacher.params} if inp.teacher else None,
        "workload": asdict(inp.workload),
        "dtype": inp.dtype,
        "reference": inp.reference,
        "reference_placement": reference_placement(inp),
        "lora": {**asdict(inp.lora), "adapted_layers": len(adapted_layers(inp.policy, inp.lora.target_modules))}
        if inp.lora else None,
        "trainable_params": inp.trainable_params,
        "activation_checkpointing": inp.checkpointing,
        "usd_per_device_hour": inp.usd_per_device_hour,
        "layouts": [p.to_dict() for p in plans],
        "chosen": chosen.layout if chosen else None,
    }
