"""Rollout correction wired into the trainer (no Ray): with algorithm.rollout_correction the ratio is taken
against the trainer's own pre-update logprobs and importance weights pi_train/pi_rollout (truncated or masked)
multiply each token's loss; the mismatch metrics come with every step whatever the mode. Numbers by hand; the
math itself is tested in test_rollout_correction.py."""

from __future__ import annotations

import math

import pytest
import torch

from numerics_bounds import assert_same
from posttrain.config import load_config


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> str:
    from posttrain.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "p", "1m", seed=1))


def _step(policy_dir: str, offset: float, *overrides: str) -> dict:
    """One train step on two samples (2 and 3 completion tokens, advantages +1 and -1) whose engine logprobs are the
    trainer's own minus `offset`: every token's ratio pi_train/pi_rollout is exp(offset). float64 throughout."""
    from posttrain.training.batch import completion_logprobs, pack
    from posttrain.training.trainer import Trainer, TrainBatch

    cfg = load_config(None, [f"model.path={policy_dir}", "algorithm.lr=1e-9", "topology.torch_threads=1",
                             "model.dtype=float64", "rollout.engine=hf", "algorithm.kl_coef=0", *overrides])
    trainer = Trainer(cfg.to_dict(), policy_dir)
    prompts, comps = [[3, 4, 5], [6, 7]], [[8, 9], [10, 11, 12]]
    with torch.no_grad():
        own = completion_logprobs(trainer.model, pack(prompts, comps, trainer.pad_id))
    engine = [[v - offset for v in own[i, : len(c)].tolist()] for i, c in enumerate(comps)]
    return trainer.train_step(TrainBatch(prompts, comps, [1.0, -1.0], engine))


def test_mismatch_metrics_come_with_every_step_by_hand(policy_dir):
    # log r = 0.3 on all 5 tokens: k3 = e^0.3 - 1 - 0.3 = 0.0498588; perplexity ratio exp(mean(rollout - train))
    # = e^-0.3 = 0.7408182; chi2 = E[r^2] - 1 = e^0.6 - 1 = 0.8221188; max |log r| = 0.3. mode none: nothing capped.
    m = _step(policy_dir, 0.3)
    assert_same(m["mismatch/k3_kl"], math.exp(0.3) - 1.3, "k3")
    assert_same(m["mismatch/ppl_ratio"], math.exp(-0.3), "ppl ratio")
    assert_same(m["mismatch/chi2"], math.exp(0.6) - 1, "chi2")
    assert_same(m["mismatch/log_ratio_abs_max"], 0.3, "max")
    assert m["mismatch/capped_share"] == m["mismatch/masked_share"] == 0.0


def test_tis_weights_the_loss_and_keeps_the_trainers_ratio(policy_dir):
    # TIS, cap 2: w = min(e^0.3, 2) = 1.3498588 on every token; the PPO ratio is against the trainer's own
    # logprobs: 1. Token mean of -w*A: (2 tokens * -w + 3 tokens * +w) / 5 = w / 5 = 0.2699718.
    m = _step(policy_dir, 0.3, "algorithm.rollout_correction.mode=tis")
    assert_same(m["ratio_mean"], 1.0, "ratio")
    assert_same(m["policy_loss"], math.exp(0.3) / 5, "loss")
    assert m["mismatch/capped_share"] == 0.0
    # e^1 = 2.718 > 2: every token capped at 2 -> loss 2/5
    m = _step(policy_dir, 1.0, "algorithm.rollout_correction.mode=tis")
    assert_same(m["policy_loss"], 2 / 5, "capped loss")
    assert m["mismatch/capped_share"] == 1.0


