"""The run picture's in-loop eval curve: the base model's score (step 0) first, steps in order, the last record of a
step kept (a resumed run can evaluate a step twice), and a PNG written from real-format metrics."""

from __future__ import annotations

import json

from posttrain.evals.run_plots import plot_run, suite_curve


def test_suite_curve_starts_at_the_base_and_keeps_the_last_record_of_a_step(tmp_path):
    metrics = [{"step": 10, "eval/run_reward/mean": 0.5, "eval/run_reward/se": 0.05},
               {"step": 0, "eval/run_reward/mean": 0.3, "eval/run_reward/se": 0.04},
               {"step": 10, "reward_mean": 0.4},
               {"step": 10, "eval/run_reward/mean": 0.55, "eval/run_reward/se": 0.045},
               {"step": 20, "eval/run_reward/mean": 0.7}]
    assert suite_curve(metrics) == [(0, 0.3, 0.04), (10, 0.55, 0.045), (20, 0.7, 0.0)]
    assert suite_curve(metrics, "other") == []
    steps = [{"step": s, "reward_mean": 0.1 * s, **{f"time/{p}": 1.0 for p in
              ("generate", "reward", "reference", "train", "sync", "other")}} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps + metrics))
    out = plot_run(tmp_path)
    assert out.name == "curves.png" and out.stat().st_size > 10_000
