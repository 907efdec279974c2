"""`posttrain plan`, `posttrain cost` and `posttrain launch`: the topology planner, the build-vs-buy model and the
launch specs on the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console(width=160) if not Console().is_terminal else Console()


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def training_line(doc: dict) -> str:
    """What the trainer trains and where the reference logprobs come from, e.g. 'LoRA r=16 on all-linear (168 layers,
    sync merged): 8,798,208 trainable params (1.78% of 494,032,768); reference: in trainer (adapters off)'."""
    total, trainable = doc["policy"]["params"], doc["trainable_params"]
    lo = doc["lora"]
    if lo:
        targets = lo["target_modules"] if isinstance(lo["target_modules"], str) else ",".join(lo["target_modules"])
        what = (f"LoRA r={lo['r']} on {targets} ({lo['adapted_layers']} layers, sync {lo['sync']}): "
                f"{trainable:,} trainable params ({100 * trainable / total:.2f}% of {total:,})")
    else:
        what = f"full fine-tuning: {trainable:,} trainable params"
    return f"{what}; reference: {doc['reference_placement']}"


def plan_table(doc: dict) -> Table:
    t = Table(title=f"plan on {doc['cluster']} (policy {doc['policy']['params'] / 1e9:.2f}B params, "
                    f"{doc['dtype']}, ${doc['usd_per_device_hour']:.2f}/device-hour)")
    for col in ("layout", "fits", "devices per role", "peak GB/dev", "headroom GB", "step s", "$/step", "why not"):
        t.add_column(col, justify="right" if col in ("peak GB/dev", "headroom GB", "step s", "$/step") else "left")
    for p in doc["layouts"]:
        mark = "*" if p["layout"] == doc["chosen"] else ""
        roles = " ".join(f"{r}:{len(ids)}" for r, ids in p["devices"].items())
        has = bool(p["devices"])
        t.add_row(p["layout"] + mark, "yes" if p["feasible"] else "no", roles,
                  _gb(p["peak_bytes_per_device"]) if has else "-", _gb(p["headroom_bytes"]) if has else "-",
                  f"{p['step_seconds']:.2f}" if p["step_seconds"] is not None and has else "-",
                  f"{p['usd_per_step']:.4f}" if p["usd_per_step"] is not None and has else "-", p["reason"])
    return t


def memory_table(plan: dict, reference_placement: str = "") -> Table:
    t = Table(title=f"{plan['layout']}: memory per device by role (GB)")
    for col in ("role", "devices", "resident", "working set", "phase", "engine tp"):
        t.add_column(col)
    for role, m in plan["memory"].items():
        t.add_row(role, str(m["devices"]), " + ".join(f"{k} {_gb(v)}" for k, v in m["resident"].items()) or "-",
                  " + ".join(f"{k} {_gb(v)}" for k, v in m["working"].items()), m["phase"],
                  str(m["engine_tp"] or "-"))
    if "reference" not in plan["memory"] and reference_placement.startswith("in trainer"):
        t.add_row("reference", "-", reference_placement, "in the policy's", "reference", "-")
    return t


def plan(
    config: Optional[str] = typer.Argument(None, help="YAML run config (default: built-in)."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. algorithm.group_size=16"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="e.g. 2x8xH100-80GB (default topology.cluster)."),
    policy_config: Optional[str] = typer.Option(None, "--policy-config", help="HF config dir or config.json of "
                                                "the policy (default model.path); no weights needed."),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="Prompt length (default: "
                                                "max_model_len - max_new_tokens, an upper bound)."),
    price: Optional[float] = typer.Option(None, "--price", help="$ per device-hour (default: price file)."),
    prices: Optional[str] = typer.Option(None, "--prices", help="Price file (default: the built-in one)."),
    out: Optional[str] = typer.Option(None, "--out", help="Write the plan as JSON here."),
):
    """Plan where the roles go: memory per device, feasibility, step time and cost for each layout."""
    from posttrain.cli.common import split_config_args
    from posttrain.config import load_config
    from posttrain.topology.from_config import plan_document, plan_for_config

    config, overrides = split_config_args(config, overrides or [])
    cfg = load_config(config, overrides)
    inp, plans, chosen = plan_for_config(cfg, cluster=cluster, policy_config=policy_config,
                                         prompt_tokens=prompt_tokens, usd_per_device_hour=price, price_file=prices)
    doc = plan_document(inp, plans, chosen)
    console.print(training_line(doc))
    console.print(plan_table(doc))
    if chosen is not None:
        console.print(memory_table(chosen.to_dict(), doc["reference_placement"]))
        console.print(f"chosen: {chosen.layout} (topology.mode={cfg.topology.mode})")
    else:
        console.print("no layout fits: see 'why not' (try topology.micro_batch, activation_checkpointing, "
                      "or more devices)")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(doc, indent=1))
        console.print(f"plan written to {out}")

