"""Build vs buy and per-run accounting against hand-worked numbers; the price file keeps a source and date on
every row; `posttrain cost` and `posttrain plan` write their files."""

import json
import math

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.cost.build_vs_buy import (
    CostInputs,
    break_even_gpu_hours,
    break_even_utilization,
    managed_monthly,
    self_run_monthly,
)
from posttrain.cost.prices import load_prices
from posttrain.cost.run_accounting import run_accounting
from posttrain.errors import PosttrainError

INPUTS = CostInputs(managed_usd_per_gpu_hour=12.0, capex_usd_per_gpu=36000, amortization_months=36,
                    power_hosting_usd_per_gpu_month=460, utilization=0.5, platform_engineers=1,
                    engineer_usd_per_year=240000, on_call_usd_per_month=0)


def test_break_even_by_hand():
    # Owned GPU-month: 36000/36 + 460 = 1460 $; a useful hour at 50%: 1460 / (730 * 0.5) = 4.00 $.
    # Staff: 240000/12 = 20000 $/month. Break-even: 20000 / (12 - 4) = 2500 GPU-hours/month.
    assert break_even_gpu_hours(INPUTS) == pytest.approx(2500)
    assert managed_monthly(INPUTS, 2500) == pytest.approx(30000)  # 2500 * 12
    assert self_run_monthly(INPUTS, 2500) == pytest.approx(30000)  # 2500 * 4 + 20000
    # Utilization at which a useful owned hour costs 12 $: 1460 / (730 * 12) = 0.1667.
    assert break_even_utilization(INPUTS) == pytest.approx(1460 / 8760)
    # At $3/h the owned useful hour (4 $) never gets cheaper: no break-even.
    cheap = CostInputs(**{**INPUTS.to_dict(), "managed_usd_per_gpu_hour": 3.0})
    assert math.isinf(break_even_gpu_hours(cheap))
    # Spot preemptions redo 10% of the hours: 12 * 1.1 = 13.2; 20000 / (13.2 - 4) = 2173.9.
    spot = CostInputs(**{**INPUTS.to_dict(), "preemption_overhead": 0.1})
    assert break_even_gpu_hours(spot) == pytest.approx(20000 / 9.2)


def test_every_price_row_has_a_source_and_a_date(tmp_path):
    prices = load_prices()
    assert prices.rows and all(r.source and r.date for r in prices.rows)
    assert {"H100", "H200", "A100-80GB"} <= {r.gpu for r in prices.rows}
    assert {"on_demand", "spot"} <= {r.kind for r in prices.rows}
    bad = tmp_path / "p.yaml"
    bad.write_text("rows:\n  - {gpu: H100, provider: x, kind: spot, usd_per_gpu_hour: 2.0, date: 2026-01-01}\n")
    with pytest.raises(PosttrainError, match="row 1: missing source"):
        load_prices(bad)


def test_run_accounting_by_hand():
    records = [
        {"step": 1, "time/step": 10.0, "time/generate": 6.0, "time/reward": 0.5, "time/reference": 1.0,
         "time/train": 2.0, "time/sync": 0.5, "time/eval": 2.0},
        {"step": 2, "time/step": 8.0, "time/generate": 5.0, "time/reward": 0.5, "time/reference": 0.5,
         "time/train": 1.5, "time/sync": 0.5},
        {"step": 2, "eval/heldout_accuracy": 0.5},  # eval-only rows carry no step time
    ]
    acc = run_accounting(records, {"trainer": 1, "rollout": 2, "reference": 1, "reward": 0.5}, 3.6)
    # Wall: 10 + 2 (eval) + 8 = 20 s. Trainer busy: train 3.5 + sync 1.0 = 4.5 s -> 0.225.
    assert acc["wall_seconds"] == 20.0
    assert acc["roles"]["trainer"]["busy_fraction"] == pytest.approx(4.5 / 20)
    # Rollout busy: generate 11 + sync 1 + eval 2 = 14 s -> 0.7; holds 2 devices -> 40 device-seconds.
    assert acc["roles"]["rollout"]["busy_fraction"] == pytest.approx(0.7)
    assert acc["roles"]["rollout"]["device_seconds"] == 40.0
    # Device-seconds: 20 * (1 + 2 + 1 + 0.5) = 90; at $3.6/h: 90 * 3.6 / 3600 = $0.09.
    assert acc["device_seconds"] == 90.0 and acc["usd"] == pytest.approx(0.09)


def test_cost_cli_writes_table_json_and_png(tmp_path):
    r = CliRunner().invoke(app, ["cost", "--price", "12", "--capex", "36000", "--power-hosting", "460",
                                 "--utilization", "0.5", "--salary", "240000", "--on-call", "0",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "cost.json").read_text())
    assert doc["break_even_gpu_hours_per_month"] == pytest.approx(2500)
    assert doc["sources"]["utilization"] == "command line"
    assert (tmp_path / "cost.png").read_bytes()[:4] == b"\x89PNG"
    r = CliRunner().invoke(app, ["cost", "--gpu", "TPU", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "no on_demand price for TPU" in r.output


def test_plan_cli_for_a_7b_config_without_weights(tmp_path):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(app, ["plan", "examples/plan-7b-grpo.yaml", "--cluster", "2x8xH100-80GB", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["policy"]["params"] == 6_738_415_616 and doc["cluster"] == "2x8xH100-80GB"
    assert {p["layout"] for p in doc["layouts"]} == {"colocated", "split_pairs", "split"}
    assert doc["chosen"] == min((p for p in doc["layouts"] if p["feasible"]), key=lambda p: p["usd_per_step"])["layout"]
    r = CliRunner().invoke(app, ["plan", "examples/plan-7b-grpo.yaml", "--cluster", "8xTPU"])
    assert r.exit_code == 2 and "unknown device" in r.output


def test_run_summary_accounting_uses_the_topology_shares_and_price():
    from posttrain.config import load_config
    from posttrain.cost.run_accounting import accounting_for_run

    cfg = load_config(None, ["rollout.num_workers=2", "topology.usd_per_device_hour=7.2", "algorithm.kl_coef=0"])
    acc = accounting_for_run(cfg, [{"time/step": 5.0, "time/generate": 4.0, "time/train": 1.0}])
    # Devices: trainer 1 CPU slot, rollout 2 * 0.5, reward 0.25, no reference (kl 0) -> 2.25 * 5 s = 11.25;
    # at $7.2/h: 11.25 * 7.2 / 3600 = $0.0225.
    assert set(acc["roles"]) == {"trainer", "rollout", "reward"}
    assert acc["device_seconds"] == pytest.approx(11.25) and acc["usd"] == pytest.approx(0.0225)
    assert acc["roles"]["rollout"]["busy_fraction"] == pytest.approx(0.8)
    assert acc["price_source"] == "topology.usd_per_device_hour"
