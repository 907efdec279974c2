"""The algorithm family's advantages and losses against numbers worked out by hand (arithmetic in the comments),
and the config presets/validation that name each algorithm.
The tensors are float64 (numerics_bounds.f64): float32's rounding could reach the abs 1e-6 on some CPUs' kernels."""

import math

import pytest
import torch
from numerics_bounds import f64

from posttrain.algorithms.advantages import compute_advantages, kl_in_reward, shape_rewards
from posttrain.algorithms.common import aggregate
from posttrain.algorithms.dapo import fill_groups, overlong_buffer_tokens, overlong_penalty
from posttrain.algorithms.dpo import dpo_loss, implicit_reward
from posttrain.algorithms.ppo import clipped_value_loss, gae, whiten
from posttrain.algorithms.reinforce_pp import reinforce_pp_advantages, returns_to_go, terminal_rewards
from posttrain.algorithms.rloo import leave_one_out_advantages
from posttrain.config import load_config
from posttrain.errors import PosttrainError


def _algo(*overrides):
    return load_config(None, list(overrides)).algorithm


# ------------------------------------------------------------------ Dr.GRPO


def test_dr_grpo_constant_aggregation_by_hand():
    # seq 0: tokens 1 + 3 = 4 ; seq 1: token 5 (second masked) -> 5 ; each / 8, mean over 2 seqs = (0.5 + 0.625)/2
    values = f64([[1.0, 3.0], [5.0, 100.0]])
    mask = f64([[1.0, 1.0], [1.0, 0.0]])
    assert float(aggregate(values, mask, "constant", 8)) == pytest.approx(0.5625)
    # the sequence mean would instead be (2 + 5)/2 = 3.5: the short sequence's token weighs twice as much there
    assert float(aggregate(values, mask, "sequence")) == pytest.approx(3.5)


def test_dr_grpo_preset_and_advantages():
    a = _algo("algorithm.name=dr_grpo", "algorithm.group_size=4")
    assert a.scale_rewards is False and a.loss_agg == "constant"
    # [1,0,0,0]: mean .25 -> centred [.75, -.25, -.25, -.25], no division by the std (0.5)
    adv = compute_advantages(a, f64([1.0, 0.0, 0.0, 0.0])).advantages
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # an explicit key beats the preset
    assert _algo("algorithm.name=dr_grpo", "algorithm.loss_agg=token").loss_agg == "token"


# ------------------------------------------------------------------ DAPO


def test_dapo_overlong_penalty_by_hand():
    # L_max 8, L_cache 2 -> no penalty up to 6, 7 -> (6-7)/2 = -0.5, 8 -> -1 ; scaled by penalty 0.5 in the second line
    lengths = torch.tensor([3, 6, 7, 8])
    assert overlong_penalty(lengths, 8, 2).tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0])
    assert overlong_penalty(lengths, 8, 2, 0.5).tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5])
    assert overlong_penalty(lengths, 8, 0).tolist() == [0.0] * 4
    # DAPO's 4096/20480 = 0.2 of an 8-token budget: 1.6 -> 2 tokens
    assert overlong_buffer_tokens(8, 0.2) == 2 and overlong_buffer_tokens(8, 0.0) == 0


def test_dapo_preset_shapes_rewards():
    a = _algo("algorithm.name=dapo")
    assert (a.clip_eps_high, a.loss_agg, a.kl_coef, a.dynamic_sampling_rounds) == (0.28, "token", 0.0, 3)
    # rewards [1, 1] with lengths [5, 8] on an 8-token budget (buffer 2): [1 + 0, 1 - 1] = [1, 0]
    shaped = shape_rewards(a, f64([1.0, 1.0]), torch.tensor([5, 8]), 8)
    assert shaped.tolist() == pytest.approx([1.0, 0.0])


def test_dynamic_sampling_fills_to_target():
    # already 2 of 4 groups: keep the first two groups that have signal, skip the rest
    assert fill_groups([False, True, True, True], already=2, target=4) == [False, True, True, False]
    assert fill_groups([True, True], already=4, target=4) == [False, False]


def test_step_samples_keep_whole_groups_and_append_rounds():
    from posttrain.rollout.samples import StepSamples

    def round_of(prefix, k):
        return StepSamples(sample_ids=[f"{prefix}{i}" for i in range(k)], prompts=[[i] for i in range(k)],
                           completions=[[i] for i in range(k)], engine_logprobs=[[0.0]] * k,
                           items=[("p", "", "", "")] * k, rewards=[float(i) for i in range(k)], errors=[None] * k)

    s = round_of("a", 6).select_groups([True, False, True], group_size=2)
    assert s.sample_ids == ["a0", "a1", "a4", "a5"] and s.rewards == [0.0, 1.0, 4.0, 5.0]
    s.extend(round_of("b", 2))
    assert len(s) == 6 and s.sample_ids[-2:] == ["b0", "b1"] and len(s.errors) == 6


# ------------------------------------------------------------------ RLOO


