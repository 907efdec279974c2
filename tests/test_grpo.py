"""GRPO advantages and loss against numbers worked out by hand (see the comments for the arithmetic).
The tensors are float64 (numerics_bounds.f64): float32's rounding could reach the abs 1e-6 on some CPUs' kernels."""

import math

import pytest
import torch
from numerics_bounds import f64

from posttrain.algorithms.common import aggregate, kl_k3
from posttrain.algorithms.grpo import clipped_policy_loss, group_advantages, nonzero_variance_groups


def test_group_advantages_by_hand():
    # group 1: [1,0,0,1], mean .5, unbiased std sqrt(4*.25/3)=0.57735 -> +-0.866025
    # group 2: [1,1,1,1], all equal -> 0
    rewards = f64([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, 4)
    assert adv.dtype == torch.float64
    expected = [0.866025, -0.866025, -0.866025, 0.866025, 0, 0, 0, 0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)
    assert nonzero_variance_groups(rewards, 4).tolist() == [True, False]


def test_group_advantages_without_std_scaling():
    # Dr.GRPO-style: only centred. [0.2, 0.6] -> mean .4 -> [-.2, .2]
    adv = group_advantages(f64([0.2, 0.6]), 2, scale=False)
    assert adv.tolist() == pytest.approx([-0.2, 0.2], abs=1e-6)


def test_group_advantages_rejects_ragged_groups():
    with pytest.raises(ValueError):
        group_advantages(f64([1.0, 0.0, 1.0]), 2)


def _example():
    ln = math.log
    logprobs = f64([[ln(0.5), ln(0.5)], [ln(0.9), 0.0]], requires_grad=True)
    old = f64([[ln(0.4), ln(0.5)], [ln(0.5), 0.0]])
    ref = f64([[ln(0.25), ln(0.5)], [ln(0.45), 0.0]])
    mask = f64([[1.0, 1.0], [1.0, 0.0]])
    adv = f64([1.0, -1.0])
    return logprobs, old, ref, mask, adv


def test_clipped_loss_token_aggregation_by_hand():
    # tok(0,0): ratio .5/.4=1.25, A=+1 -> min(1.25, 1.2)=1.2 (clipped) -> -1.2
    # tok(0,1): ratio 1 -> -1.0
    # tok(1,0): ratio .9/.5=1.8, A=-1 -> min(-1.8, -1.2) = -1.8 (unclipped) -> +1.8
    # token mean: (-1.2 - 1.0 + 1.8) / 3 = -0.133333
    logprobs, old, _, mask, adv = _example()
    out = clipped_policy_loss(logprobs, old, adv, mask, clip_eps=0.2, agg="token")
    assert out.loss.dtype == torch.float64
    assert float(out.loss.detach()) == pytest.approx(-0.4 / 3, abs=1e-6)
    assert float(out.clip_fraction) == pytest.approx(1 / 3, abs=1e-6)
    out.loss.backward()
    # d/dlogp of -(ratio*A)/3 is -ratio*A/3: clipped token 0; tok(0,1): -1/3; tok(1,0): -(1.8*-1)/3 = 0.6
    assert logprobs.grad.flatten().tolist() == pytest.approx([0.0, -1 / 3, 0.6, 0.0], abs=1e-6)


def test_clipped_loss_sequence_aggregation_by_hand():
    # seq 0: (-1.2 - 1.0)/2 = -1.1 ; seq 1: 1.8 ; mean = 0.35
    logprobs, old, _, mask, adv = _example()
    out = clipped_policy_loss(logprobs, old, adv, mask, clip_eps=0.2, agg="sequence")
    assert float(out.loss.detach()) == pytest.approx(0.35, abs=1e-6)


def test_k3_kl_term_by_hand():
    # tok(0,0): ref/p = .25/.5 = .5 -> k3 = .5 - ln .5 - 1 = 0.193147 ; tok(0,1): 0 ; tok(1,0): .45/.9 = .5 -> 0.193147
    # mean over 3 tokens = 0.128765 ; loss = -0.133333 + 0.1 * 0.128765 = -0.120457
    logprobs, old, ref, mask, adv = _example()
    out = clipped_policy_loss(logprobs, old, adv, mask, clip_eps=0.2, ref_logprobs=ref, kl_coef=0.1, agg="token")
    assert float(out.kl) == pytest.approx(0.128765, abs=1e-6)
    assert float(out.loss.detach()) == pytest.approx(-0.4 / 3 + 0.0128765, abs=1e-6)
    assert float(kl_k3(torch.tensor(0.3), torch.tensor(0.3))) == 0.0


def test_asymmetric_clip_higher():
    # ratio 1.25, A=+1, clip high 0.28 -> not clipped: -1.25
    lp = f64([[math.log(0.5)]])
    old = f64([[math.log(0.4)]])
    out = clipped_policy_loss(lp, old, f64([1.0]), f64([[1.0]]), clip_eps=0.2, clip_eps_high=0.28)
    assert float(out.loss.detach()) == pytest.approx(-1.25, abs=1e-6)


def test_aggregate_ignores_masked_tokens():
    values = f64([[1.0, 100.0], [3.0, 5.0]])
    mask = f64([[1.0, 0.0], [1.0, 1.0]])
    assert float(aggregate(values, mask, "token")) == pytest.approx(3.0)  # (1+3+5)/3
    assert float(aggregate(values, mask, "sequence")) == pytest.approx(2.5)  # (1 + 4)/2


def test_learning_rate_schedule_by_hand():
    from posttrain.training.trainer import learning_rate

    # linear from 1e-3 to 1e-4 over 11 steps: step 5 is half way -> 1e-3 * (1 - 0.9 * 0.5) = 5.5e-4
    assert learning_rate(0, 11, 1e-3, "linear", 0.1) == pytest.approx(1e-3)
    assert learning_rate(5, 11, 1e-3, "linear", 0.1) == pytest.approx(5.5e-4)
    assert learning_rate(10, 11, 1e-3, "linear", 0.1) == pytest.approx(1e-4)
    assert learning_rate(7, 11, 1e-3, "constant", 0.1) == 1e-3
