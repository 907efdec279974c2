"""The zero-signal alarm: counted by hand on a sequence of steps, the step's signal share worked out by hand, and
a real run that trains on nothing stopped by it (exit 77, said on the progress line, in metrics and to ops.notify)
while `warn` lets the same run finish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.evals.no_signal import EXIT_NO_SIGNAL, NoSignalWatch
from posttrain.rollout.samples import StepSamples
from posttrain.step import signal_share

BIN = Path(sys.executable).parent


def test_the_watch_counts_steps_in_a_row_and_resets_on_a_signal():
    watch = NoSignalWatch(steps=3)
    # (signal share, failed samples, samples, mean reward): empty, empty, a signal at mean 0.5, empty x3 below that
    # best (fires at the third), all failed
    seen = [watch.observe(0.0, 0, 8, 0.0), watch.observe(0.0, 0, 8, 0.0), watch.observe(0.25, 0, 8, 0.5),
            watch.observe(0.0, 0, 8, 0.1), watch.observe(0.0, 0, 8, 0.1), watch.observe(0.0, 0, 8, 0.1),
            watch.observe(0.5, 8, 8, 0.0)]
    assert [s is not None for s in seen] == [False, False, False, False, False, True, True]
    assert "for 3 steps in a row: no group's rewards differed" in seen[5]
    assert "for 4 steps in a row: every sample's reward failed" in seen[6]
    off = NoSignalWatch(steps=0)
    assert all(off.observe(0.0, 8, 8) is None for _ in range(10))


def test_a_run_that_converged_at_its_best_reward_does_not_count_but_one_that_collapsed_does():
    watch = NoSignalWatch(steps=2)
    # (signal share, failures, samples, step mean reward): learning (a signal), then every group equal at the best
    # mean so far (converged: not counted), then every group equal below it (collapsed: counted, fires at the 2nd)
    assert watch.observe(0.5, 0, 8, 0.4) is None and watch.observe(0.25, 0, 8, 0.9) is None
    assert [watch.observe(0.0, 0, 8, 0.9) for _ in range(3)] == [None, None, None] and watch.in_a_row == 0
    assert watch.observe(0.0, 0, 8, 0.2) is None and watch.observe(0.0, 0, 8, 0.2) is not None
    # never a signal: equal rewards count from the first step, whatever their level
    fresh = NoSignalWatch(steps=2)
    assert fresh.observe(0.0, 0, 8, 0.0) is None and fresh.observe(0.0, 0, 8, 0.0) is not None


def _samples(rewards: list[float]) -> StepSamples:
    s = StepSamples()
    s.rewards, s.completions = list(rewards), [[1, 2]] * len(rewards)
    return s


def test_signal_share_by_hand(tiny_model_dir):
    cfg = load_config(None, [f"model.path={tiny_model_dir}", "algorithm.group_size=2"])
    # groups (1, 1), (0, 1), (0.5, 0.5), (0, 0): one of four differs
    assert signal_share(cfg, _samples([1, 1, 0, 1, 0.5, 0.5, 0, 0])) == 0.25
    ppo = load_config(None, [f"model.path={tiny_model_dir}", "algorithm.name=ppo"])
    assert signal_share(ppo, _samples([1, 1, 1])) == 0.0 and signal_share(ppo, _samples([1, 1, 0])) == 1.0


def _train(tmp: Path, model: str, *extra: str) -> subprocess.CompletedProcess:
    # The random tiny model never answers an addition, and the verifier is the only reward: no group has a signal.
    # Nothing listens on port 9: each event fails at once and is recorded (notify_retries=0; the default 3 retries
    # would back off 1 + 2 + 4 s per event and hold the run's end for notify's 10 s close, ~20 s of this test).
    cfg = tmp / "run.yaml"
    cfg.write_text(f"name: nothing\nruns_dir: {tmp}\nmodel: {{path: {model}}}\n")
    return subprocess.run([str(BIN / "posttrain"), "train", str(cfg), "task.train_size=64", "task.heldout_size=8",
                           "algorithm.group_size=4", "algorithm.prompts_per_step=4", "rollout.engine=hf",
                           "train.steps=5", "eval.every=0", "checkpoint.every=0", "alarms.no_signal_steps=2",
                           "ops.notify=[{url: 'http://127.0.0.1:9/hook'}]", "ops.notify_retries=0", *extra],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_a_run_that_trains_on_nothing_stops_and_warn_lets_it_finish(tmp_path, tiny_model_dir):
    stopped = _train(tmp_path, tiny_model_dir)
    out = " ".join((stopped.stdout + stopped.stderr).split())
    assert stopped.returncode == EXIT_NO_SIGNAL, out
    assert "alarm: no learning signal for 2 steps in a row: no group's rewards differed" in out
    assert "stopped at step 2" in out and "alarms.no_signal_action=warn" in out and "Traceback" not in out
    run = tmp_path / "nothing"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "time/step" in m]
    assert [m["signal_share"] for m in steps] == [0.0, 0.0]
    assert "alarm/no_signal" not in steps[0] and steps[1]["alarm/no_signal"] == {"steps": 2, "action": "stop"}
    assert (run / "checkpoints" / "step_000002").is_dir()
    events = [json.loads(x)["event"] for x in (run / "notifications.jsonl").read_text().splitlines()]
    assert "no_signal" in events
    # The same run told to go on: the alarm says so and the run finishes its 5 steps.
    warned = _train(tmp_path, tiny_model_dir, "name=warned", "alarms.no_signal_action=warn")
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert "(alarms.no_signal_action=warn: going on)" in warned.stdout + warned.stderr
    assert json.loads((tmp_path / "warned" / "summary.json").read_text())["steps"] == 5
