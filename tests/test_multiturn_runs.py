"""Multi-turn episodes run everywhere single-turn rollouts run: the real loop on real Ray with two rollout workers
(the transformers engine: it starts in a second; tests/test_multiturn_tokens.py runs episodes on vLLM too), the
calculator tool in its sandbox, a model SFT-warm-started to call it (the `tools_sft_model` fixture).

- A 4-step GRPO run records episodes (samples.jsonl) and episode/* metrics, every sample id once.
- A rollout worker SIGKILLed while it generates a turn has its share of that turn redone with the same seeds; the
  run stops at its step-2 checkpoint and is resumed to step 4 (an episode is never half-trained: every episode of a
  step ends before the step trains, a checkpoint is taken between steps). Its samples, episodes and final weights
  equal the straight run's.
- Dr.GRPO with one-step-off rollout, RLOO, REINFORCE++ and PPO (its critic on the sampled tokens) each train."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from numerics_bounds import F64_TOL, FLOAT64, state_gap
from safetensors.torch import load_file

from posttrain.demo_tools import demo_tools_config
from posttrain.loop import train
from posttrain.tracking import read_metrics
from posttrain import checkpoint as ckpt

pytestmark = pytest.mark.integration

STEPS = 4


def _cfg(tmp: Path, model_dir, name: str, *extra: str):
    return demo_tools_config([
        f"name={name}", f"runs_dir={tmp}", f"sft.out={model_dir}", "rollout.engine=hf", "rollout.num_workers=2",
        "algorithm.prompts_per_step=4", "algorithm.group_size=4", "algorithm.lr=1e-3", "algorithm.kl_coef=0.02",
        "algorithm.lr_schedule=constant",  # the resume test changes train.steps, which a linear schedule spans
        f"train.steps={STEPS}", "task.heldout_size=16", "eval.every=0", "checkpoint.every=2",
        "checkpoint.keep_last=5", "logging.progress=false",
        # exact answers alone leave many groups of 4 without reward variance at this model's ~5% success; a small
        # length term grades every sample, so every step trains
        "reward.weights={verifier: 1.0, length: 0.05}", *extra,
    ])


def _samples(run_dir: Path) -> dict[int, dict]:
    """step -> its samples.jsonl line, without the tool calls' wall times (which differ from run to run)."""
    text = (run_dir / "samples.jsonl").read_text()
    return {rec["step"]: rec for rec in map(lambda line: json.loads(re.sub(r', "seconds": [0-9.e-]+', "", line)),
                                            text.splitlines())}


def _weights(run_dir: Path, step: int) -> dict:
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors"))


# The straight run and the killed-and-resumed one are in float64 (tests/numerics_bounds.py): their weights are
# compared, and float32 sums are not reproducible from process to process on every CPU (a LoRA run's were not on an
# Intel Xeon family 6 model 207, docs/numerics.md), which AdamW turns into lr-sized moves. A lost optimizer state,
# data cursor or redone turn moves them by ~lr = 1e-3, five orders above F64_TOL.
@pytest.fixture(scope="module")
def straight(tmp_path_factory, tools_sft_model, ray_session):
    _, model_dir = tools_sft_model
    cfg = _cfg(tmp_path_factory.mktemp("mt-runs"), model_dir, "straight", *FLOAT64)
    return cfg, train(cfg, progress=False)


def test_episodes_are_recorded_once_each(straight):
    cfg, summary = straight
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    for m in steps:
        for key in ("episode/turns", "episode/tool_calls", "episode/tokens", "episode/sampled_tokens",
                    "time/generate_turn1", "time/tools", "time/environment"):
            assert m.get(key) is not None, key
        assert 1.0 <= m["episode/turns"] <= 3.0
    assert any(m.get("episode/tool_calls", 0) > 0.3 for m in steps), "the warm model should call the tool"
    trained = [m for m in steps if m.get("loss") is not None]
    assert trained and max(m["logprob_gap_mean"] for m in trained) < 1e-3  # same ids, same kernels as the engine
    ids = [sid for rec in _samples(cfg.run_dir).values() for sid, _, _ in rec["samples"]]
    assert len(ids) == STEPS * 4 * 4 == len(set(ids))
    for rec in _samples(cfg.run_dir).values():
        assert set(rec["episodes"]) == {sid for sid, _, _ in rec["samples"]}
        for sid, text, _ in rec["samples"]:
            ep = rec["episodes"][sid]
            assert ep["end_reason"] and ep["turns"][0]["role"] == "assistant"
            assert text == next(t["text"] for t in reversed(ep["turns"]) if t["role"] == "assistant")
    assert summary["heldout_accuracy_after"] is not None
    first = next(m for m in read_metrics(cfg.run_dir) if "eval/heldout_accuracy" in m)
    assert first.get("eval/tool_call_validity") is not None


def test_a_killed_worker_and_a_resume_change_nothing(tmp_path, straight, tools_sft_model, train_beside):
    """Steps 1-2 with a rollout worker SIGKILLed while it generates a turn of step 2, then a resume from the step-2
    checkpoint to step 4: every step's samples and episodes equal the straight run's, and so do the weights."""
    from test_reliability_workers import WorkerKiller

    ref, _ = straight
    cfg = _cfg(tmp_path, tools_sft_model[1], "killed", "train.steps=2", *FLOAT64)
    killer = WorkerKiller(cfg.run_dir, after_step=1)
    train_beside(cfg, killer)
    assert killer.killed is not None, "no rollout worker was caught generating"
    resumed = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": STEPS})})
    train(resumed, resume=True, progress=False)
    assert [m["step"] for m in read_metrics(cfg.run_dir) if "time/step" in m] == [1, 2, 3, 4]
    assert _samples(cfg.run_dir) == _samples(ref.run_dir)
    a, b = _weights(cfg.run_dir, STEPS), _weights(ref.run_dir, STEPS)
    assert all(t.dtype == torch.float64 for t in a.values())
    worst = state_gap(a, b)
    assert worst <= F64_TOL, f"the weights differ from the straight run's by {worst:.3g} (relative)"


@pytest.mark.parametrize("algorithm, extra", [
    ("dr_grpo", ("rollout.async_one_step_off=true",)),
    ("rloo", ()),
    ("reinforce_pp", ()),
    ("ppo", ("algorithm.critic_lr=3e-3",)),
])
def test_every_algorithm_trains_on_episodes(tmp_path, tools_sft_model, ray_session, algorithm, extra):
    cfg = _cfg(tmp_path, tools_sft_model[1], algorithm, f"algorithm.name={algorithm}", "train.steps=2",
               "checkpoint.every=0", *extra)
    train(cfg, progress=False)
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert [m["step"] for m in steps] == [1, 2]
    trained = [m for m in steps if m.get("loss") is not None]
    assert trained, f"{algorithm}: no step trained"
    assert all(abs(m["loss"]) < 1e3 and m["grad_norm"] == m["grad_norm"] for m in trained)
    if algorithm == "ppo":
        assert all(m.get("value_loss") is not None for m in trained)
    assert ckpt.latest_valid_checkpoint(cfg.run_dir / "checkpoints") is not None


def test_an_environment_returning_a_non_message_stops_the_run_with_exit_2(tmp_path, tools_sft_model, ray_session):
    from typer.testing import CliRunner

    from posttrain.cli import app

    env = Path(__file__).parent / "fixtures" / "multiturn" / "envs.py"
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(_cfg(tmp_path, tools_sft_model[1], "broken").model_dump_json())
    result = CliRunner().invoke(app, ["train", str(cfg_file), f"rollout.environment={env}:ResetReturnsText",
                                      "rollout.tools=[]"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, (result.output, repr(result.exception))
    assert f"{env}:ResetReturnsText.reset returned 'Solve:" in text and "Traceback" not in text
