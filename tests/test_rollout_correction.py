"""Rollout correction (truncated / masked importance sampling) against numbers worked out by hand, and a statistical
check that the TIS-weighted surrogate's gradient is the on-policy one. Tensors are float64 (numerics_bounds.f64).

The shared example: rollout logprobs ln 0.2 everywhere, trainer logprobs ln(0.2 * r) for the token ratios
    row 0: r = [2, 0.5, 4]      (row product 4)
    row 1: r = [3, 1, pad]      (row product 3)
    row 2: r = [0.5, 0.5, pad]  (row product 0.25)
mask [[1,1,1],[1,1,0],[1,1,0]]: 7 unmasked tokens. The padding has trainer = rollout (ratio 1) here; the padding
test puts inf / nan / huge log ratios there instead."""

import math

import pytest
import torch
from numerics_bounds import f64

from posttrain.algorithms.grpo import clipped_policy_loss
from posttrain.algorithms.rollout_correction import correction_weights, mismatch_metrics

ln = math.log
RATIOS = [[2.0, 0.5, 4.0], [3.0, 1.0, 1.0], [0.5, 0.5, 1.0]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 0]]


def _example(mask_dtype=torch.float64):
    rollout = f64([[ln(0.2)] * 3] * 3)
    trainer = f64([[ln(0.2 * r) for r in row] for row in RATIOS])
    return trainer, rollout, torch.tensor(MASK, dtype=mask_dtype)


def _close(t: torch.Tensor, expected) -> None:
    assert t.flatten().tolist() == pytest.approx(torch.tensor(expected, dtype=torch.float64).flatten().tolist(), abs=1e-9), t


def test_token_tis_caps_each_token():
    # cap 2.5: min(r, 2.5) -> [2, .5, 2.5], [2.5, 1, 0 (pad)], [.5, .5, 0]; capped: 4 and 3 -> 2 of 7 tokens
    trainer, rollout, mask = _example()
    c = correction_weights(trainer, rollout, mask, mode="tis", level="token", cap=2.5)
    _close(c.weights, [[2.0, 0.5, 2.5], [2.5, 1.0, 0.0], [0.5, 0.5, 0.0]])
    assert torch.equal(c.loss_mask, mask)
    assert c.capped_share == pytest.approx(2 / 7)
    assert c.masked_share == 0.0


def test_sequence_tis_uses_the_row_product():
    # row ratios 2*.5*4 = 4, 3*1 = 3, .5*.5 = .25; cap 3.5 -> 3.5, 3, .25 on each unmasked token of the row;
    # capped: row 0's three tokens -> 3 of 7
    trainer, rollout, mask = _example()
    c = correction_weights(trainer, rollout, mask, mode="tis", level="sequence", cap=3.5)
    _close(c.weights, [[3.5, 3.5, 3.5], [3.0, 3.0, 0.0], [0.25, 0.25, 0.0]])
    assert torch.equal(c.loss_mask, mask)
    assert c.capped_share == pytest.approx(3 / 7)
    assert c.masked_share == 0.0


