"""The built-in RLHF example end to end through the real CLI, at tiny sizes: gold-labelled preference pairs ->
a Bradley-Terry proxy RM from the SFT model -> GRPO against the proxy on real Ray + vLLM, with the gold score
logged beside the proxy reward every step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.tracking import read_metrics

pytestmark = pytest.mark.integration

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "rlhf-proxy-rm.yaml")
STEPS = 12


def _invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def rlhf_run(tmp_path_factory, warm_model_dir):
    tmp = tmp_path_factory.mktemp("rlhf")
    common = [f"runs_dir={tmp}", f"model.path={warm_model_dir}", f"rm.base={warm_model_dir}",
              f"rm.data={tmp / 'pairs.jsonl'}", f"rm.out={tmp / 'rm'}", f"reward.rm_path={tmp / 'rm'}",
              "task.train_size=2000", "task.heldout_size=64"]
    pairs_out = _invoke("rm", "pairs", EXAMPLE, *common, "rm.pairs=1200")
    rm_out = _invoke("rm", "train", EXAMPLE, *common, "rm.epochs=2")
    _invoke("train", EXAMPLE, *common, f"train.steps={STEPS}", "algorithm.prompts_per_step=16", "algorithm.lr=1e-3",
            "eval.every=0", "checkpoint.every=0", "logging.progress=false", "--quiet")
    return tmp, pairs_out, rm_out, warm_model_dir


def test_proxy_rm_ranks_held_out_pairs(rlhf_run):
    tmp, pairs_out, rm_out, _ = rlhf_run
    assert "wrote 1200 pairs" in pairs_out
    stats = json.loads((tmp / "rm" / "posttrain_reward.json").read_text())
    print(f"\nproxy RM held-out pairwise accuracy {stats['heldout_accuracy']:.3f}, margin {stats['heldout_margin']:.3f}"
          f" ({stats['heldout_pairs']} pairs, 10% label noise)")
    # 10% of held-out labels are swapped, so ~0.9 is the ceiling; chance is 0.5
    assert stats["heldout_accuracy"] > 0.65


def test_grpo_against_the_proxy_logs_gold_every_step_and_raises_the_proxy(rlhf_run):
    tmp, _, _, warm_model_dir = rlhf_run
    steps = [m for m in read_metrics(tmp / "rlhf-proxy-rm") if "time/step" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    for m in steps:
        for key in ("reward/rm", "reward/gold", "reward/verifier", "reward/length", "reward/format"):
            assert m.get(key) is not None, (m["step"], key)
        assert m["reward_mean"] == pytest.approx(m["reward/rm"], abs=1e-5)  # weights {rm: 1}: the proxy is the reward
    proxy = [m["reward/rm"] for m in steps]
    gold = [m["reward/gold"] for m in steps]
    print(f"\nproxy reward/rm per step: {[round(x, 3) for x in proxy]}\ngold reward/gold per step: "
          f"{[round(x, 3) for x in gold]}")
    # Per-step means move with each step's prompts; the same held-out problems before and after show the trend:
    # 8 seeded samples of each of 64, at the rollout's temperature 1 (the expected proxy, what GRPO raises). Measured
    # (AMD EPYC model 17): +0.10 to +0.22 over 4 run seeds on the MKL_CBWR=AVX2 warm model, +0.10 on another warm
    # model; the +0.02 asked for leaves room for another CPU's trajectory.
    from posttrain.config import load_config
    from posttrain.tasks import load_task
    from proxy_gold import sampled_proxy_and_gold

    task = load_task(load_config(None, ["task.train_size=2000", "task.heldout_size=64"]).task, 0)
    final = tmp / "rlhf-proxy-rm" / "checkpoints" / f"step_{STEPS:06d}" / "model"
    before = sampled_proxy_and_gold(warm_model_dir, tmp / "rm", task, task.heldout)
    after = sampled_proxy_and_gold(final, tmp / "rm", task, task.heldout)
    print(f"{before['n']} samples of {len(task.heldout)} held-out problems: proxy {before['proxy']:.3f} -> "
          f"{after['proxy']:.3f}, gold {before['gold']:.3f} -> {after['gold']:.3f}, exact {before['exact']:.3f} -> "
          f"{after['exact']:.3f}")
    assert after["proxy"] > before["proxy"] + 0.02, (before, after)
