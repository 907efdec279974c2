"""`probe --trial`'s statistics and verdict on numbers worked out by hand (the runs themselves are the loop's)."""

from __future__ import annotations

import math

import pytest

from posttrain.evals.progress_stats import trend
from posttrain.probe_trial import arm_config, arm_of, recommend, slope_ci, t_quantile


def test_t_quantile_and_the_slopes_interval_by_hand():
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)  # the textbook table
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4) and t_quantile(0.5, 5) == pytest.approx(0, abs=1e-9)
    # [0, 1, 0, 1]: slope 0.2, se sqrt(0.08) = 0.282843 (tests/test_progress.py); 4.302653 x 0.282843 = 1.216974
    lo, hi = slope_ci(trend([0, 1, 0, 1]))
    assert lo == pytest.approx(0.2 - 1.216974, abs=1e-5) and hi == pytest.approx(0.2 + 1.216974, abs=1e-5)
    assert slope_ci(trend([1.0, 2.0])) == (-math.inf, math.inf)


def _records(rewards, ratio=1e-3):
    return [{"reward_mean": r, "signal_share": 0.5, "update_ratio": ratio, "entropy": 1.0, "clip_fraction": 0.0}
            for r in rewards]


def test_the_verdict_picks_the_rate_with_the_largest_lower_bound_or_names_each_cause():
    slow = arm_of(1e-4, _records([0.0, 0.1, 0.2, 0.3]), 1.0)  # exact lines: se 0, the interval is the slope
    fast = arm_of(3e-4, _records([0.0, 0.2, 0.4, 0.6]), 1.0)
    flat = arm_of(9e-4, _records([0.5, 0.4, 0.6, 0.5], ratio=0.5), 1.0)
    assert slow.ci == (pytest.approx(0.1), pytest.approx(0.1)) and fast.learned and not flat.learned
    assert flat.cause == "jumps" and slow.cause == ""
    best, line = recommend([slow, fast, flat])
    assert best is fast and line == "learned at lr 0.0001, 0.0003; use algorithm.lr=0.0003 (the largest lower bound of the slope)"
    dead = arm_of(1e-9, _records([0.5, 0.4, 0.6, 0.5], ratio=1e-9), 1.0)
    none, line = recommend([dead, flat])
    assert none is None and "no learning rate tried raised the reward in 4 steps (lr 1e-09: barely_moves; lr 0.0009: jumps)" in line


def test_an_arm_is_the_configs_own_run_at_its_rate(tiny_model_dir):
    from posttrain.config import load_config

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "name=mine", "algorithm.lr=3e-4", "eval.every=5"])
    arm = arm_config(cfg, 1e-4, 7)
    assert (arm.name, arm.algorithm.lr, arm.train.steps, arm.eval.every) == ("mine-trial-lr0.0001", 1e-4, 7, 0)
    assert arm.alarms.no_progress_steps == 0 and arm.model.path == cfg.model.path