def test_token_mis_drops_tokens_outside_the_band():
    # cap 2.5 keeps r in [0.4, 2.5]: row 0 keeps 2 and .5, drops 4; row 1 drops 3, keeps 1; row 2 keeps both .5
    # -> 2 of 7 dropped; kept tokens weigh r. An int mask comes back as an int mask.
    trainer, rollout, mask = _example(torch.long)
    c = correction_weights(trainer, rollout, mask, mode="mis", level="token", cap=2.5)
    _close(c.weights, [[2.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
    assert c.loss_mask.dtype == torch.long
    assert c.loss_mask.tolist() == [[1, 1, 0], [0, 1, 0], [1, 1, 0]]
    assert c.masked_share == pytest.approx(2 / 7)
    assert c.capped_share == 0.0


def test_sequence_mis_drops_whole_rows():
    # cap 3.5 keeps row ratios in [1/3.5 = 0.2857, 3.5]: row 0 (4) dropped, row 1 (3) kept with weight 3,
    # row 2 (0.25) dropped -> 3 + 2 = 5 of 7 tokens dropped
    trainer, rollout, mask = _example()
    c = correction_weights(trainer, rollout, mask, mode="mis", level="sequence", cap=3.5)
    _close(c.weights, [[0.0, 0.0, 0.0], [3.0, 3.0, 0.0], [0.0, 0.0, 0.0]])
    assert c.loss_mask.tolist() == [[0, 0, 0], [1, 1, 0], [0, 0, 0]]
    assert c.masked_share == pytest.approx(5 / 7)


def test_mis_band_is_inclusive():
    # rollout 0 so the log ratio is exactly ln 3 / -ln 3: r = cap and r = 1/cap are kept
    trainer, rollout = f64([[ln(3.0), -ln(3.0)]]), f64([[0.0, 0.0]])
    c = correction_weights(trainer, rollout, f64([[1, 1]]), mode="mis", level="token", cap=3.0)
    assert c.loss_mask.tolist() == [[1, 1]] and c.masked_share == 0.0
    _close(c.weights, [[3.0, 1 / 3]])


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_none_leaves_everything(level):
    trainer, rollout, mask = _example()
    c = correction_weights(trainer, rollout, mask, mode="none", level=level, cap=2.0)
    assert torch.equal(c.weights, mask) and torch.equal(c.loss_mask, mask)
    assert c.capped_share == 0.0 and c.masked_share == 0.0


@pytest.mark.parametrize("mode", ["none", "tis", "mis"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_padding_is_ignored(mode, level):
    # the same unmasked tokens, padding with log ratio +inf (rollout -inf), nan, and -1e4 / +1e4 at sequence level
    trainer, rollout, mask = _example()
    t2, r2 = trainer.clone(), rollout.clone()
    t2[1, 2], r2[1, 2] = 0.0, -math.inf
    t2[2, 2], r2[2, 2] = math.nan, 0.0
    big_t, big_r = torch.cat([trainer, f64([[0.0]] * 3)], 1), torch.cat([rollout, f64([[1e4], [-1e4], [0.0]])], 1)
    big_mask = torch.cat([mask, f64([[0.0]] * 3)], 1)
    ref = correction_weights(trainer, rollout, mask, mode=mode, level=level, cap=2.5)
    for t, r, m in [(t2, r2, mask), (big_t, big_r, big_mask)]:
        c = correction_weights(t, r, m, mode=mode, level=level, cap=2.5)
        assert torch.equal(c.weights[:, :3], ref.weights) and torch.equal(c.loss_mask[:, :3], ref.loss_mask)
        assert not c.weights[:, 3:].any() and not c.loss_mask[:, 3:].any()
        assert (c.capped_share, c.masked_share) == pytest.approx((ref.capped_share, ref.masked_share))


def test_huge_unmasked_log_ratio_stays_finite():
    # an unmasked token the rollout gave probability 0 (log ratio +inf, clamped at 20): TIS caps it, MIS drops it
    trainer, rollout, mask = f64([[0.0, ln(0.5)]]), f64([[-math.inf, ln(0.5)]]), f64([[1, 1]])
    tis = correction_weights(trainer, rollout, mask, mode="tis", level="sequence", cap=2.0)
    _close(tis.weights, [[2.0, 2.0]])
    mis = correction_weights(trainer, rollout, mask, mode="mis", level="token", cap=2.0)
    _close(mis.weights, [[0.0, 1.0]])


def test_weights_are_detached():
    trainer, rollout, mask = _example()
    trainer.requires_grad_(True)
    for mode in ("none", "tis", "mis"):
        assert not correction_weights(trainer, rollout, mask, mode=mode, level="token", cap=2.0).weights.requires_grad


@pytest.mark.parametrize("cap", [1.0, 0.5, -3.0])
def test_cap_at_most_one_rejected(cap):
    trainer, rollout, mask = _example()
    with pytest.raises(ValueError, match=str(cap)):
        correction_weights(trainer, rollout, mask, mode="tis", level="token", cap=cap)


def test_unknown_mode_or_level_rejected():
    trainer, rollout, mask = _example()
    with pytest.raises(ValueError, match="'cispo'"):
        correction_weights(trainer, rollout, mask, mode="cispo", level="token", cap=2.0)
    with pytest.raises(ValueError, match="'row'"):
        correction_weights(trainer, rollout, mask, mode="tis", level="row", cap=2.0)


def test_mismatch_metrics_by_hand():
    # unmasked ratios 2, .5, 4 (row 0); row 1 padding has log ratio +inf, row 1 token 0 has ratio 3 but is masked.
    # k3 = r - 1 - ln r: 1 - .693147 = .306853; -.5 + .693147 = .193147; 3 - 1.386294 = 1.613706 -> mean .704569
    # ppl ratio = exp(-(ln 2 + ln .5 + ln 4) / 3) = 4^(-1/3) = .629961
    # chi2 = mean(r^2 - 1) = (3 - .75 + 15) / 3 = 5.75;  max |ln r| = ln 4 = 1.386294
    trainer = torch.tensor([[ln(0.4), ln(0.1), ln(0.8)], [ln(0.6), 0.0, 0.0]])  # float32 in, float64 inside
    rollout = torch.tensor([[ln(0.2)] * 3, [ln(0.2), -math.inf, math.nan]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    got = mismatch_metrics(trainer, rollout, mask)
    assert got == pytest.approx({"mismatch/k3_kl": 0.704569, "mismatch/ppl_ratio": 0.629961,
                                 "mismatch/chi2": 5.75, "mismatch/log_ratio_abs_max": 1.386294}, abs=2e-6)
    assert all(isinstance(v, float) for v in got.values())


def test_mismatch_metrics_empty_mask():
    got = mismatch_metrics(f64([[0.0, 5.0]]), f64([[-math.inf, 0.0]]), f64([[0, 0]]))
    assert got == {"mismatch/k3_kl": 0.0, "mismatch/ppl_ratio": 1.0, "mismatch/chi2": 0.0,
                   "mismatch/log_ratio_abs_max": 0.0}


def test_clipped_policy_loss_with_is_weights_by_hand():
    # ratio = [.6/.5, .5/.5] = [1.2, 1]; A = 1; clip .1: token 0 min(1.2, 1.1) = 1.1 (clipped), token 1 1.0
    # is_weights [2, .5] -> per token -2.2, -.5; token mean over the 2 unmasked tokens -1.35 (unweighted: -1.05)
    # KL not weighted: k3 with ref ln .3: token 0 ln(.3/.6) = ln .5 -> .5 + .693147 - 1 = .193147, token 1 0
    # -> mean .0965736; loss = -1.35 + .1 * .0965736 = -1.3403426
    # gradient: token 0 on the clipped branch -> 0; token 1: d/dlogp of -.5 * ratio / 2 = -.25
    logprobs = f64([[ln(0.6), ln(0.5), 0.0]], requires_grad=True)
    old, ref = f64([[ln(0.5), ln(0.5), 0.0]]), f64([[ln(0.3), ln(0.5), 0.0]])
    mask, weights = f64([[1, 1, 0]]), f64([[2.0, 0.5, 0.0]])
    out = clipped_policy_loss(logprobs, old, f64([1.0]), mask, clip_eps=0.1, ref_logprobs=ref, kl_coef=0.1,
                              is_weights=weights)
    assert out.policy_loss.item() == pytest.approx(-1.35, abs=1e-9)
    assert out.loss.item() == pytest.approx(-1.35 + 0.1 * 0.0965736, abs=1e-7)
    assert out.kl.item() == pytest.approx(0.0965736, abs=1e-7)
    out.loss.backward()
    kl_grad = [0.1 * (1 - 0.5) / 2, 0.0, 0.0]  # d k3 / d logp = 1 - ref/p: token 0 1 - .5, mean over 2, times .1
    _close(logprobs.grad, [kl_grad[0], -0.25, 0.0])
    plain = clipped_policy_loss(logprobs.detach(), old, f64([1.0]), mask, clip_eps=0.1)
    assert plain.policy_loss.item() == pytest.approx(-1.05, abs=1e-9)


@pytest.mark.parametrize("agg", ["token", "sequence"])
def test_is_weights_none_equals_ones(agg):
    gen = torch.Generator().manual_seed(0)
    lp = (torch.rand(3, 4, generator=gen, dtype=torch.float64) - 2.0).requires_grad_(True)
    old, ref = lp.detach() + 0.3 * torch.randn(3, 4, generator=gen, dtype=torch.float64), lp.detach() - 0.1
    adv, mask = torch.randn(3, generator=gen, dtype=torch.float64), f64([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    outs, grads = [], []
    for w in (None, torch.ones_like(mask)):
        out = clipped_policy_loss(lp, old, adv, mask, clip_eps=0.2, ref_logprobs=ref, kl_coef=0.05, agg=agg,
                                  is_weights=w)
        outs.append(out)
        grads.append(torch.autograd.grad(out.loss, lp)[0])
    assert torch.equal(outs[0].loss, outs[1].loss) and torch.equal(grads[0], grads[1])
    assert torch.equal(outs[0].clip_fraction, outs[1].clip_fraction)


def test_tis_gradient_is_the_on_policy_gradient():
    # pi = softmax(logits), samples from mu = softmax(logits / 1.5); reward R per token as the advantage.
    # Exact gradient of E_pi[R] w.r.t. the logits: sum_x pi(x) R(x) (e_x - pi). The surrogate's gradient per sample
    # (ratio 1, so no clipping) is w R(x) (e_x - pi); with w = pi/mu (TIS, cap 1e3 never reached: pi/mu <= 1.27)
    # its mean is unbiased, with w = 1 it estimates sum_x mu(x) R(x) (e_x - pi) instead.
    logits = f64([2.0, 1.0, 0.0, -1.0, -2.0], requires_grad=True)
    reward = f64([1.0, -1.0, 0.5, 2.0, -2.0])
    n = 20000
    pi = torch.softmax(logits.detach(), 0)
    exact = pi * reward - pi * (pi @ reward)
    x = torch.multinomial(torch.softmax(logits.detach() / 1.5, 0), n, replacement=True,
                          generator=torch.Generator().manual_seed(1234))
    logp = torch.log_softmax(logits, 0)[x].unsqueeze(-1)                       # [n, 1]
    rollout_lp = torch.log_softmax(logits.detach() / 1.5, 0)[x].unsqueeze(-1)
    mask = torch.ones(n, 1, dtype=torch.float64)
    corr = correction_weights(logp, rollout_lp, mask, mode="tis", level="token", cap=1e3)
    assert corr.capped_share == 0.0
    z = {}
    for name, w in [("tis", corr.weights), ("none", None)]:
        logp = torch.log_softmax(logits, 0)[x].unsqueeze(-1)  # a fresh graph for each backward
        out = clipped_policy_loss(logp, logp.detach(), reward[x], mask, clip_eps=0.2, is_weights=w)
        estimate = -torch.autograd.grad(out.loss, logits)[0]
        w_col = torch.ones(n, 1, dtype=torch.float64) if w is None else w
        per_sample = w_col * reward[x].unsqueeze(-1) * (torch.nn.functional.one_hot(x, 5).double() - pi)
        assert estimate.tolist() == pytest.approx(per_sample.mean(0).tolist(), abs=1e-12)
        z[name] = ((estimate - exact) / (per_sample.std(0) / math.sqrt(n))).abs().max().item()
    assert z["tis"] < 5, z
    assert z["none"] > 10, z
