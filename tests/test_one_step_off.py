"""One-step-off rollout: the ratio against the behaviour policy's logprobs (hand-worked), the staleness bound, the
config it refuses, and the trainer wiring (ratio = pi_theta / pi_behaviour with the engine's logprobs; ratio 1 in
the synchronous single-pass step). No Ray here; the end-to-end run is in test_one_step_off_integration.py."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.algorithms.grpo import clipped_policy_loss
from posttrain.algorithms.off_policy import behaviour_logprobs, staleness
from posttrain.config import load_config
from posttrain.errors import PosttrainError
from numerics_bounds import assert_same


def test_ratio_against_behaviour_logprobs_by_hand():
    # One sample, two tokens; the current policy gives p = 0.5 to each token, the behaviour policy gave 0.4 and 0.625.
    # ratio = 0.5/0.4 = 1.25 (above 1 + 0.2: clipped to 1.2), 0.5/0.625 = 0.8 (inside [0.8, 1.2]: kept).
    # A = +1: per token -min(r*A, clip(r)*A) = -min(1.25, 1.2) = -1.2 and -min(0.8, 0.8) = -0.8; token mean -1.0.
    # A = -1: -min(-1.25, -1.2) = 1.25 and -min(-0.8, -0.8) = 0.8; mean 1.025. Clipped branch taken only at token 1
    # for A = +1 (1.2 < 1.25), never for A = -1.
    lp = torch.log(torch.tensor([[0.5, 0.5]]))
    engine = torch.log(torch.tensor([[0.4, 0.625]]))
    mask = torch.ones(1, 2)
    old = behaviour_logprobs(engine, mask)
    pos = clipped_policy_loss(lp, old, torch.tensor([1.0]), mask, clip_eps=0.2)
    neg = clipped_policy_loss(lp, old, torch.tensor([-1.0]), mask, clip_eps=0.2)
    assert pos.loss.item() == pytest.approx(-1.0, abs=1e-6)
    assert neg.loss.item() == pytest.approx(1.025, abs=1e-6)
    assert pos.clip_fraction.item() == pytest.approx(0.5)
    assert neg.clip_fraction.item() == pytest.approx(0.0)
    assert pos.ratio_mean.item() == pytest.approx((1.25 + 0.8) / 2, abs=1e-6)


def test_behaviour_logprobs_zero_the_padding():
    engine = torch.tensor([[-1.0, -2.0, -3.0]])
    assert behaviour_logprobs(engine, torch.tensor([[1.0, 1.0, 0.0]])).tolist() == [[-1.0, -2.0, 0.0]]


def test_staleness_bound():
    assert staleness(0, 0) == 0      # the first step: generated and trained by the initial weights
    assert staleness(5, 4) == 1      # one update between the generating weights and the trained ones
    with pytest.raises(RuntimeError, match="staleness 2"):
        staleness(6, 4)
    with pytest.raises(RuntimeError, match="staleness -1"):
        staleness(3, 4)


def test_config_refuses_what_one_step_off_cannot_honour():
    from posttrain.one_step_off import check_one_step_off_config

    check_one_step_off_config(load_config(None, ["rollout.async_one_step_off=true"]))
    # any temperature and top_p: the engines return the sampled distribution's logprobs (behaviour_logprobs_mode)
    check_one_step_off_config(load_config(None, ["rollout.max_staleness=2", "rollout.temperature=0.7",
                                                 "rollout.top_p=0.9"]))
    with pytest.raises(PosttrainError, match="dynamic_sampling_rounds"):
        check_one_step_off_config(load_config(None, ["rollout.async_one_step_off=true", "algorithm.name=dapo"]))
    with pytest.raises(PosttrainError, match="action is rollback"):
        check_one_step_off_config(load_config(None, ["rollout.async_one_step_off=true",
                                                     "alarms.rules=[{kind: repetition, action: rollback}]"]))
    with pytest.raises(PosttrainError, match="topology.trainer_ranks=2"):
        check_one_step_off_config(load_config(None, ["rollout.async_one_step_off=true", "topology.trainer_ranks=2"]))
    assert load_config(None, []).rollout.async_one_step_off is False  # the demo stays synchronous


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> str:
    from posttrain.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "p", "1m", seed=1))


def _trainer_and_batch(policy_dir: str, *overrides: str):
    from posttrain.training.batch import completion_logprobs, pack
    from posttrain.training.trainer import Trainer, TrainBatch

    # float64: `own` comes from the padded forward, the step from packed rows (tests/numerics_bounds.py)
    cfg = load_config(None, [f"model.path={policy_dir}", "algorithm.lr=1e-9", "topology.torch_threads=1",
                             "model.dtype=float64", "rollout.engine=hf", *overrides])
    trainer = Trainer(cfg.to_dict(), policy_dir)
    prompts, comps = [[3, 4, 5], [6, 7]], [[8, 9], [10, 11, 12]]
    with torch.no_grad():
        own = completion_logprobs(trainer.model, pack(prompts, comps, trainer.pad_id))
    return trainer, TrainBatch, prompts, comps, own


def test_trainer_takes_the_ratio_against_the_engine_logprobs_when_one_step_off(policy_dir):
    # The engine "sampled" with a policy that gave every token log-prob 0.3 lower than the trainer's weights do:
    # ratio = exp(lp - (lp - 0.3)) = exp(0.3) = 1.34986 on every token before the (tiny-lr) update.
    trainer, TrainBatch, prompts, comps, own = _trainer_and_batch(policy_dir, "rollout.async_one_step_off=true")
    engine = [[v - 0.3 for v in own[i, : len(c)].tolist()] for i, c in enumerate(comps)]
    m = trainer.train_step(TrainBatch(prompts, comps, [1.0, -1.0], engine))
    assert_same(m["ratio_mean"], math.exp(0.3), "ratio")
    assert_same(m["logprob_gap_mean"], 0.3, "gap")  # engine vs the trainer's own logprobs


def test_synchronous_single_pass_keeps_ratio_one_and_measures_the_gap(policy_dir):
    # Synchronous: the old logprobs are the trainer's own (one pass), so the same engine offset moves only the gap.
    trainer, TrainBatch, prompts, comps, own = _trainer_and_batch(policy_dir)
    engine = [[v - 0.3 for v in own[i, : len(c)].tolist()] for i, c in enumerate(comps)]
    m = trainer.train_step(TrainBatch(prompts, comps, [1.0, -1.0], engine))
    assert_same(m["ratio_mean"], 1.0, "ratio")
    assert m["clip_fraction"] == 0.0
    assert_same(m["logprob_gap_mean"], 0.3, "gap")
    assert m["entropy"] > 0