def cost(
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU row of the price file (default: its default_gpu)."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Provider row (default: default_provider)."),
    kind: str = typer.Option("on_demand", "--kind", help="on_demand | spot | reserved"),
    price: Optional[float] = typer.Option(None, "--price", help="Managed $/GPU-hour (overrides the row)."),
    prices: Optional[str] = typer.Option(None, "--prices", help="Price file (default: the built-in one)."),
    capex: Optional[float] = typer.Option(None, "--capex", help="Owned all-in $ per GPU."),
    amortization_months: Optional[float] = typer.Option(None, "--amortization-months"),
    power_hosting: Optional[float] = typer.Option(None, "--power-hosting", help="$ per owned GPU per month."),
    utilization: Optional[float] = typer.Option(None, "--utilization", help="Useful share of owned GPU-hours."),
    engineers: Optional[float] = typer.Option(None, "--engineers", help="Platform engineers (FTE)."),
    salary: Optional[float] = typer.Option(None, "--salary", help="$ per engineer-year, fully loaded."),
    on_call: Optional[float] = typer.Option(None, "--on-call", help="$ per month of on-call."),
    preemption: Optional[float] = typer.Option(None, "--preemption", help="Managed hours redone (spot), e.g. 0.1."),
    hours: str = typer.Option("100,500,1000,2000,5000,10000,20000,50000", "--hours",
                              help="GPU-hours per month for the table, comma-separated."),
    out: str = typer.Option("runs/cost", "--out", help="Directory for cost.json and cost.png."),
    runs: list[str] = typer.Option(None, "--runs", help="Run directories (comma-separated or repeated) whose "
                                   "interruptions.jsonl measures the on-call line; without, it is an assumption."),
    intervention_minutes: Optional[float] = typer.Option(None, "--intervention-minutes",
                                                         help="A person's minutes per interruption (assumption)."),
    response_hours: Optional[str] = typer.Option(None, "--response-hours", help="WORKING,OFF: hours until a "
                                                 "person restarts a stopped run, in and out of working hours."),
    utc_offset: Optional[float] = typer.Option(None, "--utc-offset", help="The team's time zone, hours from UTC "
                                               "(tells working hours from nights)."),
):
    """Build vs buy: monthly cost of renting vs running your own cluster, the break-even, a table and a plot;
    with --runs, the runs' interruptions (recovered device-hours, interventions avoided) and a measured on-call."""
    from posttrain.cost.report import cost_report
    from posttrain.errors import PosttrainError

    overrides = dict(capex_usd_per_gpu=capex, amortization_months=amortization_months,
                     power_hosting_usd_per_gpu_month=power_hosting, utilization=utilization,
                     platform_engineers=engineers, engineer_usd_per_year=salary, on_call_usd_per_month=on_call,
                     preemption_overhead=preemption, managed_usd_per_gpu_hour=price)
    on_call = dict(minutes_per_intervention=intervention_minutes, utc_offset_hours=utc_offset)
    if response_hours is not None:
        try:
            on_call["response_hours_working"], on_call["response_hours_off"] = map(float, response_hours.split(","))
        except ValueError:
            raise PosttrainError(f"--response-hours {response_hours!r}: give WORKING,OFF in hours, "
                                 "e.g. 0.5,8") from None
    cost_report(console, gpu=gpu, provider=provider, kind=kind, price_file=prices, hours=hours, out=out,
                overrides={k: v for k, v in overrides.items() if v is not None},
                runs=[d for arg in runs or [] for d in arg.split(",") if d.strip()],
                on_call_overrides={k: v for k, v in on_call.items() if v is not None})

def launch(
    config: str = typer.Argument(..., help="YAML run config."),
    target: str = typer.Option(..., "--target", help="skypilot | slurm | kuberay | ray"),
    out: Optional[str] = typer.Option(None, "--out", help="Directory for the spec (skypilot, slurm, kuberay)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray dashboard address for --target ray, "
                                          "e.g. http://127.0.0.1:8265."),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="e.g. 2x8xH100-80GB (default topology.cluster)."),
    image: str = typer.Option("rayproject/ray:2.60.0-py312", "--image", help="Container image (kuberay)."),
    checkpoint_bucket: Optional[str] = typer.Option(None, "--checkpoint-bucket",
                                                    help="SkyPilot bucket mounted for runs/ (spot recovery)."),
    spot: bool = typer.Option(True, "--spot/--on-demand", help="SkyPilot: spot with recovery, or on-demand."),
    wait: bool = typer.Option(False, "--wait", help="--target ray: wait for the job and print its logs."),
):
    """Write a launch spec (SkyPilot task, Slurm batch script, KubeRay RayJob) or submit to a Ray cluster."""
    from posttrain.orchestration.launch import launch_command

    launch_command(console, config, target, out=out, address=address, cluster=cluster, image=image,
                   checkpoint_bucket=checkpoint_bucket, spot=spot, wait=wait)