def test_rloo_leave_one_out_by_hand():
    # group [1, 0, 0]: A_0 = 1 - (0+0)/2 = 1 ; A_1 = 0 - (1+0)/2 = -0.5 ; A_2 = -0.5
    # group [2, 4, 6]: A = 2 - 5 = -3 ; 4 - 4 = 0 ; 6 - 3 = 3
    adv = leave_one_out_advantages(f64([1.0, 0.0, 0.0, 2.0, 4.0, 6.0]), 3)
    assert adv.dtype == torch.float64 and adv.tolist() == pytest.approx([1.0, -0.5, -0.5, -3.0, 0.0, 3.0])
    a = _algo("algorithm.name=rloo", "algorithm.group_size=3")
    assert compute_advantages(a, f64([1.0, 0.0, 0.0])).advantages.tolist() == pytest.approx([1.0, -0.5, -0.5])
    with pytest.raises(ValueError):
        leave_one_out_advantages(f64([1.0]), 1)


# ------------------------------------------------------------------ REINFORCE++


def test_reinforce_pp_returns_and_global_normalisation_by_hand():
    mask = f64([[1.0, 1.0], [1.0, 0.0]])
    # reward on the last valid token: seq 0 -> token 1, seq 1 -> token 0
    assert terminal_rewards(f64([1.0, 0.0]), mask).tolist() == [[0.0, 1.0], [0.0, 0.0]]
    # KL per token (logp - ref): seq 0 [0.5, 0.0], seq 1 [1.0]; beta 0.2 -> token rewards [[-0.1, 1.0], [-0.2]]
    logp = f64([[0.0, -1.0], [0.0, 0.0]])
    ref = f64([[-0.5, -1.0], [-1.0, 0.0]])
    # returns to go: seq 0 [0.9, 1.0], seq 1 [-0.2]; over 3 tokens mean 1.7/3 = 0.566667,
    # population var ((0.333333)^2 + (0.433333)^2 + (0.766667)^2)/3 = (0.111111+0.187778+0.587778)/3 = 0.295556,
    # std 0.543650 -> [0.613139, 0.797081], [-1.410220]
    tr = terminal_rewards(f64([1.0, 0.0]), mask) - 0.2 * (logp - ref) * mask
    assert returns_to_go(tr, mask).flatten().tolist() == pytest.approx([0.9, 1.0, -0.2, 0.0])
    adv = reinforce_pp_advantages(f64([1.0, 0.0]), mask, logp, ref, kl_coef=0.2)
    assert adv.dtype == torch.float64
    assert adv.flatten().tolist() == pytest.approx([0.613139, 0.797081, -1.410220, 0.0], abs=1e-5)


def test_reinforce_pp_normalises_across_groups_not_within():
    # two prompts whose samples all succeed / all fail still get a signal (unlike GRPO): +1 and -1
    a = _algo("algorithm.name=reinforce_pp", "algorithm.group_size=2", "algorithm.kl_coef=0")
    mask = f64([[1.0]] * 4)
    adv = compute_advantages(a, f64([1.0, 1.0, 0.0, 0.0]), mask=mask).advantages
    assert adv.flatten().tolist() == pytest.approx([1.0, 1.0, -1.0, -1.0], abs=1e-5)
    assert kl_in_reward(_algo("algorithm.name=reinforce_pp")) and not kl_in_reward(_algo())


# ------------------------------------------------------------------ PPO


