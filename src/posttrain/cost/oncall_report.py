"""`posttrain cost --runs`: the runs' interruptions as a table (kind, count, automatic, minutes lost, device-hours
lost and recovered), the human interventions avoided, and the on-call line the build-vs-buy table uses. The math is
in oncall.py, the reading in run_history.py."""

from __future__ import annotations

from dataclasses import fields

from rich.table import Table

from posttrain.cost.oncall import (
    OnCallAssumptions,
    interruption_summary,
    on_call_line,
)
from posttrain.cost.prices import PriceFile
from posttrain.cost.run_history import read_measured_runs
from posttrain.errors import PosttrainError


def on_call_assumptions(prices: PriceFile, overrides: dict) -> tuple[OnCallAssumptions, dict]:
    """The price file's `on_call` section with command-line overrides; also where each value came from."""
    names = [f.name for f in fields(OnCallAssumptions)]
    values = {**{k: prices.on_call[k] for k in names if k in prices.on_call}, **overrides}
    missing = [f"on_call.{k}" for k in names if k not in values]
    if missing:
        raise PosttrainError(f"price file {prices.path}: {', '.join(missing)} missing (needed with --runs)",
                             hint="copy the on_call section of the built-in src/posttrain/cost/prices.yaml")
    a = OnCallAssumptions(**values)
    if a.minutes_per_intervention < 0 or a.response_hours_working < 0 or a.response_hours_off < 0:
        raise PosttrainError("on_call: minutes_per_intervention and response hours must be >= 0 "
                             f"(got {a.minutes_per_intervention}, {a.response_hours_working}, {a.response_hours_off})")
    if not 0 <= a.workday_start_hour < a.workday_end_hour <= 24 or a.work_hours_per_year <= 0:
        raise PosttrainError(f"price file {prices.path}: on_call needs 0 <= workday_start_hour < workday_end_hour "
                             "<= 24 and work_hours_per_year > 0")
    return a, {k: "command line" if k in overrides else prices.sources.get(f"on_call.{k}", prices.path) for k in names}


def interruption_table(summary: dict, n_runs: int) -> Table:
    t = Table(title=f"interruptions measured in {n_runs} run(s), {summary['device_hours']:,.2f} device-hours")
    for col in ("kind", "count", "automatic", "needed a person", "minutes lost", "device-h lost", "device-h recovered"):
        t.add_column(col, justify="left" if col == "kind" else "right")

    def add(name: str, r: dict) -> None:
        t.add_row(name, str(r["count"]), str(r["automatic"]), str(r["needs_person"]), f"{r['minutes_lost']:,.1f}",
                  f"{r['device_hours_lost']:,.2f}", f"{r['device_hours_recovered']:,.2f}")

    for kind, r in summary["by_kind"].items():
        add(kind + (" (not an interruption)" if kind == "node_added" else ""), r)
    add("total", summary["total"])
    return t


def measure_on_call(console, run_dirs: list[str], prices: PriceFile, engineer_usd_per_year: float,
                    overrides: dict) -> dict:
    """Reads the runs, prints the interruption table and what it means; returns the on-call document."""
    runs = read_measured_runs(run_dirs, lambda m: console.print(f"warning: {m}", markup=False, highlight=False))
    a, sources = on_call_assumptions(prices, overrides)
    summary = interruption_summary(runs, a)
    line = on_call_line(summary, engineer_usd_per_year, a)
    for r in runs:
        if not r.has_file:
            console.print(f"{r.path}: no interruptions.jsonl -- nothing interrupted this run (counted as zero)",
                          markup=False, highlight=False)
    console.print(interruption_table(summary, len(runs)))
    total = summary["total"]
    console.print(f"human interventions avoided: {total['automatic']} (automatic recoveries); needed a person: "
                  f"{total['needs_person']} (capacity_exit, or not automatic); {total['count']} interruptions = "
                  f"{summary['interruptions_per_1000_device_hours']:,.1f} per 1,000 device-hours")
    console.print(f"device-hours recovered: {total['device_hours_recovered']:,.2f} -- the run would have stood idle "
                  f"until a person restarted it ({a.response_hours_working:g} h in working hours, "
                  f"{a.response_hours_off:g} h off them: assumptions), less the measured recovery", highlight=False)
    return {"source": "measured", "runs": [{"path": r.path, "devices": r.devices, "device_hours": r.device_hours,
                                            "interruptions_file": r.has_file, "records": len(r.records)} for r in runs],
            "summary": summary, "line": line, "assumptions": a.to_dict(), "assumption_sources": sources}


def on_call_text(doc: dict, usd_per_month: float, usd_per_month_source: str) -> str:
    """The on-call line under the build-vs-buy table: measured (doc from measure_on_call) or an assumption."""
    if doc["source"] != "measured":
        return (f"on-call (an assumption, not measured): ${usd_per_month:,.0f}/month from {usd_per_month_source} -- "
                "--runs runs/NAME derives it from the runs' interruptions")
    s, line, a = doc["summary"], doc["line"], doc["assumptions"]
    fixed = f"; plus ${usd_per_month:,.0f}/month fixed ({usd_per_month_source})" if usd_per_month else ""
    return (f"on-call (measured from {len(doc['runs'])} run(s)): {s['total']['needs_person']} of "
            f"{s['total']['count']} interruptions needed a person = {s['needs_person_per_1000_device_hours']:,.1f} per "
            f"1,000 device-hours x {a['minutes_per_intervention']:g} min each (assumption) x "
            f"${line['engineer_usd_per_hour']:,.2f}/h = ${line['usd_per_gpu_hour']:,.4f} per GPU-hour used{fixed}; "
            f"if every interruption needed a person: ${line['usd_per_gpu_hour_if_all_by_hand']:,.4f} per GPU-hour "
            f"(the automatic recovery saves ${line['saved_usd_per_gpu_hour']:,.4f} per GPU-hour)")