def test_mis_drops_what_leaves_the_band(policy_dir):
    # MIS, cap 2: e^0.3 inside [1/2, 2] -> weighted like TIS; e^1 outside -> every token dropped, policy loss 0.
    m = _step(policy_dir, 0.3, "algorithm.rollout_correction.mode=mis")
    assert_same(m["policy_loss"], math.exp(0.3) / 5, "kept loss")
    assert m["mismatch/masked_share"] == 0.0
    m = _step(policy_dir, 1.0, "algorithm.rollout_correction.mode=mis")
    assert m["policy_loss"] == 0.0
    assert m["mismatch/masked_share"] == 1.0
    # sequence level, cap 4: row 1's ratio e^(2*0.6) = 3.32 stays, row 2's e^(3*0.6) = 6.05 leaves -> 3 of 5 dropped;
    # token mean of -w*A over all 5 tokens: 2 * -3.3201169 / 5
    m = _step(policy_dir, 0.6, "algorithm.rollout_correction.mode=mis", "algorithm.rollout_correction.level=sequence",
              "algorithm.rollout_correction.cap=4")
    assert_same(m["mismatch/masked_share"], 3 / 5, "masked")
    assert_same(m["policy_loss"], -2 * math.exp(1.2) / 5, "sequence loss")


def test_uncorrected_async_takes_the_ratio_against_the_engine(policy_dir):
    # no correction, asynchronous: the old logprobs are the engine's (the behaviour policy's): ratio e^0.3
    m = _step(policy_dir, 0.3, "rollout.max_staleness=2")
    assert_same(m["ratio_mean"], math.exp(0.3), "ratio")


def _planted(policy_dir: str, engine_temperature: float, *overrides: str) -> dict:
    """Samples from a real engine (HfEngine, float64, "sampled" logprobs) at `engine_temperature` while the
    trainer's config says temperature 1, then one train step on them: the planted mismatch of the issue."""
    from posttrain.rollout.engine import SamplingSpec
    from posttrain.rollout.hf_engine import HfEngine
    from posttrain.training.trainer import Trainer, TrainBatch

    engine = HfEngine(policy_dir, dtype="float64", logprobs="sampled")
    prompts = [[3, 4, 5], [6, 7], [9, 10, 11, 12]]
    groups = engine.generate(prompts, SamplingSpec(n=8, max_new_tokens=12, temperature=engine_temperature),
                             seeds=[1, 2, 3])
    rows = [(p, c) for p, group in zip(prompts, groups) for c in group]
    cfg = load_config(None, [f"model.path={policy_dir}", "algorithm.lr=1e-9", "topology.torch_threads=1",
                             "model.dtype=float64", "rollout.engine=hf", "algorithm.kl_coef=0", *overrides])
    trainer = Trainer(cfg.to_dict(), policy_dir)
    batch = TrainBatch([p for p, _ in rows], [c.token_ids for _, c in rows], [1.0, -1.0] * (len(rows) // 2),
                       [c.logprobs for _, c in rows])
    return trainer.train_step(batch)


def test_planted_temperature_mismatch_shows_and_mis_drops_it(policy_dir):
    # Engine and trainer agree (temperature 1, both float64): the mismatch is rounding only (k3 ~ 1e-30 by
    # construction: log r ~ 1e-15, k3 ~ (log r)^2 / 2), nothing leaves MIS's band.
    same = _planted(policy_dir, 1.0, "algorithm.rollout_correction.mode=mis")
    assert same["mismatch/k3_kl"] < 1e-20 and same["mismatch/masked_share"] == 0.0
    # The engine samples at temperature 0.3 but the trainer assumes 1: the tokens the engine favoured are far less
    # likely to the trainer (measured on this model: k3 0.15, max |log r| 1.6). The metrics show it by orders of
    # magnitude, and MIS drops the tokens whose ratio leaves [1/2, 2].
    hot = _planted(policy_dir, 0.3, "algorithm.rollout_correction.mode=mis")
    assert hot["mismatch/k3_kl"] > 1e-3
    assert hot["mismatch/log_ratio_abs_max"] > math.log(2)
    assert hot["mismatch/masked_share"] > 0.0
    # uncorrected, the same batch trains every token with no sign of the mismatch in the loss
    plain = _planted(policy_dir, 0.3)
    assert plain["mismatch/masked_share"] == 0.0 and plain["mismatch/k3_kl"] == pytest.approx(hot["mismatch/k3_kl"])
