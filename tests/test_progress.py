"""The learning monitor's statistics and watch, against numbers worked out by hand: the OLS trend and its one-sided
Student-t p-value, each cause the diagnosis names with its figure, the update-size metric, and the watch's firing
(once notified, logged when the cause changes, quiet on a run that rose and levelled off). Runs with planted dead
settings: tests/test_progress_runs.py."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.evals.progress import ProgressWatch
from posttrain.evals.progress_stats import diagnose, t_upper_tail, trend
from posttrain.step_metrics import truncated_share
from posttrain.rollout.samples import StepSamples
from posttrain.training.update_size import squared_sums, update_ratio, weight_sample


def test_t_upper_tail_by_hand():
    # df 1 is Cauchy: P(T > 1) = 1/2 - atan(1)/pi = 1/4
    assert t_upper_tail(1.0, 1) == pytest.approx(0.25, abs=1e-12)
    # df 2: P(T > t) = (1 - sin theta) / 2, theta = atan(t / sqrt 2); t = 2: sin = sqrt(2/3) = 0.816497
    assert t_upper_tail(2.0, 2) == pytest.approx((1 - math.sqrt(2 / 3)) / 2, abs=1e-12)
    # symmetric, and the centre is 1/2
    assert t_upper_tail(-2.0, 2) == pytest.approx(1 - t_upper_tail(2.0, 2)) and t_upper_tail(0.0, 7) == 0.5
    # the familiar one-sided 5% point of t with 18 df, 1.734
    assert t_upper_tail(1.734, 18) == pytest.approx(0.05, abs=2e-4)
    assert t_upper_tail(math.inf, 3) == 0.0 and t_upper_tail(-math.inf, 3) == 1.0


def test_trend_by_hand():
    # [0, 1, 0, 1] on x 0..3: xbar 1.5, ybar 0.5, Sxx 5, Sxy 1 -> slope 0.2; residuals -0.2, 0.6, -0.6, 0.2 sum to
    # 0.8 squared, s^2 = 0.8 / 2 = 0.4, se = sqrt(0.4 / 5) = 0.282843, t = 0.707107; df 2: theta = atan(0.5),
    # sin = 0.447214, p = (1 - 0.447214) / 2 = 0.276393
    got = trend([0, 1, 0, 1])
    assert got.slope == pytest.approx(0.2) and got.se == pytest.approx(math.sqrt(0.08))
    assert got.t == pytest.approx(1 / math.sqrt(2)) and got.p == pytest.approx(0.276393, abs=1e-6)
    assert not got.rises(0.05) and got.n == 4
    # [1, 3, 2, 5, 4, 6]: Sxy 15.5, Sxx 17.5, slope 0.885714; residual SS 3.771429, se sqrt(3.771429/4/17.5) = 0.232115
    steep = trend([1, 3, 2, 5, 4, 6])
    assert steep.slope == pytest.approx(31 / 35) and steep.se == pytest.approx(0.232115, abs=1e-6)
    assert steep.rises(0.05) and steep.p == pytest.approx(t_upper_tail(steep.t, 4))
    # exact lines: se 0; a rise is certain, a flat series is not one
    assert trend([1, 2, 3]).p == 0.0 and trend([2, 2, 2, 2]).p == 0.5 and trend([3, 2, 1]).p == 1.0
    assert trend([1.0, 2.0]).p == 1.0  # too short to tell


def _records(n: int = 6, **series) -> list[dict]:
    """n steps of a healthy-looking run whose reward is flat, with `series` (key -> list) replacing columns."""
    base = {"reward_mean": [0.5, 0.4, 0.6, 0.5, 0.45, 0.55][:n], "signal_share": [0.5] * n,
            "update_ratio": [1e-3] * n, "entropy": [1.0] * n, "clip_fraction": [0.0] * n,
            "truncated_share": [0.0] * n}
    base.update(series)
    return [{k: v[i] for k, v in base.items() if i < len(v)} for i in range(n)]


def test_each_cause_is_named_with_its_figure():
    barely = diagnose(_records(update_ratio=[1e-8, 2e-8, 1e-8, 3e-8, 1e-8, 2e-8]))
    assert barely.kind == "barely_moves" and barely.figure == pytest.approx(1.5e-8)  # the median
    assert "barely moves" in barely.message and "1.5e-08" in barely.message and "algorithm.lr" in barely.message
    jumps = diagnose(_records(update_ratio=[0.1] * 6))
    assert jumps.kind == "jumps" and jumps.figure == 0.1 and "0.1 of their norm" in jumps.message
    clipped = diagnose(_records(clip_fraction=[0.3] * 6))
    assert clipped.kind == "jumps" and clipped.figure == pytest.approx(0.3) and "30% of tokens clipped" in clipped.message
    # entropy 0.5, 0.5, 1.5, 0.5, 0.5, 0.5: mean 2/3, largest one-step change 1.0 -> 1.0 / (2/3) = 150% of the mean
    swing = diagnose(_records(entropy=[0.5, 0.5, 1.5, 0.5, 0.5, 0.5]))
    assert swing.kind == "jumps" and swing.figure == pytest.approx(1.5) and "by 150% of its mean" in swing.message
    # ... but not when the updates are tiny: a fixed policy's small batches swing on their own
    assert diagnose(_records(entropy=[0.5, 0.5, 1.5, 0.5, 0.5, 0.5], update_ratio=[1e-9] * 6)).kind == "barely_moves"
    # steps that trained nothing (no update_ratio) are left out of the median: 0.5 of the one step that trained
    assert diagnose(_records(update_ratio=[0.5])).figure == 0.5
    few = diagnose(_records(signal_share=[0.1, 0.2, 0.0, 0.1, 0.1, 0.1]))
    assert few.kind == "few_signal" and few.figure == pytest.approx(0.1) and "10% of groups" in few.message
    cut = diagnose(_records(truncated_share=[0.5, 0.75, 1.0, 0.75, 0.5, 1.0]))
    assert cut.kind == "truncated" and cut.figure == pytest.approx(0.75) and "75% of completions" in cut.message
    # rewards 0.5, 0.4, 0.6, 0.5, 0.45, 0.55 on x 0..5: deviations 0, -0.1, 0.1, 0, -0.05, 0.05 against x - 2.5:
    # Sxy = 0.15 - 0.05 - 0.075 + 0.125 = 0.15, Sxx = 17.5 -> slope +0.008571 per step
    flat = diagnose(_records())
    assert flat.kind == "reward_not_following" and flat.figure == pytest.approx(0.15 / 17.5)
    assert "does not follow" in flat.message and "+0.0086/step" in flat.message


def test_a_heldout_gap_is_named_when_the_training_reward_rises_and_heldout_falls():
    rows = _records(reward_mean=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    for i, acc in ((1, 0.3), (3, 0.25), (5, 0.2)):  # three evals: -0.05 per eval
        rows[i]["eval/heldout_accuracy"] = acc
    gap = diagnose(rows)
    assert gap.kind == "heldout_gap" and gap.figure == pytest.approx(-0.05) and "-0.05/eval over 3 evals" in gap.message


def _step(step: int, reward: float, **extra) -> dict:
    return {"step": step, "reward_mean": reward, "signal_share": 0.5, "update_ratio": 1e-8, "entropy": 1.0,
            "clip_fraction": 0.0, "kl": 0.0, "truncated_share": 0.0, **extra}


def test_the_watch_fires_after_n_flat_steps_names_the_cause_and_notifies_once():
    events, lines = [], []
    watch = ProgressWatch(4, "warn", lambda event, **f: events.append((event, f)), lines.append)
    records = [_step(i + 1, r) for i, r in enumerate([0.5, 0.4, 0.6, 0.5, 0.45, 0.5])]
    said = [watch.after_step(r) for r in records]
    assert said == [None] * 6  # warn: the run goes on
    assert ["alarm/no_progress" in r for r in records] == [False, False, False, True, True, True]
    assert records[3]["alarm/no_progress"] == {"cause": "barely_moves", "figure": 1e-8, "steps": 4, "action": "warn"}
    assert [e for e, _ in events] == ["no_progress"] and events[0][1]["step"] == 4
    assert len(lines) == 1 and lines[0].startswith("alarm: not learning over the last 4 steps: the policy barely")
    assert lines[0].endswith("(alarms.no_progress_action=warn: going on)")
    assert watch.summary() == {"no_progress": {"step": 4, "cause": "barely_moves", "figure": 1e-8}}
    # the cause changes (the window's median update ratio passes 3e-2 at the 2nd such step): said again, not
    # notified again
    for step in (7, 8, 9):
        watch.after_step(_step(step, 0.5, update_ratio=0.2))
    assert len(lines) == 2 and "the policy jumps" in lines[1] and len(events) == 1


def test_the_watch_is_quiet_while_learning_after_a_plateau_without_signal_and_when_off():
    rising = ProgressWatch(4)
    assert all(rising.after_step(_step(i + 1, 0.1 * i + (0.02 if i % 2 else 0))) is None for i in range(8))
    assert rising.first is None
    # rose for 5 steps, then level for 4: the last 4 do not rise, the whole run does
    plateau = ProgressWatch(4)
    for i, r in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5, 0.5, 0.5]):
        plateau.after_step(_step(i + 1, r))
    assert plateau.first is None
    silent = ProgressWatch(4)  # no group has a signal: the zero-signal alarm's case, not this one's
    for i in range(6):
        silent.after_step(_step(i + 1, 0.0, signal_share=0.0, update_ratio=None if i % 2 else 1e-8))
    assert silent.first is None  # tiny updates without a signal are not named "barely moves" either
    # ... unless an update of the window jumped and wiped the signal out: then the jump is named
    wiped = ProgressWatch(4)
    wiped.after_step(_step(1, 0.1, update_ratio=0.9))
    for i in range(1, 4):
        wiped.after_step(_step(i + 1, 0.0, signal_share=0.0, update_ratio=None))
    assert wiped.first == {"step": 4, "cause": "jumps", "figure": 0.9}
    off = ProgressWatch(0)
    for i in range(30):
        off.after_step(_step(i + 1, 0.5))
    assert off.first is None


def test_stop_returns_the_message():
    watch = ProgressWatch(3, "stop", log=lambda text: None)
    got = [watch.after_step(_step(i + 1, r, update_ratio=0.5)) for i, r in enumerate([0.5, 0.3, 0.4])]
    assert got[:2] == [None, None] and got[2].startswith("not learning over the last 3 steps: the policy jumps")


def test_update_ratio_by_hand():
    # a 3x4 tensor and a 5-vector; sampled 2 per tensor: every 6th entry of the first, every 3rd of the second
    a, b = torch.arange(12, dtype=torch.float32).reshape(3, 4), torch.ones(5)
    before = weight_sample([a, b], per_tensor=2)
    assert [s.tolist() for s in before] == [[0.0, 6.0], [1.0, 1.0]]
    a += 1.0  # the sampled entries move by 1 each: delta^2 = 4; weights^2 = 0 + 36 + 1 + 1 = 38
    sums = squared_sums(before, weight_sample([a, b], per_tensor=2))
    assert sums.tolist() == [2.0, 38.0] and update_ratio(sums) == pytest.approx(math.sqrt(2 / 38))
    assert update_ratio(torch.tensor([0.0, 0.0], dtype=torch.float64)) == 0.0


def test_truncated_share_by_hand():
    s = StepSamples()
    s.completions = [[1] * 8, [1] * 3, [1] * 8, [1] * 9]
    assert truncated_share(s, 8) == 0.75
    s.loss_masks = [[1] * 8] * 4
    assert truncated_share(s, 8) is None


def test_the_run_page_shows_the_first_step_the_monitor_fired(tmp_path):
    import json

    from posttrain.view import build_page, read_run

    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("name: r\ntrain:\n  steps: 10\nmodel:\n  path: m\ntask:\n  name: addition\n")
    fired = {"cause": "barely_moves", "figure": 1.5e-8, "steps": 4, "action": "warn"}
    times = {"time/generate": 0.2, "time/train": 0.4, "time/step": 1.0}
    lines = [{"step": s, "reward_mean": 0.5, **times, **({"alarm/no_progress": fired} if s >= 4 else {})}
             for s in range(1, 7)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "samples.jsonl").write_text("")
    html = build_page(read_run(run))
    assert '<td data-metric="no_progress_step" data-value="4">from step 4: barely_moves (1.5e-08)</td>' in html
    assert 'data-alarm-step="4"' in html and 'data-alarm-step="6"' in html  # listed under Alarms at each step
    (run / "metrics.jsonl").write_text("".join(json.dumps({**x, "alarm/no_progress": None}) + "\n" for x in lines))
    assert "— (did not fire)" in build_page(read_run(run))


def test_a_resumed_run_replays_its_steps_and_keeps_its_first_firing():
    fired = {"cause": "barely_moves", "figure": 1e-8, "steps": 4, "action": "warn"}
    before = [{**_step(i + 1, 0.5), "time/step": 1.0, **({"alarm/no_progress": fired} if i == 3 else {})}
              for i in range(4)] + [{"step": 4, "eval/heldout_accuracy": 0.1}]  # an eval line: not a step
    watch, lines = ProgressWatch(4, log=lambda t: None), []
    watch.log = lines.append
    watch.replay(before)
    assert len(watch.history) == 4 and watch.first == {"step": 4, "cause": "barely_moves", "figure": 1e-8}
    record = _step(5, 0.5)
    watch.after_step(record)  # the 5th step fires at once (the window is full), with the cause it had: not said again
    assert record["alarm/no_progress"]["cause"] == "barely_moves" and lines == [] and watch.first["step"] == 4
