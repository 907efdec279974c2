"""Partial rollouts end to end on real Ray and a real vLLM engine (rollout.max_staleness=2,
rollout.partial_rollouts=true): the engines are slowed (remote/faults.py's slow-engine-step) so that new weights
arrive while a batch is generated; the run completes, every sample id is there once, some samples carry tokens of two
policy versions, and every batch's version (its oldest token's) is at most k updates older than the weights it
trains. The engine and driver pieces are tested in tests/rollout/test_partial_rollouts.py."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

STEPS, PROMPTS_PER_STEP, GROUP, K = 4, 2, 4, 2


def test_partial_rollout_run_keeps_every_sample_once_and_bounds_staleness(tmp_path, tiny_model_dir, monkeypatch):
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.remote import faults
    from posttrain.rollout.sampler import PromptSampler
    from posttrain.tasks import load_task
    from posttrain.tracking import read_metrics

    slow = tmp_path / "faults"
    slow.mkdir()
    (slow / "slow-engine-step").write_text("0.05")  # 48 steps ~2.5 s per round: training ends mid-generation
    monkeypatch.setenv(faults.ENV, str(slow))
    cfg = load_config(None, [
        "name=partial", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", f"train.steps={STEPS}",
        f"algorithm.prompts_per_step={PROMPTS_PER_STEP}", f"algorithm.group_size={GROUP}",
        "algorithm.skip_zero_variance_groups=false", "task.heldout_size=8", "eval.every=0", "checkpoint.every=0",
        "logging.progress=false", f"rollout.max_staleness={K}", "rollout.partial_rollouts=true",
        "rollout.max_new_tokens=48", "algorithm.rollout_correction.mode=tis",
    ])
    summary = train(cfg, progress=False)
    assert summary["steps"] == STEPS

    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert all(0 <= m["rollout/staleness"] <= K for m in steps)
    records = [json.loads(line) for line in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    sampler = PromptSampler(load_task(cfg.task, cfg.seed).train, cfg.seed)
    all_ids = []
    for r in records:
        ids = [sid for sid, _, _ in r["samples"]]
        assert ids == [f"{r['step'] - 1}/{p.id}/{j}" for p in sampler.next_batch(PROMPTS_PER_STEP)
                       for j in range(GROUP)]
        all_ids += ids
        assert len(r["token_versions"]) == len(ids)
        oldest = min(lo for lo, _ in r["token_versions"])
        assert r["policy_version"] == oldest  # the batch's version is its oldest token's
        assert 0 <= r["trained_at_version"] - oldest <= K
    assert len(all_ids) == len(set(all_ids)) == STEPS * PROMPTS_PER_STEP * GROUP
    resumed = [v for r in records for v in r["token_versions"] if v[1] > v[0]]
    assert resumed, "no sample was resumed under newer weights"
    assert any(m.get("rollout/resumed_share", 0) > 0 for m in steps)