def test_gae_by_hand():
    # one sequence of 3 tokens, reward 1 on the last, V = [0.5, 0.6, 0.8], gamma 0.9, lambda 0.5
    # delta_2 = 1 + 0 - 0.8 = 0.2           ; A_2 = 0.2
    # delta_1 = 0 + 0.9*0.8 - 0.6 = 0.12    ; A_1 = 0.12 + 0.45*0.2 = 0.21
    # delta_0 = 0 + 0.9*0.6 - 0.5 = 0.04    ; A_0 = 0.04 + 0.45*0.21 = 0.1345
    # returns = A + V = [0.6345, 0.81, 1.0]
    # a second, padded row: 1 token, reward 0, V 0.3 -> delta = -0.3; the pad after it contributes nothing
    rewards = f64([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    values = f64([[0.5, 0.6, 0.8], [0.3, 9.0, 9.0]])
    mask = f64([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    assert adv.dtype == ret.dtype == torch.float64
    assert adv.flatten().tolist() == pytest.approx([0.1345, 0.21, 0.2, -0.3, 0.0, 0.0], abs=1e-6)
    assert ret.flatten().tolist() == pytest.approx([0.6345, 0.81, 1.0, 0.0, 0.0, 0.0], abs=1e-6)
    # gamma = lambda = 1: A_t = R - V_t (Monte Carlo)
    adv1, _ = gae(rewards[:1], values[:1], mask[:1], 1.0, 1.0)
    assert adv1.flatten().tolist() == pytest.approx([0.5, 0.4, 0.2], abs=1e-6)


def test_clipped_value_loss_by_hand():
    # V_old 0.5, R 1.0, clip 0.2. token 0: V 1.0 -> unclipped 0, clipped V 0.7 -> 0.09 -> max 0.09 (clipped branch)
    # token 1: V 0.6 -> unclipped 0.16, clipped V 0.6 -> 0.16 -> 0.16 ; loss 0.5 * (0.09 + 0.16)/2 = 0.0625
    v = f64([[1.0, 0.6]])
    loss, frac = clipped_value_loss(v, f64([[0.5, 0.5]]), f64([[1.0, 1.0]]), f64([[1.0, 1.0]]), 0.2)
    assert float(loss) == pytest.approx(0.0625) and float(frac) == pytest.approx(0.5)
    # no clip: 0.5 * (0 + 0.16)/2 = 0.04
    loss, _ = clipped_value_loss(v, f64([[0.5, 0.5]]), f64([[1.0, 1.0]]), f64([[1.0, 1.0]]), None)
    assert float(loss) == pytest.approx(0.04)


def test_ppo_dispatch_whitens_gae():
    # adv [[1, 3]] -> mean 2, population std 1 -> [-1, 1]
    assert whiten(f64([[1.0, 3.0]]), f64([[1.0, 1.0]])).flatten().tolist() == pytest.approx([-1.0, 1.0])
    a = _algo("algorithm.name=ppo", "algorithm.group_size=1", "algorithm.kl_coef=0", "algorithm.gamma=1",
              "algorithm.gae_lambda=1")
    # two 1-token sequences, rewards [1, 0], V [0.5, 0.5] -> A = [0.5, -0.5] -> whitened [1, -1]; returns [1, 0]
    out = compute_advantages(a, f64([1.0, 0.0]), mask=f64([[1.0], [1.0]]), values=f64([[0.5], [0.5]]))
    assert out.advantages.flatten().tolist() == pytest.approx([1.0, -1.0], abs=1e-6)
    assert out.returns.flatten().tolist() == pytest.approx([1.0, 0.0])


# ------------------------------------------------------------------ DPO


def test_dpo_loss_and_implicit_reward_by_hand():
    # beta 0.5. pair 0: chosen logp -1 (ref -2) -> r_c = 0.5 ; rejected -3 (ref -2) -> r_r = -0.5 ; margin 1
    #           pair 1: chosen -2 (ref -2) -> 0 ; rejected -1 (ref -2) -> 0.5 ; margin -0.5
    # loss = mean(-log sigmoid(1), -log sigmoid(-0.5)) = (0.313262 + 0.974077)/2 = 0.643670
    pc, pr = f64([-1.0, -2.0], requires_grad=True), f64([-3.0, -1.0])
    rc, rr = f64([-2.0, -2.0]), f64([-2.0, -2.0])
    out = dpo_loss(pc, pr, rc, rr, beta=0.5)
    assert out.loss.dtype == torch.float64
    assert float(out.loss.detach()) == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(0.5))) / 2, abs=1e-6)
    assert float(out.loss.detach()) == pytest.approx(0.643670, abs=1e-6)
    assert float(out.rewards_chosen) == pytest.approx(0.25) and float(out.rewards_rejected) == pytest.approx(0.0)
    assert float(out.margin) == pytest.approx(0.25) and float(out.accuracy) == pytest.approx(0.5)
    # d loss / d chosen_logp_i = -beta * sigmoid(-margin_i) / 2: pair 0 -0.25*0.268941, pair 1 -0.25*0.622459
    out.loss.backward()
    assert pc.grad.tolist() == pytest.approx([-0.067235, -0.155615], abs=1e-6)
    assert implicit_reward(f64([-1.0]), f64([-3.0]), 0.1).tolist() == pytest.approx([0.2])


# ------------------------------------------------------------------ config


def test_config_names_the_field_in_errors():
    with pytest.raises(PosttrainError, match="algorithm.group_size=1: grpo needs at least 2"):
        load_config(None, ["algorithm.group_size=1"])
    with pytest.raises(PosttrainError, match="algorithm.clip_eps_high=0.1 is below algorithm.clip_eps"):
        load_config(None, ["algorithm.clip_eps_high=0.1"])
    with pytest.raises(PosttrainError, match="algorithm.dynamic_sampling_rounds=2"):
        load_config(None, ["algorithm.name=ppo", "algorithm.dynamic_sampling_rounds=2"])
    with pytest.raises(PosttrainError, match="algorithm.name"):
        load_config(None, ["algorithm.name=trpo"])
    # PPO and REINFORCE++ have no groups: one sample per prompt is fine
    assert _algo("algorithm.name=ppo", "algorithm.group_size=1").group_size == 1


def test_default_config_is_unchanged_grpo():
    a = _algo()
    assert (a.name, a.scale_rewards, a.loss_agg, a.clip_eps_high, a.dynamic_sampling_rounds,
            a.overlong_buffer_fraction) == ("grpo", True, "token", None, 0, 0.0)
