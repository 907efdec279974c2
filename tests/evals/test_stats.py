"""Eval statistics against hand-worked values and against scipy where scipy has the same test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from posttrain.errors import PosttrainError
from posttrain.evals.stats import holm, is_binary, mcnemar, mean_se, paired_bootstrap, win_tie_loss


def test_mean_se_by_hand_and_scipy():
    # [1,2,3,4]: mean 2.5; squared deviations 2.25+0.25+0.25+2.25 = 5; var = 5/3; se = sqrt(5/3)/2 = 0.645497
    r = mean_se([1, 2, 3, 4])
    assert r.mean == 2.5 and r.n == 4
    assert r.se == pytest.approx(math.sqrt(5 / 3) / 2)
    assert r.se == pytest.approx(scipy.stats.sem([1, 2, 3, 4]))
    assert mean_se([0.7]).se == 0.0
    with pytest.raises(PosttrainError):
        mean_se([])


def test_mcnemar_exact_by_hand_and_scipy():
    # A passes only on sample 0; B passes only on samples 1..5 -> discordant a_only=1, b_only=5, n=6.
    # P(X<=1 | n=6, 1/2) = (C(6,0)+C(6,1))/64 = 7/64; two-sided p = 14/64 = 0.21875.
    a = [1, 0, 0, 0, 0, 0, 1, 0]
    b = [0, 1, 1, 1, 1, 1, 1, 0]
    r = mcnemar(a, b)
    assert (r.a_only, r.b_only, r.method) == (1, 5, "exact-binomial")
    assert r.p_value == pytest.approx(14 / 64)
    assert r.p_value == pytest.approx(scipy.stats.binomtest(1, 6, 0.5).pvalue)


def test_mcnemar_chi2_by_hand_and_scipy():
    # 10 pairs A-only, 20 pairs B-only, 5 concordant: n = 30 >= 25 -> chi2 = (|10-20|-1)^2/30 = 81/30 = 2.7
    a = [1] * 10 + [0] * 20 + [1] * 5
    b = [0] * 10 + [1] * 20 + [1] * 5
    r = mcnemar(a, b)
    assert r.method == "chi2-continuity"
    assert r.statistic == pytest.approx(2.7)
    assert r.p_value == pytest.approx(scipy.stats.chi2.sf(2.7, 1))
    assert r.p_value == pytest.approx(0.10035, abs=1e-4)


def test_mcnemar_no_discordant_pairs_is_p_one():
    assert mcnemar([1, 0], [1, 0]).p_value == 1.0


def test_holm_by_hand():
    # p = [0.01, 0.04, 0.03], m = 3. Sorted: 0.01*3 = 0.03; 0.03*2 = 0.06; 0.04*1 = 0.04 -> max(0.06, 0.04) = 0.06.
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # Capped at 1: [0.5, 0.6] -> 0.5*2 = 1.0, max(1.0, 0.6) = 1.0
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_win_tie_loss_by_hand():
    r = win_tie_loss([0, 1, 0.5, 1], [1, 1, 0.25, 0])
    assert (r.wins, r.ties, r.losses) == (1, 1, 2)


def test_paired_bootstrap_constant_difference_is_exact():
    r = paired_bootstrap([0, 1, 0, 1], [0.5, 1.5, 0.5, 1.5])
    assert (r.mean_diff, r.ci_low, r.ci_high, r.p_value) == (0.5, 0.5, 0.5, 0.0)
    assert paired_bootstrap([1, 2], [1, 2]).p_value == 1.0


def test_paired_bootstrap_is_seeded_and_matches_scipy():
    rng = np.random.default_rng(3)
    a = rng.normal(0, 1, 60)
    b = a + 0.3 + rng.normal(0, 0.5, 60)
    r1, r2 = paired_bootstrap(a, b, seed=7), paired_bootstrap(a, b, seed=7)
    assert r1 == r2
    assert r1.mean_diff == pytest.approx(float(np.mean(b - a)))
    ref = scipy.stats.bootstrap(
        (a, b), lambda x, y, axis=-1: np.mean(y - x, axis=axis), paired=True, vectorized=True,
        n_resamples=10_000, method="percentile", random_state=1,
    ).confidence_interval
    # Different random draws: the endpoints agree to Monte Carlo error (se of the mean diff here is ~0.065).
    assert r1.ci_low == pytest.approx(ref.low, abs=0.01)
    assert r1.ci_high == pytest.approx(ref.high, abs=0.01)
    assert r1.ci_low > 0 and r1.p_value < 0.01


def test_paired_bootstrap_null_is_not_significant():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 200).astype(float)
    b = a.copy()
    flip = rng.choice(200, 20, replace=False)  # 20 discordant pairs, split 10 / 10 in expectation
    b[flip] = 1 - b[flip]
    r = paired_bootstrap(a, b, seed=0)
    assert r.ci_low < 0 < r.ci_high or r.p_value > 0.05


def test_unpaired_input_is_a_user_error():
    with pytest.raises(PosttrainError, match="equally long"):
        paired_bootstrap([1, 0], [1])
    assert is_binary([0, 1.0]) and not is_binary([0.5])
