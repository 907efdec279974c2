"""Build vs buy: monthly cost of renting GPU-hours from a managed provider against running one's own cluster, as a
function of the GPU-hours a team actually uses per month. Pure functions; inputs in $, months and hours.

Renting: hours * price * (1 + preemption overhead: work redone after spot preemptions).
Owning: enough GPUs to deliver those hours at the cluster's real utilization (hours / (730 * utilization), a
continuous fleet), each costing amortized capex + power and hosting per month, plus platform engineers and on-call,
which are paid whatever the usage, plus on-call per GPU-hour used when it is measured from runs' interruptions
(oncall.py: interventions per device-hour x a person's time each). The break-even is where the two lines cross."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

HOURS_PER_MONTH = 730.0  # 365 * 24 / 12


@dataclass(frozen=True)
class CostInputs:
    managed_usd_per_gpu_hour: float
    capex_usd_per_gpu: float
    amortization_months: float
    power_hosting_usd_per_gpu_month: float
    utilization: float  # share of an owned GPU's hours doing useful work
    platform_engineers: float
    engineer_usd_per_year: float
    on_call_usd_per_month: float  # fixed (an assumption, or a stipend on top of the measured line)
    preemption_overhead: float = 0.0  # extra share of hours redone on the managed side (spot)
    on_call_usd_per_gpu_hour: float = 0.0  # measured: interventions per GPU-hour used x their cost (oncall.py)

    def to_dict(self) -> dict:
        return asdict(self)


def owned_usd_per_gpu_month(c: CostInputs) -> float:
    return c.capex_usd_per_gpu / c.amortization_months + c.power_hosting_usd_per_gpu_month


def staff_usd_per_month(c: CostInputs) -> float:
    return c.platform_engineers * c.engineer_usd_per_year / 12 + c.on_call_usd_per_month


def owned_usd_per_useful_gpu_hour(c: CostInputs) -> float:
    """Hardware cost of one useful GPU-hour on an owned cluster (without staff)."""
    return owned_usd_per_gpu_month(c) / (HOURS_PER_MONTH * c.utilization)


def managed_monthly(c: CostInputs, gpu_hours: float) -> float:
    return gpu_hours * c.managed_usd_per_gpu_hour * (1 + c.preemption_overhead)


def on_call_monthly(c: CostInputs, gpu_hours: float) -> float:
    return c.on_call_usd_per_month + gpu_hours * c.on_call_usd_per_gpu_hour


def self_run_monthly(c: CostInputs, gpu_hours: float) -> float:
    return gpu_hours * (owned_usd_per_useful_gpu_hour(c) + c.on_call_usd_per_gpu_hour) + staff_usd_per_month(c)


def break_even_gpu_hours(c: CostInputs) -> float:
    """GPU-hours per month above which owning is cheaper; inf when a useful owned hour costs at least the rented
    one (then owning never pays, whatever the volume)."""
    margin = (c.managed_usd_per_gpu_hour * (1 + c.preemption_overhead) - owned_usd_per_useful_gpu_hour(c)
              - c.on_call_usd_per_gpu_hour)
    return staff_usd_per_month(c) / margin if margin > 0 else math.inf


def break_even_utilization(c: CostInputs) -> float:
    """Utilization at which an owned useful GPU-hour (with its measured on-call) costs the rented price (fixed staff
    aside); > 1 means never, inf when the on-call per hour alone exceeds the rented price."""
    margin = c.managed_usd_per_gpu_hour * (1 + c.preemption_overhead) - c.on_call_usd_per_gpu_hour
    return owned_usd_per_gpu_month(c) / (HOURS_PER_MONTH * margin) if margin > 0 else math.inf


def cost_table(c: CostInputs, gpu_hours: list[float]) -> list[dict]:
    rows = []
    for h in gpu_hours:
        buy, own = managed_monthly(c, h), self_run_monthly(c, h)
        rows.append({"gpu_hours_per_month": h, "owned_gpus": h / (HOURS_PER_MONTH * c.utilization),
                     "managed_usd": buy, "self_run_usd": own, "on_call_usd": on_call_monthly(c, h),
                     "cheaper": "managed" if buy <= own else "self-run"})
    return rows
