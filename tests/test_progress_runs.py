"""The learning monitor on real runs with planted dead settings, from the SFT warm start (`warm_model_dir`): each
dead run makes it fire within alarms.no_progress_steps = N steps (N + 2 steps run, 3 chances) and name the right
cause, and a run that learns keeps it quiet. Statistical, with wide margins (numbers measured on this 2-core VM,
docs/evals.md "Is it learning?"):
- learning rate 1e-9 (the config refuses 0): update_ratio ~1e-8 per step against the 1e-6 "barely moves" line;
  the reward's trend over N steps has no rise (under "nothing learns" a step's chance to read as a rise is 5%);
- a reward that ignores the completion (uniform in [0, 1], seeded by the sample id): every group has a signal, the
  updates are normal (~4e-3 of the weights), the reward has no trend: "the reward does not follow";
- learning rate 0.1 on the addition task's exact-match reward: the first update moves the weights by ~0.9 of
  their norm, every later step's group rewards are all 0 (the zero-signal alarm set to warn, so both speak);
- learning rate 1e-3 on the length objective (tests/test_algorithm_runs.py's, 16 prompts x 8): the reward's rise
  over the first 6 steps reads p ~0.008, and every later window holds the whole run's rise.
The lr 1e-9 run also stops through the CLI (alarms.no_progress_action=stop): exit 78, a checkpoint of the step.
Real Ray (one session for the module), the transformers engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

N, STEPS = 6, 8
LENGTH = ("reward.weights={length: -1.0}",)  # longer is better (completion tokens / max_new_tokens)
RANDOM_REWARD = """import random


def score(prompts, completions, sample_ids, **kwargs):
    return [random.Random(sid).random() for sid in sample_ids]  # seeded by the sample id, blind to the completion
"""


def _overrides(tmp: Path, model: str, name: str, *extra: str) -> list[str]:
    return [f"name={name}", f"runs_dir={tmp}", f"model.path={model}", "seed=0", "algorithm.prompts_per_step=8",
            "algorithm.group_size=4", "algorithm.kl_coef=0", "algorithm.lr_schedule=constant",
            f"train.steps={STEPS}", "rollout.engine=hf", "task.heldout_size=16", "eval.every=0",
            "checkpoint.every=0", "logging.progress=false", "ray.num_cpus=4", f"alarms.no_progress_steps={N}",
            *extra]


def _run(tmp: Path, model: str, name: str, *extra: str) -> tuple[dict, list[dict]]:
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.tracking import read_metrics

    cfg = load_config(None, _overrides(tmp, model, name, *extra))
    summary = train(cfg, progress=False)
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    fired = [(m["step"], m["alarm/no_progress"]["cause"]) for m in steps if "alarm/no_progress" in m]
    ratios = [None if m.get("update_ratio") is None else float(f"{m['update_ratio']:.2g}") for m in steps]
    print(f"\n{name}: rewards {[round(m['reward_mean'], 3) for m in steps]}, update_ratio {ratios}; "
          f"fired {fired}; summary {summary['no_progress']}")
    return summary, steps


def _fired(summary: dict, steps: list[dict], cause: str) -> None:
    first = summary["no_progress"]
    assert first is not None and first["cause"] == cause, first
    assert N <= first["step"] <= STEPS
    record = next(m for m in steps if m["step"] == first["step"])
    assert record["alarm/no_progress"]["cause"] == cause and "alarm/no_progress" not in steps[N - 2]


def test_a_learning_run_stays_quiet(tmp_path, ray_session, warm_model_dir):
    summary, steps = _run(tmp_path, warm_model_dir, "learning", *LENGTH, "algorithm.lr=1e-3",
                          "algorithm.prompts_per_step=16", "algorithm.group_size=8")
    assert summary["no_progress"] is None and not any("alarm/no_progress" in m for m in steps)
    assert steps[-1]["reward_mean"] > steps[0]["reward_mean"] + 0.05  # it did learn


def test_a_reward_blind_to_the_completion_is_named(tmp_path, ray_session, warm_model_dir):
    (tmp_path / "blind.py").write_text(RANDOM_REWARD)
    summary, steps = _run(tmp_path, warm_model_dir, "blind", "algorithm.lr=1e-3", "reward.weights={verifier: 0}",
                          f"reward.functions=[{{name: blind, fn: '{tmp_path / 'blind.py'}:score'}}]")
    _fired(summary, steps, "reward_not_following")
    assert min(m["signal_share"] for m in steps) > 0.5  # the signal was there: this is not the zero-signal case


def test_a_learning_rate_far_too_high_is_named(tmp_path, ray_session, warm_model_dir):
    summary, steps = _run(tmp_path, warm_model_dir, "high", "algorithm.lr=1e-1", "alarms.no_signal_action=warn")
    _fired(summary, steps, "jumps")
    assert summary["no_progress"]["figure"] > 0.1


def test_a_learning_rate_of_nothing_is_named_and_stop_exits_78_with_a_checkpoint(tmp_path, ray_session,
                                                                                 warm_model_dir):
    from typer.testing import CliRunner

    from posttrain.cli import app
    from posttrain.evals.progress import EXIT_NO_PROGRESS
    from posttrain.tracking import read_metrics

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("{}\n")
    result = CliRunner().invoke(app, ["train", str(cfg_file), *_overrides(tmp_path, warm_model_dir, "dead", *LENGTH),
                                      "algorithm.lr=1e-9", "alarms.no_progress_action=stop",
                                      # nothing listens on port 9: each event fails at once and is recorded
                                      "ops.notify=[{url: 'http://127.0.0.1:9/hook'}]", "ops.notify_retries=0"])
    text = " ".join(result.output.split())
    print(f"\ndead: {text[-600:]}")
    assert result.exit_code == EXIT_NO_PROGRESS == 78, (result.output, repr(result.exception))
    assert "not learning over the last 6 steps: the policy barely moves" in text and "alarms.no_progress_action=warn" in text
    steps = [m for m in read_metrics(tmp_path / "dead") if "time/step" in m]
    fired = [m for m in steps if "alarm/no_progress" in m]
    assert len(fired) == 1 and fired[0]["step"] == steps[-1]["step"] >= N
    assert fired[0]["alarm/no_progress"]["cause"] == "barely_moves" and fired[0]["alarm/no_progress"]["figure"] < 1e-6
    assert (tmp_path / "dead" / "checkpoints" / f"step_{fired[0]['step']:06d}").is_dir()
    events = [json.loads(x)["event"] for x in (tmp_path / "dead" / "notifications.jsonl").read_text().splitlines()]
    assert events.count("no_progress") == 1
