"""The served losses against numbers worked out by hand (algorithms/tinker_losses.py)."""

import math

import pytest
import torch

from posttrain.algorithms import tinker_losses as L

LP = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)     # trainer logprobs
OLD = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)    # sampler logprobs
ADV = torch.tensor([2.0, -1.0, 3.0], dtype=torch.float64)
# ratios exp(LP - OLD): e^0.5 = 1.6487..., e^-1 = 0.3679..., 1


def test_cross_entropy_is_minus_logprob_times_any_weight():
    w = torch.tensor([1.0, -0.5, 0.0], dtype=torch.float64)
    assert L.elementwise_loss("cross_entropy", LP, {"weights": w}).tolist() == [1.0, -1.0, 0.0]


def test_importance_sampling_by_hand():
    got = L.elementwise_loss("importance_sampling", LP, {"logprobs": OLD, "advantages": ADV}).tolist()
    want = [-math.exp(0.5) * 2.0, math.exp(-1.0) * 1.0, -3.0]
    assert got == pytest.approx(want, rel=1e-15)


def test_ppo_takes_the_pessimistic_of_clipped_and_unclipped():
    got = L.elementwise_loss("ppo", LP, {"logprobs": OLD, "advantages": ADV}).tolist()
    # token 0: r=1.6487, A=2: min(3.297, 1.2*2=2.4) = 2.4 -> -2.4
    # token 1: r=0.3679, A=-1: min(-0.3679, 0.8*-1=-0.8) = -0.8 -> 0.8
    # token 2: r=1, A=3 -> -3
    assert got == pytest.approx([-2.4, 0.8, -3.0], rel=1e-15)
    narrow = L.elementwise_loss("ppo", LP, {"logprobs": OLD, "advantages": ADV},
                                {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}).tolist()
    assert narrow == pytest.approx([-2.2, 0.9, -3.0], rel=1e-15)


def test_cispo_value_and_gradient():
    lp = LP.clone().requires_grad_(True)
    loss = L.elementwise_loss("cispo", lp, {"logprobs": OLD, "advantages": ADV})
    # clipped ratios 1.2, 0.8, 1.0 (no gradient through them): loss = -c * lp * A
    assert loss.tolist() == pytest.approx([-(1.2 * -1.0 * 2.0), -(0.8 * -2.0 * -1.0), -(1.0 * -0.5 * 3.0)], rel=1e-15)
    loss.sum().backward()
    assert lp.grad.tolist() == pytest.approx([-1.2 * 2.0, -0.8 * -1.0, -1.0 * 3.0], rel=1e-15)


def test_importance_sampling_gradient_is_minus_ratio_times_advantage():
    lp = LP.clone().requires_grad_(True)
    L.elementwise_loss("importance_sampling", lp, {"logprobs": OLD, "advantages": ADV}).sum().backward()
    assert lp.grad.tolist() == pytest.approx([-math.exp(0.5) * 2.0, math.exp(-1.0), -3.0], rel=1e-15)
