"""The on-call line from measured interruptions (cost/oncall.py, run_history.py, `posttrain cost --runs`): device-hours
lost and recovered, interventions avoided, the rate and the on-call $ against numbers worked out by hand."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cost.build_vs_buy import CostInputs, break_even_gpu_hours, break_even_utilization, self_run_monthly
from posttrain.cost.oncall import (
    MeasuredRun,
    OnCallAssumptions,
    interruption_cost,
    interruption_summary,
    on_call_line,
    response_hours,
)
from posttrain.cost.run_history import read_measured_runs
from posttrain.errors import PosttrainError

BIN = Path(sys.executable).parent
# 30 min of a person per intervention; 0.5 h to restart in working hours (09-18 Mon-Fri UTC), 8 h off them;
# $208,000/year over 2,080 h = $100 per hour.
ASSUME = OnCallAssumptions(minutes_per_intervention=30, response_hours_working=0.5, response_hours_off=8,
                           workday_start_hour=9, workday_end_hour=18, utc_offset_hours=0, work_hours_per_year=2080)
SALARY = 208_000


def utc(day: int, hour: int, minute: int = 0) -> int:
    """Unix seconds of 2026-12-<day> hour:minute UTC (2026-12-02 is a Wednesday, 12-05 a Saturday)."""
    return calendar.timegm((2026, 12, day, hour, minute, 0))


def rec(kind: str, t: int, recovery_s: float, redone_s: float, automatic: bool) -> dict:
    return {"kind": kind, "step": 3, "role": "rollout", "time": t, "recovery_s": recovery_s, "redone_steps": 1,
            "redone_s": redone_s, "action": "test", "automatic": automatic}


# Run A holds 2 devices for 2 h (4 device-hours); run B holds 2 devices for 3 h (6), with nothing interrupted.
RECORDS_A = [
    rec("hang", utc(2, 14), 120, 600, True),  # Wednesday 14:00: working hours
    rec("worker_lost", utc(2, 23), 60, 0, True),  # Wednesday 23:00: night
    rec("capacity_exit", utc(5, 10), 1800, 300, False),  # Saturday: a person resumes it
    rec("node_added", utc(5, 11), 0, 0, True),  # capacity back: not an interruption
]


def test_response_hours_follow_the_working_week_and_time_zone():
    assert response_hours(utc(2, 14), ASSUME) == 0.5
    assert response_hours(utc(2, 23), ASSUME) == 8
    assert response_hours(utc(4, 17, 59), ASSUME) == 0.5  # Friday 17:59
    assert response_hours(utc(4, 18), ASSUME) == 8  # Friday 18:00: the day is over
    assert response_hours(utc(5, 14), ASSUME) == 8  # Saturday afternoon
    # Wednesday 23:00 UTC is 14:00 at UTC-9: working hours there.
    alaska = OnCallAssumptions(**{**ASSUME.to_dict(), "utc_offset_hours": -9})
    assert response_hours(utc(2, 23), alaska) == 0.5


def test_interruptions_by_hand():
    runs = [MeasuredRun("a", devices=2, device_hours=4, records=RECORDS_A), MeasuredRun("b", 2, 6, [], False)]
    s = interruption_summary(runs, ASSUME)
    t = s["total"]
    # hang: lost 120 + 600 = 720 s = 12 min -> 720 * 2 / 3600 = 0.4 device-h; recovered (0.5 h = 1800 s - 120) * 2
    #   / 3600 = 0.9333.
    # worker_lost: lost 60 s = 1 min -> 0.0333 device-h; recovered (8 h = 28800 s - 60) * 2 / 3600 = 15.9667.
    # capacity_exit: lost 1800 + 300 = 2100 s = 35 min -> 1.1667 device-h; needed a person: recovered nothing.
    assert s["by_kind"]["hang"]["device_hours_recovered"] == pytest.approx(3360 / 3600)
    assert s["by_kind"]["worker_lost"]["device_hours_recovered"] == pytest.approx(57480 / 3600)
    assert s["by_kind"]["capacity_exit"] == pytest.approx({"count": 1, "automatic": 0, "needs_person": 1,
                                                           "minutes_lost": 35, "device_hours_lost": 4200 / 3600,
                                                           "device_hours_recovered": 0})
    # Totals leave node_added out: 3 interruptions, 2 automatic (interventions avoided), 1 needed a person;
    # 12 + 1 + 35 = 48 min; 2880 s * 2 / 3600 = 1.6 device-h lost; 0.9333 + 15.9667 = 16.9 recovered.
    assert s["by_kind"]["node_added"]["count"] == 1
    assert t == pytest.approx({"count": 3, "automatic": 2, "needs_person": 1, "minutes_lost": 48,
                               "device_hours_lost": 1.6, "device_hours_recovered": 16.9})
    # 10 device-hours measured: 3 / 10 * 1000 = 300 interruptions per 1,000 device-hours, 100 needing a person.
    assert s["device_hours"] == 10
    assert s["interruptions_per_1000_device_hours"] == pytest.approx(300)
    assert s["needs_person_per_1000_device_hours"] == pytest.approx(100)
    # On-call: 1 / 10 per device-hour * 0.5 h * $100/h = $5.00 per GPU-hour; all 3 by hand: $15.00; saved $10.00.
    line = on_call_line(s, SALARY, ASSUME)
    assert line["engineer_usd_per_hour"] == pytest.approx(100)
    assert line["usd_per_gpu_hour"] == pytest.approx(5.0)
    assert line["usd_per_gpu_hour_if_all_by_hand"] == pytest.approx(15.0)
    assert line["saved_usd_per_gpu_hour"] == pytest.approx(10.0)


def test_a_recovery_slower_than_a_person_recovers_nothing():
    # Working hours: a person would restart in 1800 s; the automatic recovery took 3600 s -> 0, not negative.
    c = interruption_cost(rec("hang", utc(2, 10), 3600, 0, True), 4, ASSUME)
    assert c["device_hours_recovered"] == 0 and c["device_hours_lost"] == pytest.approx(4.0)


def test_the_measured_on_call_line_in_build_vs_buy():
    # Owned useful hour: (36000/36 + 460) / (730 * 0.5) = $4.00; fixed staff 208000 / 12 = $17,333.33/month.
    base = CostInputs(managed_usd_per_gpu_hour=12.0, capex_usd_per_gpu=36000, amortization_months=36,
                      power_hosting_usd_per_gpu_month=460, utilization=0.5, platform_engineers=1,
                      engineer_usd_per_year=SALARY, on_call_usd_per_month=0, on_call_usd_per_gpu_hour=5.0)
    # 1,000 GPU-h: 1000 * (4 + 5) + 17333.33 = 26,333.33; break-even 17333.33 / (12 - 4 - 5) = 5,777.8 GPU-h.
    assert self_run_monthly(base, 1000) == pytest.approx(9000 + SALARY / 12)
    assert break_even_gpu_hours(base) == pytest.approx(SALARY / 12 / 3)
    # Owning pays above 1460 / (730 * (12 - 5)) = 28.6% utilization.
    assert break_even_utilization(base) == pytest.approx(1460 / 5110)
    # Every interruption by hand: $15/GPU-h makes an owned hour 4 + 15 = 19 > 12: owning never pays.
    by_hand = CostInputs(**{**base.to_dict(), "on_call_usd_per_gpu_hour": 15.0})
    assert break_even_gpu_hours(by_hand) == float("inf")


def write_run(d: Path, hours: float, interruptions: list[str] | None) -> Path:
    """A run dir of 2 devices (trainer 1 + one rollout worker 0.75 + reward 0.25; KL 0: no reference) that trained
    steps of 1800 s for `hours`."""
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"name: {d.name}\nalgorithm:\n  kl_coef: 0\ntopology:\n  rollout_cpus: 0.75\n"
                                   "  usd_per_device_hour: 2.0\n")
    steps = [{"step": i, "time/step": 1800.0, "time/generate": 1500.0, "time/train": 300.0}
             for i in range(1, int(hours * 2) + 1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    if interruptions is not None:
        (d / "interruptions.jsonl").write_text("".join(line + "\n" for line in interruptions))
    return d


def runs_ab(tmp_path: Path) -> tuple[Path, Path]:
    lines = [json.dumps(r) for r in RECORDS_A] + ['{"kind": "meteor", "time": 1, "recovery_s": 0, "redone_s": 0, '
                                                  '"automatic": true}', '{"kind": "hang", "st']
    return write_run(tmp_path / "a", 2, lines), write_run(tmp_path / "b", 3, None)


def test_reading_runs_warns_about_bad_lines(tmp_path):
    a, b = runs_ab(tmp_path)
    warnings = []
    runs = read_measured_runs([str(a), str(b)], warnings.append)
    assert [(r.devices, r.device_hours, len(r.records), r.has_file) for r in runs] == [(2, 2 * 2, 4, True),
                                                                                      (2, 3 * 2, 0, False)]
    assert warnings == [f"{a}/interruptions.jsonl: line 5: kind 'meteor' is not one of hang, worker_lost, node_lost, "
                        "node_added, roles_reformed, capacity_exit, preempted; skipped",
                        f"{a}/interruptions.jsonl: line 6 is not valid JSON (Unterminated string starting at); skipped"]
    with pytest.raises(PosttrainError, match=f"--runs {tmp_path}: not a run directory"):
        read_measured_runs([str(tmp_path)], warnings.append)
    empty = write_run(tmp_path / "c", 0, None)
    with pytest.raises(PosttrainError, match="no step times in metrics.jsonl"):
        read_measured_runs([str(empty)], warnings.append)


def posttrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "posttrain"), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})


def test_cost_cli_with_runs_prints_the_interruptions_and_the_measured_on_call(tmp_path):
    a, b = runs_ab(tmp_path)
    out = tmp_path / "out"
    common = ["--price", "12", "--capex", "36000", "--power-hosting", "460", "--utilization", "0.5", "--salary",
              str(SALARY), "--hours", "1000,10000", "--out", str(out)]
    r = posttrain("cost", "--runs", f"{a},{b}", "--intervention-minutes", "30", "--response-hours", "0.5,8", *common)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert f"warning: {a}/interruptions.jsonl: line 6 is not valid JSON" in text
    assert f"{b}: no interruptions.jsonl -- nothing interrupted this run (counted as zero)" in text
    assert "human interventions avoided: 2 (automatic recoveries); needed a person: 1" in text
    assert "300.0 per 1,000 device-hours" in text and "device-hours recovered: 16.90" in text
    assert "on-call (measured from 2 run(s)): 1 of 3 interruptions needed a person" in text
    assert "= $5.0000 per GPU-hour used" in text and "if every interruption needed a person: $15.0000" in text
    doc = json.loads((out / "cost.json").read_text())
    assert doc["on_call"]["source"] == "measured"
    assert doc["on_call"]["summary"]["total"]["device_hours_recovered"] == pytest.approx(16.9)
    assert doc["inputs"]["on_call_usd_per_month"] == 0  # the measured line replaced the $2,000 assumption
    assert doc["on_call"]["assumption_sources"]["minutes_per_intervention"] == "command line"
    assert doc["on_call"]["assumption_sources"]["work_hours_per_year"].startswith("assumption:")
    # 1,000 GPU-h/month: on-call $5,000 (by hand $15,000); self-run 9000 + 17333.33 = 26,333.33.
    row = doc["table"][0]
    assert row["on_call_usd"] == pytest.approx(5000) and row["on_call_usd_if_all_by_hand"] == pytest.approx(15000)
    assert row["self_run_usd"] == pytest.approx(26333.33, abs=0.01)
    assert doc["break_even_gpu_hours_per_month"] == pytest.approx(5777.78, abs=0.01)
    assert doc["break_even_gpu_hours_per_month_if_all_by_hand"] is None
    # Without runs: the price file's assumption, said as such.
    r = posttrain("cost", *common)
    assert r.returncode == 0, r.stderr
    assert "on-call (an assumption, not measured): $2,000/month" in " ".join(r.stdout.split())
    assert json.loads((out / "cost.json").read_text())["on_call"] == {"source": "assumption"}
    # A directory that is not a run: one message, exit 2.
    r = posttrain("cost", "--runs", str(tmp_path), *common)
    assert r.returncode == 2 and f"--runs {tmp_path}: not a run directory" in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr
