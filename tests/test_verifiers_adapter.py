"""Environments of the `verifiers` library (PyPI verifiers 0.4.0, its own virtual environment .venv-verifiers, made
here on first use: ~1 min from PyPI, no torch) through `posttrain verifiers export`: a taskset written with
verifiers' own API (TaskData, Task with weighted async `@vf.reward` methods, Taskset) becomes a dataset, and its
rubric, run by verifiers' `Task.score` in the bridge process, the reward. The rewards are checked against numbers
worked out by hand, then a `posttrain train` run on Ray is scored by it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.rewards.verifiers_taskset import rubric_function

ROOT = Path(__file__).resolve().parents[1]
VERIFIERS_VENV = ROOT / ".venv-verifiers"
VERIFIERS_VERSION = "0.4.0"

TASKSET = '''
import verifiers.v1 as vf

__all__ = ["SumTaskset"]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.5)
    async def short(self, trace) -> float:
        return float(len(trace.last_reply) <= 3)


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for a in range(6):
            yield SumTask(SumData(prompt=f"{a}+2=", answer=str(a + 2), system_prompt="Answer with a number.",
                                  id=f"sum{a}"), self.config.task)
'''


@pytest.fixture(scope="module")
def verifiers_python() -> str:
    python = VERIFIERS_VENV / "bin" / "python"
    probe = [str(python), "-c", f"import verifiers; assert verifiers.__version__ == '{VERIFIERS_VERSION}'"]
    if not python.exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VERIFIERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"verifiers=={VERIFIERS_VERSION}"], check=True,
                       timeout=900)
    return str(python)


@pytest.fixture(scope="module")
def exported(verifiers_python, tmp_path_factory):
    where = tmp_path_factory.mktemp("vf")
    (where / "sum_env.py").write_text(TASKSET)
    result = CliRunner().invoke(app, ["verifiers", "export", "--python", verifiers_python, "--taskset", "sum_env",
                                      "--path", str(where), "--out", str(where / "data")])
    assert result.exit_code == 0, result.output
    assert "6 tasks of verifiers 0.4.0 taskset 'sum_env'" in result.output
    rows = [json.loads(x) for x in (where / "data" / "train.jsonl").read_text().splitlines()]
    return where, rows


def test_export_writes_each_task_as_a_row(exported):
    _, rows = exported
    assert [r["id"] for r in rows] == [f"sum{a}" for a in range(6)]
    assert rows[1]["prompt"] == [{"role": "system", "content": "Answer with a number."},
                                 {"role": "user", "content": "1+2="}]
    assert rows[1]["answer"] == "3" and len({r["verifiers_key"] for r in rows}) == 6


def test_the_rubric_scores_by_hand(exported, verifiers_python):
    where, rows = exported
    rubric = rubric_function(verifiers_python, "sum_env", str(where))
    key = [rows[1]["verifiers_key"]] * 4  # the task 1+2=, answer "3"
    # correct (weight 1) + short (weight 0.5, at most 3 characters):
    # "3" -> 1 + 0.5 = 1.5; " 3 " -> stripped equal, 3 characters: 1.5; "4" -> 0 + 0.5; "it is 3" -> 0 + 0
    assert rubric(["3", " 3 ", "4", "it is 3"], key) == [1.5, 1.5, 0.5, 0.0]
    # TRL's conversational form: each completion a list holding one assistant message
    assert rubric([[{"role": "assistant", "content": "3"}]], key[:1]) == [1.5]
    with pytest.raises(Exception, match="no task with key 'nope'"):
        rubric(["3"], ["nope"])


def test_a_python_without_verifiers_and_an_unknown_taskset_are_one_message(verifiers_python, tmp_path):
    for python, taskset, says in [(sys.executable, "sum_env", "No module named 'verifiers'"),
                                  (verifiers_python, "no_such_env", "taskset 'no_such_env' not found")]:
        result = CliRunner().invoke(app, ["verifiers", "export", "--python", python, "--taskset", taskset,
                                          "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_a_run_is_scored_by_the_rubric(exported, verifiers_python, tiny_model_dir, tmp_path):
    """2 GRPO steps on Ray (hf engine) on the exported data: every sample's reward is its task's rubric of its
    completion (re-scored here by a second bridge), logged as reward/rubric."""
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.tracking import read_metrics

    where, rows = exported
    cfg = load_config(None, [
        "name=vf", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", "rollout.engine=hf",
        "task.name=dataset", f"task.path={where / 'data' / 'train.jsonl'}", "task.heldout_size=2",
        "rollout.max_new_tokens=4", "algorithm.prompts_per_step=2", "algorithm.group_size=4", "algorithm.kl_coef=0",
        "eval.every=0", "train.steps=2", "checkpoint.every=0", "logging.progress=false", "reward.weights={}",
        f"reward.functions=[{{name: rubric, fn: '{where / 'data' / 'verifiers_reward.py'}:rubric'}}]",
    ])
    train(cfg, progress=False)
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    records = [json.loads(line) for line in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all(m["reward_failures"] == 0 for m in steps)
    keys = {r["id"]: r["verifiers_key"] for r in rows}
    rescore = rubric_function(verifiers_python, "sum_env", str(where))
    for m, record in zip(steps, records):
        ids, texts, rewards = zip(*[(sid.split("/")[1], text, r) for sid, text, r in record["samples"]])
        assert list(rewards) == rescore(list(texts), [keys[i] for i in ids])
        assert m["reward/rubric"] == pytest.approx(sum(rewards) / len(rewards))
