"""One-step-off rollout end to end on real Ray and a real vLLM engine: the run completes, every sample id of every
step is there exactly once (the prompts the data cursor gives, in order), staleness is 0 then 1, and the saved
data cursor is that of the last trained step, not of the rollout that was in flight."""

from __future__ import annotations

import json

import pytest

from posttrain.config import load_config
from posttrain.loop import train
from posttrain.rollout.sampler import PromptSampler
from posttrain.tasks import load_task
from posttrain.tracking import read_metrics
from posttrain import checkpoint as ckpt

pytestmark = pytest.mark.integration

STEPS, PROMPTS, GROUP = 4, 4, 4


def test_one_step_off_run_keeps_every_sample_once_and_staleness_at_most_one(tmp_path, tiny_model_dir):
    cfg = load_config(None, [
        "name=async", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", f"train.steps={STEPS}",
        f"algorithm.prompts_per_step={PROMPTS}", f"algorithm.group_size={GROUP}", "algorithm.kl_coef=0.02",
        # the random model never solves a problem: keep its groups so that every step trains (and staleness shows)
        "algorithm.skip_zero_variance_groups=false", "rollout.async_one_step_off=true", "task.heldout_size=16",
        "eval.every=0", "checkpoint.every=2", "logging.progress=false",
    ])
    summary = train(cfg, progress=False)
    assert summary["steps"] == STEPS

    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    # step 1 trains on the initial weights' samples; every later batch came from weights one update older
    assert [m["rollout/staleness"] for m in steps] == [0] + [1] * (STEPS - 1)
    assert [m["rollout/behaviour_version"] for m in steps] == [0] + list(range(STEPS - 1))
    assert all(m["time/rollout_generate"] > 0 and m["tokens_per_s"] > 0 for m in steps)

    # nothing lost, nothing duplicated: step s holds exactly the cursor's s-th batch, each prompt group_size times
    task = load_task(cfg.task, cfg.seed)
    sampler = PromptSampler(task.train, cfg.seed)
    records = [json.loads(line) for line in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    all_ids = []
    for r in records:
        expected = [f"{r['step'] - 1}/{p.id}/{j}" for p in sampler.next_batch(PROMPTS) for j in range(GROUP)]
        ids = [sid for sid, _, _ in r["samples"]]
        assert ids == expected
        all_ids += ids
    assert len(all_ids) == len(set(all_ids)) == STEPS * PROMPTS * GROUP

    # the checkpoint after step 2 saves the cursor after step 2's prompts (step 3's were drawn, not trained)
    state = json.loads((cfg.run_dir / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["cursor"] == {"epoch": 0, "offset": 2 * PROMPTS}
    assert ckpt.latest_valid_checkpoint(cfg.run_dir / "checkpoints").name == f"step_{STEPS:06d}"
