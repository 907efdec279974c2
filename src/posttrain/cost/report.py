"""`posttrain cost`: the build-vs-buy inputs from the price file plus overrides, a table, the break-even, cost.json
and cost.png (matplotlib, Agg backend)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.table import Table

from posttrain.cost.build_vs_buy import (
    CostInputs,
    break_even_gpu_hours,
    break_even_utilization,
    cost_table,
    managed_monthly,
    owned_usd_per_useful_gpu_hour,
    self_run_monthly,
    staff_usd_per_month,
)
from posttrain.cost.prices import load_prices
from posttrain.errors import PosttrainError


def cost_inputs(gpu=None, provider=None, kind="on_demand", price_file=None, overrides=None) -> tuple[CostInputs, dict]:
    """CostInputs from the price file with overrides applied; also where each number came from."""
    prices = load_prices(price_file)
    overrides = dict(overrides or {})
    values = {**prices.self_run, **prices.managed}
    source = {k: f"{prices.path} ({prices.version})" for k in values}
    if "managed_usd_per_gpu_hour" not in overrides:
        row = prices.price(gpu, provider, kind)
        values["managed_usd_per_gpu_hour"] = row.usd_per_gpu_hour
        source["managed_usd_per_gpu_hour"] = f"{row.gpu} {row.provider} {row.kind}: {row.source} ({row.date})"
    for k, v in overrides.items():
        values[k], source[k] = v, "command line"
    try:
        inp = CostInputs(**values)
    except TypeError as e:
        raise PosttrainError(f"{prices.path}: self_run/managed sections do not match the cost model ({e})") from None
    if not 0 < inp.utilization <= 1:
        raise PosttrainError(f"--utilization={inp.utilization}: must be in (0, 1]")
    return inp, source


def plot_cost(inp: CostInputs, path: Path, max_hours: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [max_hours * i / 200 for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [managed_monthly(inp, x) for x in xs], label=f"managed (${inp.managed_usd_per_gpu_hour:.2f}/GPU-h)")
    ax.plot(xs, [self_run_monthly(inp, x) for x in xs], label=f"self-run (utilization {inp.utilization:.0%})")
    be = break_even_gpu_hours(inp)
    if math.isfinite(be) and be <= max_hours:
        ax.axvline(be, color="grey", linestyle="--", label=f"break-even {be:,.0f} GPU-h/month")
    ax.set_xlabel("GPU-hours used per month")
    ax.set_ylabel("$ per month")
    ax.set_title("Build vs buy")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cost_report(console, *, gpu, provider, kind, price_file, hours: str, out: str, overrides: dict) -> dict:
    try:
        grid = [float(h) for h in hours.split(",") if h.strip()]
    except ValueError:
        raise PosttrainError(f"--hours {hours!r}: give comma-separated numbers, e.g. 100,1000,10000") from None
    inp, source = cost_inputs(gpu, provider, kind, price_file, overrides)
    rows = cost_table(inp, grid)
    be, bu = break_even_gpu_hours(inp), break_even_utilization(inp)
    t = Table(title="monthly cost: managed vs self-run")
    for col in ("GPU-h/month", "owned GPUs", "managed $", "self-run $", "cheaper"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['gpu_hours_per_month']:,.0f}", f"{r['owned_gpus']:.1f}", f"{r['managed_usd']:,.0f}",
                  f"{r['self_run_usd']:,.0f}", r["cheaper"])
    console.print(t)
    owned = owned_usd_per_useful_gpu_hour(inp)
    if math.isfinite(be):
        console.print(f"break-even: {be:,.0f} GPU-hours/month (~{be / (730 * inp.utilization):.1f} owned GPUs); "
                      f"above it self-run is cheaper")
    else:
        console.print(f"break-even: none -- an owned useful GPU-hour costs ${owned:.2f} at {inp.utilization:.0%} "
                      f"utilization, more than the managed ${inp.managed_usd_per_gpu_hour:.2f}; owning pays only "
                      f"above {bu:.0%} utilization (and then above the staff cost)")
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    png = plot_cost(inp, outdir / "cost.png", max(max(grid), 2 * be if math.isfinite(be) else 0))
    doc = {"inputs": inp.to_dict(), "sources": source, "owned_usd_per_useful_gpu_hour": owned,
           "staff_usd_per_month": staff_usd_per_month(inp), "break_even_gpu_hours_per_month": be if math.isfinite(be) else None,
           "break_even_utilization": bu, "table": rows, "plot": str(png)}
    (outdir / "cost.json").write_text(json.dumps(doc, indent=1))
    console.print(f"written: {outdir / 'cost.json'}, {png}")
    return doc
