"""review/stats.py against numbers worked out by hand (z = 1.959964, z^2 = 3.841459 throughout).

Wilson interval of s successes of n: p = s/n, d = 1 + z^2/n, centre = (p + z^2/(2n)) / d,
half = (z/d) * sqrt(p(1-p)/n + z^2/(4n^2)), interval [centre - half, centre + half] clipped to [0, 1].
"""

from __future__ import annotations

import pytest

from posttrain.review import stats


def test_item_preference_counts_ties_half_and_sets_both_bad_apart():
    assert stats.item_preference(["a"]) == 0.0
    assert stats.item_preference(["b"]) == 1.0
    assert stats.item_preference(["a", "b"]) == 0.5  # two reviewers disagree: undecided
    assert stats.item_preference(["b", "tie"]) == 0.75  # (1 + 0.5) / 2
    assert stats.item_preference(["both_bad", "b"]) == 1.0  # both_bad has no value; the other judgment decides
    assert stats.item_preference(["both_bad", "both_bad"]) is None
    assert stats.item_preference([]) is None
    assert stats.is_both_bad(["both_bad", "both_bad"]) and not stats.is_both_bad(["both_bad", "a"])
    assert not stats.is_both_bad([])
    assert [stats.human_choice(p) for p in (0.0, 0.25, 0.5, 0.75, 1.0, None)] == ["a", "a", None, "b", "b", None]


def test_wilson_by_hand():
    # 8 of 10: p = 0.8, d = 1.384146, centre = (0.8 + 0.192073) / d = 0.716738,
    # half = (1.959964 / 1.384146) * sqrt(0.016 + 0.009604) = 1.415994 * 0.160011 = 0.226575 -> [0.490163, 0.943313]
    assert stats.wilson(8, 10) == pytest.approx((0.490163, 0.943313), abs=1e-5)
    # 10 of 10: centre = 1.192073 / 1.384146 = 0.861234, half = 1.415994 * sqrt(0.009604) = 0.138766
    # -> [0.722468, 1.000000] (the upper end clipped to 1); a normal interval would say [1, 1]
    assert stats.wilson(10, 10) == pytest.approx((0.722467, 1.0), abs=1e-5)
    # 0 of 10 mirrors it
    assert stats.wilson(0, 10) == pytest.approx((0.0, 1 - 0.722467), abs=1e-5)


def test_win_rate_with_ties_and_both_bad_by_hand():
    # items: b, b, a-vs-b disagreement (0.5), a, both-bad (None), b, b+tie (0.75)
    prefs = [1.0, 1.0, 0.5, 0.0, None, 1.0, 0.75]
    r = stats.win_rate(prefs)
    # n = 6 items with a preference, sum = 1 + 1 + 0.5 + 0 + 1 + 0.75 = 4.25, win rate = 4.25 / 6 = 0.708333
    # p = 0.708333, z^2/(2n) = 0.320122, d = 1.640243, centre = (0.708333 + 0.320122) / d = 0.627014,
    # half = (1.959964 / d) * sqrt(0.034433 + 0.026677) = 1.194921 * 0.247204 = 0.295389 -> [0.331624, 0.922403]
    assert r.n == 6
    assert r.value == pytest.approx(0.708333, abs=1e-6)
    assert (r.ci_low, r.ci_high) == pytest.approx((0.331624, 0.922403), abs=1e-5)
    assert stats.win_rate([None, None]) == stats.Rate(None, None, None, 0)


def test_cohens_kappa_by_hand():
    pairs = [("a", "a"), ("b", "b"), ("a", "b"), ("tie", "tie"), ("both_bad", "a")]
    k = stats.cohens_kappa(pairs)
    # observed: 3 of 5 agree = 0.6
    # first judgments: a 2/5, b 1/5, tie 1/5, both_bad 1/5; second: a 2/5, b 2/5, tie 1/5, both_bad 0
    # expected = 0.4*0.4 + 0.2*0.4 + 0.2*0.2 + 0.2*0 = 0.16 + 0.08 + 0.04 = 0.28
    # kappa = (0.6 - 0.28) / (1 - 0.28) = 0.32 / 0.72 = 0.444444
    assert k.n_pairs == 5 and k.observed == pytest.approx(0.6)
    assert k.kappa == pytest.approx(0.444444, abs=1e-6)
    # complete disagreement on a balanced pair: observed 0, expected 0.5*0.5 + 0.5*0.5 = 0.5, kappa = -1
    assert stats.cohens_kappa([("a", "b"), ("b", "a")]).kappa == pytest.approx(-1.0)
    # everyone always says "a": expected agreement 1, kappa undefined
    same = stats.cohens_kappa([("a", "a"), ("a", "a")])
    assert same.kappa is None and same.observed == 1.0 and same.n_pairs == 2
    assert stats.cohens_kappa([]) == stats.Kappa(None, None, 0)


def test_scorer_agreement_counts_a_scorer_tie_half_by_hand():
    choices = ["b", "b", "a", "a", "b"]
    scores = [(0.0, 1.0),  # prefers B, people chose B: 1
              (1.0, 0.0),  # prefers A, people chose B: 0
              (2.0, 1.0),  # prefers A, people chose A: 1
              (3.0, 3.0),  # scorer tie: 0.5
              (0.2, 0.5)]  # prefers B, people chose B: 1
    r = stats.scorer_agreement(choices, scores)
    # agree = 3.5 / 5 = 0.7; Wilson of 3.5 of 5: d = 1.768292, centre = (0.7 + 0.384146) / d = 0.613104,
    # half = (1.959964 / d) * sqrt(0.042 + 0.038415) = 1.108393 * 0.283575 = 0.314312 -> [0.298791, 0.927416]
    assert r.n == 5 and r.value == pytest.approx(0.7)
    assert (r.ci_low, r.ci_high) == pytest.approx((0.298791, 0.927416), abs=1e-5)
    assert stats.scorer_agreement([], []).value is None
    with pytest.raises(ValueError, match="2 choices but 1"):
        stats.scorer_agreement(["a", "b"], [(0.0, 1.0)])
