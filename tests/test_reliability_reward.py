"""Reward isolation: a verifier that raises, hangs, returns NaN/inf, the wrong type or kills its own process gives
a per-sample failure record of its kind and the default reward; the run-level budget aborts with a clear error."""

from __future__ import annotations

import math
import os
import time

import pytest

from posttrain.errors import PosttrainError
from posttrain.rewards.verifier import FailureBudget, IsolatedScorer, failure_counts
from posttrain.rewards.worker import RewardWorker
from posttrain.tasks import Problem


class MisbehavingTask:
    """A verifier that does what the completion says."""

    name = "misbehaving"

    def score(self, problem: Problem, completion: str):
        if completion == "raise":
            raise KeyError("no such answer")
        if completion == "hang":
            while True:
                pass
        if completion == "exit":
            os._exit(3)
        return {"nan": math.nan, "inf": -math.inf, "str": "1.0", "none": None, "bool": True}.get(completion, 0.75)


def make_misbehaving_task() -> MisbehavingTask:  # module level: the scoring process is spawned and unpickles it
    return MisbehavingTask()


@pytest.fixture(scope="module")
def scorer():
    s = IsolatedScorer(make_misbehaving_task, timeout_s=1.0, default=-0.5)
    yield s
    s.close()


@pytest.mark.parametrize("completion, kind", [
    ("raise", "exception: KeyError"), ("nan", "nan: verifier returned nan"), ("inf", "nan: verifier returned -inf"),
    ("str", "type: verifier returned str"), ("none", "type: verifier returned NoneType"),
    ("bool", "type: verifier returned bool"), ("exit", "exception: the verifier's process died (exit code 3)"),
])
def test_each_failure_is_a_record_of_its_kind_with_the_default_reward(scorer, completion, kind):
    r = scorer.score(Problem("p", "q", "a"), completion)
    assert r.reward == -0.5 and r.error.startswith(kind), r


def test_a_hanging_verifier_is_cut_off_and_the_next_sample_scores_normally(scorer):
    t = time.perf_counter()
    r = scorer.score(Problem("p", "q", "a"), "hang")
    took = time.perf_counter() - t
    assert (r.reward, r.error) == (-0.5, "timeout: verifier ran longer than 1 s")
    assert took < 5, took
    assert scorer.score(Problem("p", "q", "a"), "fine").reward == 0.75  # a fresh process took over


def test_reward_worker_scores_the_configured_task(tmp_path):
    from posttrain.config import load_config

    w = RewardWorker(load_config(None, ["task.train_size=50", "task.heldout_size=10"]).to_dict())
    try:
        assert w.score([("x", "12+30=", "42", "42"), ("y", "1+1=", "2", "3")]) == [(1.0, None), (0.0, None)]
    finally:
        w.scorer.close()


def test_failure_counts_cover_every_kind():
    errors = [None, "exception: KeyError: 'x'", "timeout: verifier ran longer than 1 s", None, "nan: verifier returned nan",
              "exception: ValueError: y"]
    assert failure_counts(errors) == {"reward_failures/exception": 2, "reward_failures/timeout": 1,
                                      "reward_failures/nan": 1, "reward_failures/type": 0}


def _step(n: int, failed: int, kind: str = "timeout") -> tuple[dict, dict]:
    record = {"reward_failures": failed, **failure_counts([f"{kind}: x"] * failed)}
    samples = {"samples": [[f"0/p/{i}", "", 0.0] for i in range(n)],
               "reward_errors": {f"0/p/{i}": f"{kind}: x" for i in range(failed)}}
    return record, samples


def test_failure_budget_aborts_over_its_window_with_a_clear_message():
    budget = FailureBudget(max_fraction=0.5, window_steps=2)
    budget.check(*_step(8, 4))  # 4/8 = 0.5: not above the threshold
    budget.check(*_step(8, 0))  # window (8,4),(8,0): 4/16
    budget.check(*_step(8, 4))  # window (8,0),(8,4): 4/16 — the first step left the window
    with pytest.raises(PosttrainError) as e:
        budget.check(*_step(8, 8))  # window (8,4),(8,8): 12/16 = 75% > 50%
    msg = str(e.value)
    assert "12 of the last 16 samples (75%, over 2 steps)" in msg
    assert "reward.max_failure_fraction=0.5" in msg and "timeout: 12" in msg and "sample 0/p/0: timeout: x" in msg


def test_a_budget_of_one_never_aborts():
    budget = FailureBudget(max_fraction=1.0, window_steps=3)
    for _ in range(5):
        budget.check(*_step(4, 4))


@pytest.mark.integration
def test_a_run_whose_every_verifier_call_times_out_stops_at_its_first_step(tmp_path, warm_model_dir):
    """End to end on Ray: the python verifier (a sandboxed subprocess, ~0.1 s a sample) under a 10 ms
    reward.timeout_seconds -> every sample is a timeout failure, counted in the step's metrics, and the run aborts
    with the budget's message after its first step."""
    import json

    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.tracking import read_metrics

    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a + 7}=", "answer": str(2 * a + 7)}) + "\n"
                            for a in range(10, 50)))
    cfg = load_config(None, [
        "name=badreward", f"runs_dir={tmp_path}", f"model.path={warm_model_dir}", "rollout.engine=hf",
        "task.name=jsonl", f"task.path={data}", "task.reward=python", "task.heldout_size=4",
        "algorithm.prompts_per_step=2", "algorithm.group_size=2", "algorithm.kl_coef=0",
        "eval.every=0", "train.steps=3", "reward.timeout_seconds=0.01", "logging.progress=false",
    ])
    with pytest.raises(PosttrainError, match=r"4 of the last 4 samples .*reward.max_failure_fraction=0.5"):
        train(cfg, progress=False)
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert len(steps) == 1
    assert steps[0]["reward_failures"] == steps[0]["reward_failures/timeout"] == 4
    errors = json.loads((cfg.run_dir / "samples.jsonl").read_text().splitlines()[0])["reward_errors"]
    assert len(errors) == 4 and all(e == "timeout: verifier ran longer than 0.01 s" for e in errors.values())
