"""The on-call line of build vs buy, from the interruptions runs measured (runs/<name>/interruptions.jsonl, see
tracking/interruptions.py) instead of an assumption alone. Pure functions; seconds, hours, device-hours, $.

Per interruption: minutes lost = recovery_s + redone_s (detection until work went on, plus the steps trained again);
device-hours lost = that x the run's devices (every role waits while the run recovers). An automatic recovery is a
human intervention avoided: without it the run would have stood idle until a person restarted it (the response
time, an assumption that depends on the hour of detection), so device-hours recovered = (response - measured
recovery) x devices, never below zero (a person's restart would take the same recovery on top). A capacity_exit
or any record not marked automatic needed a person. `node_added` is capacity coming back: listed, but not an
interruption.

The on-call line: interruptions per device-hour measured x the GPU-hours used per month x a person's minutes per
intervention x the engineer's hourly rate, for the interruptions that still need a person; beside it the same for
all of them (every one by hand: what the automatic recovery saves)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

NOT_AN_INTERRUPTION = {"node_added"}  # capacity back: nothing stopped, nobody was needed


@dataclass(frozen=True)
class OnCallAssumptions:
    """No public source for any of these (price file section `on_call`); every one is overridable."""
    minutes_per_intervention: float  # a person's time to be paged, diagnose, restart and check one interruption
    response_hours_working: float  # until a person restarts a stopped run, in working hours
    response_hours_off: float  # the same at night and at weekends
    workday_start_hour: float  # working hours: [start, end) Monday to Friday, in the team's time zone
    workday_end_hour: float
    utc_offset_hours: float  # the team's time zone; interruption times are unix seconds
    work_hours_per_year: float  # turns engineer_usd_per_year into $ per hour

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MeasuredRun:
    """One run's interruptions and what it held: devices (all roles, GPUs or CPU slots) and device-hours (the
    accounting of its metrics.jsonl)."""
    path: str
    devices: float
    device_hours: float
    records: list[dict] = field(default_factory=list)
    has_file: bool = True  # False: no interruptions.jsonl (nothing was interrupted)


def in_working_hours(t_unix: float, a: OnCallAssumptions) -> bool:
    local = time.gmtime(t_unix + a.utc_offset_hours * 3600)
    hour = local.tm_hour + local.tm_min / 60
    return local.tm_wday < 5 and a.workday_start_hour <= hour < a.workday_end_hour


def response_hours(t_unix: float, a: OnCallAssumptions) -> float:
    """Hours until a person would have restarted a run stopped at `t_unix` (unix seconds)."""
    return a.response_hours_working if in_working_hours(t_unix, a) else a.response_hours_off


def needs_person(record: dict) -> bool:
    return record["kind"] == "capacity_exit" or not record["automatic"]


def interruption_cost(record: dict, devices: float, a: OnCallAssumptions) -> dict:
    """Seconds lost, device-hours lost and device-hours recovered by one record, for a run holding `devices`."""
    lost_s = record["recovery_s"] + record["redone_s"]
    counts = record["kind"] not in NOT_AN_INTERRUPTION
    person = counts and needs_person(record)
    idle_s = max(0.0, response_hours(record["time"], a) * 3600 - record["recovery_s"]) if counts and not person else 0.0
    return {"interruption": counts, "automatic": counts and not person, "needs_person": person, "lost_s": lost_s,
            "device_hours_lost": lost_s * devices / 3600, "device_hours_recovered": idle_s * devices / 3600}


def interruption_summary(runs: list[MeasuredRun], a: OnCallAssumptions) -> dict:
    """By kind and in total: count, automatic (= interventions avoided), needs_person, minutes and device-hours
    lost, device-hours recovered; the device-hours measured and the rates per 1,000 of them."""
    zero = {"count": 0, "automatic": 0, "needs_person": 0, "minutes_lost": 0.0, "device_hours_lost": 0.0,
            "device_hours_recovered": 0.0}
    by_kind: dict[str, dict] = {}
    total = dict(zero)
    for run in runs:
        for r in run.records:
            c = interruption_cost(r, run.devices, a)
            rows = [by_kind.setdefault(r["kind"], dict(zero))] + ([total] if c["interruption"] else [])
            for row in rows:
                row["count"] += 1
                row["automatic"] += int(c["automatic"])
                row["needs_person"] += int(c["needs_person"])
                row["minutes_lost"] += c["lost_s"] / 60
                row["device_hours_lost"] += c["device_hours_lost"]
                row["device_hours_recovered"] += c["device_hours_recovered"]
    hours = sum(run.device_hours for run in runs)

    def per_1000(n: float) -> float | None:
        return 1000 * n / hours if hours else None

    return {"by_kind": dict(sorted(by_kind.items())), "total": total, "device_hours": hours,
            "interruptions_per_1000_device_hours": per_1000(total["count"]),
            "needs_person_per_1000_device_hours": per_1000(total["needs_person"]),
            "device_hours_recovered_per_1000_device_hours": per_1000(total["device_hours_recovered"])}


def engineer_usd_per_hour(engineer_usd_per_year: float, a: OnCallAssumptions) -> float:
    return engineer_usd_per_year / a.work_hours_per_year


def on_call_usd_per_gpu_hour(interventions: float, device_hours: float, engineer_usd_per_year: float,
                             a: OnCallAssumptions) -> float:
    """$ of a person's time per GPU-hour used: interventions per device-hour x minutes each x $ per hour."""
    per_hour = engineer_usd_per_hour(engineer_usd_per_year, a)
    return interventions / device_hours * a.minutes_per_intervention / 60 * per_hour


def on_call_line(summary: dict, engineer_usd_per_year: float, a: OnCallAssumptions) -> dict:
    """The measured on-call cost per GPU-hour used: now (the interventions that needed a person) and if every
    interruption had needed one; the difference is what the automatic recovery saves."""
    hours, total = summary["device_hours"], summary["total"]
    now = on_call_usd_per_gpu_hour(total["needs_person"], hours, engineer_usd_per_year, a)
    by_hand = on_call_usd_per_gpu_hour(total["count"], hours, engineer_usd_per_year, a)
    return {"usd_per_gpu_hour": now, "usd_per_gpu_hour_if_all_by_hand": by_hand,
            "saved_usd_per_gpu_hour": by_hand - now,
            "engineer_usd_per_hour": engineer_usd_per_hour(engineer_usd_per_year, a)}
