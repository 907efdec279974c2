"""`posttrain cost`: the build-vs-buy inputs from the price file plus overrides, a table, the break-even, cost.json
and cost.png (matplotlib, Agg backend). With --runs the on-call line is measured from the runs' interruptions
(oncall_report.py); without, it is the price file's assumption."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from posttrain.cost.build_vs_buy import (
    CostInputs,
    break_even_gpu_hours,
    break_even_utilization,
    cost_table,
    managed_monthly,
    on_call_monthly,
    owned_usd_per_useful_gpu_hour,
    self_run_monthly,
    staff_usd_per_month,
)
from posttrain.cost.oncall_report import measure_on_call, on_call_text
from posttrain.cost.prices import PriceFile, load_prices
from posttrain.errors import PosttrainError


def cost_inputs(prices: PriceFile, gpu=None, provider=None, kind="on_demand",
                overrides=None) -> tuple[CostInputs, dict]:
    """CostInputs from the price file with overrides applied; also where each number came from."""
    overrides = dict(overrides or {})
    values = {**prices.self_run, **prices.managed}
    source = {k: f"{prices.path} ({prices.version}): {prices.sources.get(f'{sec}.{k}', '')}"
              for sec in ("self_run", "managed") for k in getattr(prices, sec)}
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


def plot_cost(inp: CostInputs, path: Path, max_hours: float, by_hand: CostInputs | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [max_hours * i / 200 for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [managed_monthly(inp, x) for x in xs], label=f"managed (${inp.managed_usd_per_gpu_hour:.2f}/GPU-h)")
    ax.plot(xs, [self_run_monthly(inp, x) for x in xs], label=f"self-run (utilization {inp.utilization:.0%})")
    if by_hand is not None:
        ax.plot(xs, [self_run_monthly(by_hand, x) for x in xs], linestyle=":",
                label="self-run if every interruption needed a person")
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


def cost_report(console, *, gpu, provider, kind, price_file, hours: str, out: str, overrides: dict,
                runs: list[str] | None = None, on_call_overrides: dict | None = None) -> dict:
    """runs: run directories whose interruptions measure the on-call line; on_call_overrides: oncall.py's
    OnCallAssumptions fields given on the command line."""
    try:
        grid = [float(h) for h in hours.split(",") if h.strip()]
    except ValueError:
        raise PosttrainError(f"--hours {hours!r}: give comma-separated numbers, e.g. 100,1000,10000") from None
    prices = load_prices(price_file)
    inp, source = cost_inputs(prices, gpu, provider, kind, overrides)
    on_call, by_hand = {"source": "assumption"}, None
    if runs:
        on_call = measure_on_call(console, runs, prices, inp.engineer_usd_per_year, on_call_overrides or {})
        if "on_call_usd_per_month" not in overrides:  # the measured line replaces the assumption
            inp = replace(inp, on_call_usd_per_month=0.0)
            source["on_call_usd_per_month"] = "replaced by the measured on-call line (--runs)"
        inp = replace(inp, on_call_usd_per_gpu_hour=on_call["line"]["usd_per_gpu_hour"])
        source["on_call_usd_per_gpu_hour"] = f"measured: interruptions in {', '.join(runs)}"
        by_hand = replace(inp, on_call_usd_per_gpu_hour=on_call["line"]["usd_per_gpu_hour_if_all_by_hand"])
    rows = cost_table(inp, grid)
    if by_hand is not None:
        for r in rows:
            h = r["gpu_hours_per_month"]
            r["on_call_usd_if_all_by_hand"] = on_call_monthly(by_hand, h)
            r["self_run_usd_if_all_by_hand"] = self_run_monthly(by_hand, h)
    be, bu = break_even_gpu_hours(inp), break_even_utilization(inp)
    t = Table(title="monthly cost: managed vs self-run")
    columns = ["GPU-h/month", "owned GPUs", "managed $", "self-run $", "on-call $ (in self-run)"]
    for col in columns + (["on-call $ if all by hand"] if by_hand else []) + ["cheaper"]:
        t.add_column(col, justify="right")
    for r in rows:
        cells = [f"{r['gpu_hours_per_month']:,.0f}", f"{r['owned_gpus']:.1f}", f"{r['managed_usd']:,.0f}",
                 f"{r['self_run_usd']:,.0f}", f"{r['on_call_usd']:,.0f}"]
        t.add_row(*cells, *([f"{r['on_call_usd_if_all_by_hand']:,.0f}"] if by_hand else []), r["cheaper"])
    console.print(t)
    console.print(on_call_text(on_call, inp.on_call_usd_per_month, source["on_call_usd_per_month"]), highlight=False)
    owned = owned_usd_per_useful_gpu_hour(inp)
    if math.isfinite(be):
        console.print(f"break-even: {be:,.0f} GPU-hours/month (~{be / (730 * inp.utilization):.1f} owned GPUs); "
                      f"above it self-run is cheaper")
    else:
        pays = f"owning pays only above {bu:.0%} utilization" if math.isfinite(bu) else \
            "the measured on-call per GPU-hour alone exceeds it"
        plus = f" + ${inp.on_call_usd_per_gpu_hour:.2f} measured on-call" if inp.on_call_usd_per_gpu_hour else ""
        console.print(f"break-even: none -- an owned useful GPU-hour costs ${owned:.2f} at {inp.utilization:.0%} "
                      f"utilization{plus}, more than the managed ${inp.managed_usd_per_gpu_hour:.2f}; {pays} (and "
                      "then above the staff cost)")
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    png = plot_cost(inp, outdir / "cost.png", max(max(grid), 2 * be if math.isfinite(be) else 0), by_hand)
    doc = {"inputs": inp.to_dict(), "sources": source, "owned_usd_per_useful_gpu_hour": owned,
           "staff_usd_per_month": staff_usd_per_month(inp), "break_even_gpu_hours_per_month": be if math.isfinite(be) else None,
           "break_even_utilization": bu if math.isfinite(bu) else None, "table": rows, "on_call": on_call,
           "plot": str(png)}
    if by_hand is not None:
        be_hand = break_even_gpu_hours(by_hand)
        doc["break_even_gpu_hours_per_month_if_all_by_hand"] = be_hand if math.isfinite(be_hand) else None
    (outdir / "cost.json").write_text(json.dumps(doc, indent=1))
    console.print(f"written: {outdir / 'cost.json'}, {png}")
    return doc
