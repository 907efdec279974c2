"""Asynchronous rollout end to end on real Ray and a real vLLM engine, one step off (k = 1) and two (k = 2, with
truncated importance sampling): the run completes, every sample id of every step is there exactly once (the
prompts the data cursor gives, in order), no trained sample is more than k updates old (one step off: staleness 0
then exactly 1), the mismatch metrics are logged, and the saved data cursor is that of the last trained step, not
of the rollouts in flight."""

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


@pytest.mark.parametrize("k, extra", [(1, ["rollout.async_one_step_off=true"]),
                                      (2, ["rollout.max_staleness=2", "algorithm.rollout_correction.mode=tis"])])
def test_async_run_keeps_every_sample_once_and_staleness_at_most_k(tmp_path, tiny_model_dir, k, extra):
    cfg = load_config(None, [
        "name=async", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", f"train.steps={STEPS}",
        f"algorithm.prompts_per_step={PROMPTS}", f"algorithm.group_size={GROUP}", "algorithm.kl_coef=0.02",
        # the random model never solves a problem: keep its groups so that every step trains (and staleness shows)
        "algorithm.skip_zero_variance_groups=false", "task.heldout_size=16",
        "eval.every=0", "checkpoint.every=2", "logging.progress=false", *extra,
    ])
    summary = train(cfg, progress=False)
    assert summary["steps"] == STEPS

    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    staleness = [m["rollout/staleness"] for m in steps]
    versions = [m["rollout/behaviour_version"] for m in steps]
    if k == 1:  # step 1 trains on the initial weights' samples; every later batch came from weights one update older
        assert staleness == [0] + [1] * (STEPS - 1)
        assert versions == [0] + list(range(STEPS - 1))
    else:  # which version a queued batch loads depends on timing; the bound does not
        assert staleness[:2] == [0, 1] and all(0 <= lag <= k for lag in staleness)
        assert versions == sorted(versions)
    assert all(m["time/rollout_generate"] > 0 and m["tokens_per_s"] > 0 for m in steps)
    assert all(m["mismatch/k3_kl"] >= 0 and "mismatch/capped_share" in m for m in steps)

    # nothing lost, nothing duplicated: step s holds exactly the cursor's s-th batch, each prompt group_size times
    task = load_task(cfg.task, cfg.seed)
    sampler = PromptSampler(task.train, cfg.seed)
    records = [json.loads(line) for line in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # every trained sample records the policy version that generated it: never more than k updates old
    assert all(0 <= r["trained_at_version"] - r["policy_version"] <= k for r in records)
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
