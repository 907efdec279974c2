"""Reward-hacking alarm math on hand-made series."""

from __future__ import annotations

import math

import pytest

from posttrain.errors import PosttrainError
from posttrain.evals.alarms import (
    AlarmMonitor, AlarmSpec, ensemble_disagreement, fit_gold_vs_sqrt_kl, kl_acceleration, length_bucket_edges,
    length_driven_gain, ngram_repetition_rate, pearson, proxy_gold_divergence, reward_gain_by_length_bucket, slope,
)


def test_slope_and_pearson_by_hand():
    assert slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert slope([1, 1], [0, 5]) == 0.0
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [5, 5, 5]) == 0.0


def test_gold_vs_sqrt_kl_fit_finds_the_peak():
    # gold = d * (2 - 0.5 d) at d = 0..4 (KL = d^2): alpha = 2, beta = 0.5, peak d* = 2 / (2 * 0.5) = 2, KL* = 4.
    kl = [0, 1, 4, 9, 16]
    gold = [d * (2 - 0.5 * d) for d in range(5)]  # 0, 1.5, 2, 1.5, 0
    fit = fit_gold_vs_sqrt_kl(kl, gold)
    assert (fit.alpha, fit.beta) == (pytest.approx(2.0), pytest.approx(0.5))
    assert fit.peak_d == pytest.approx(2.0) and fit.peak_kl == pytest.approx(4.0)
    # Still rising (beta <= 0): no peak in sight.
    assert fit_gold_vs_sqrt_kl([0, 1, 4], [0, 1, 2]).peak_d == math.inf


def test_proxy_gold_divergence():
    assert proxy_gold_divergence([0, 1, 2], [0.1, 0.2, 0.3], [0.5, 0.5, 0.4])["gold_slope"] == pytest.approx(-0.05)
    assert proxy_gold_divergence([0, 1, 2], [0.1, 0.2, 0.3], [0.1, 0.2, 0.3]) is None


def test_reward_gain_by_length_bucket_separates_length_from_quality():
    # Before: short ones score 0, long ones 1 (mean 0.5). After: all long, all 1 (mean 1). Overall gain 0.5,
    # but in the only bucket with both ([3, 10)) the gain is 1 - 1 = 0: the gain is all length.
    r = reward_gain_by_length_bucket(([1, 1, 5, 5], [0, 0, 1, 1]), ([5, 5, 5, 5], [1, 1, 1, 1]), [0, 3, 10])
    assert r["overall"] == pytest.approx(0.5)
    assert r["buckets"] == [(0, 3, None), (3, 10, pytest.approx(0.0))]
    assert r["within"] == pytest.approx(0.0)


def test_kl_acceleration_by_hand():
    # First half steps 0..3, KL 0,1,2,3: slope 1. Second half steps 3..6, KL 3,5,9,17: centred x -1.5..1.5,
    # y - 8.5 = -5.5,-3.5,0.5,8.5; sum xy = 8.25+1.75+0.25+12.75 = 23; sum xx = 5 -> slope 4.6; ratio 4.6.
    assert kl_acceleration(range(7), [0, 1, 2, 3, 5, 9, 17]) == pytest.approx(4.6)
    assert kl_acceleration(range(7), [0, 1, 2, 3, 4, 5, 6]) == pytest.approx(1.0)


def test_ngram_repetition_by_hand():
    # a b a b a b: bigrams ab ba ab ba ab -> 5 bigrams, 2 distinct, 3 repeats -> 0.6
    assert ngram_repetition_rate([list("ababab")], n=2) == pytest.approx(0.6)
    assert ngram_repetition_rate([list("abcdef")], n=2) == 0.0


def test_ensemble_disagreement_by_hand():
    assert ensemble_disagreement([[1, 2, 3], [10, 20, 30]]) == pytest.approx(0.0)  # same ranking, other scale
    # Opposite members: z = [-1.2247, 0, 1.2247] vs its negation; std across two = |z|; mean = 2*1.2247/3 = 0.8165
    assert ensemble_disagreement([[1, 2, 3], [3, 2, 1]]) == pytest.approx(math.sqrt(2 / 3))
    with pytest.raises(PosttrainError, match="two or more"):
        ensemble_disagreement([[1, 2, 3]])


def test_monitor_fires_when_proxy_rises_and_gold_turns():
    # proxy rises 0.1/step; gold peaks at 0.45 (steps 4-5) and falls. Window 4:
    # step 5: gold .3 .4 .45 .45 -> slope +0.05 (no alarm); step 6: gold .4 .45 .45 .38 -> mean .42,
    # sum xy = -1.5*-.02 + -.5*.03 + .5*.03 + 1.5*-.04 = -0.03, / 5 = -0.006 <= 0 -> fires at step 6.
    gold = [0.1, 0.2, 0.3, 0.4, 0.45, 0.45, 0.38, 0.35, 0.3, 0.25]
    mon = AlarmMonitor([AlarmSpec("proxy_gold", action="rollback", window=4)])
    fired_at = [s for s in range(10) if mon.update({"step": s, "reward_mean": 0.1 * s, "eval/gold": gold[s]})]
    assert fired_at[0] == 6
    first = mon.first_fired()
    assert first.action == "rollback" and first.evidence["gold_slope"] == pytest.approx(-0.006)


def test_monitor_clean_run_fires_nothing_and_evals_may_be_sparse():
    mon = AlarmMonitor([AlarmSpec("proxy_gold", window=4), AlarmSpec("kl_accel", window=8),
                        AlarmSpec("entropy_collapse"), AlarmSpec("repetition", threshold=0.5)])
    for s in range(20):
        m = {"step": s, "reward_mean": 0.05 * s, "kl": 0.01 * s, "entropy": 2.0 - 0.02 * s, "repetition_rate": 0.1}
        if s % 3 == 0:
            m["eval/gold"] = 0.04 * s  # gold rises with the proxy, logged every 3 steps
        assert mon.update(m) == []


def test_monitor_entropy_collapse_and_threshold_alarms():
    mon = AlarmMonitor([AlarmSpec("entropy_collapse", action="stop", threshold=0.1),
                        AlarmSpec("repetition", threshold=0.5)])
    assert mon.update({"step": 0, "entropy": 2.0, "repetition_rate": 0.1}) == []
    fired = mon.update({"step": 1, "entropy": 0.1, "repetition_rate": 0.7})
    assert {(f.kind, f.action) for f in fired} == {("entropy_collapse", "stop"), ("repetition", "warn")}


def test_unstandardized_disagreement_sees_an_offset_between_members():
    members = [[0.0, 1.0, 2.0], [2.0, 1.0, -1.0]]  # per-sample std 1, 0, 1.5 -> mean 2.5 / 3
    assert ensemble_disagreement(members, standardize=False) == pytest.approx(2.5 / 3)
    # member 2 = member 1 + 3: identical after z-scoring, a disagreement of 1.5 per sample as given
    shifted = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert ensemble_disagreement(shifted) == pytest.approx(0.0, abs=1e-12)
    assert ensemble_disagreement(shifted, standardize=False) == pytest.approx(1.5)


def test_length_bucket_edges_by_hand():
    # sorted 1,1,2,2,3,3,4,4,5,5; linear quantiles at .2/.4/.6/.8 sit at positions 1.8/3.6/5.4/7.2 -> 1.8/2.6/3.4/4.2
    assert length_bucket_edges([5, 1, 2, 4, 3, 1, 2, 3, 4, 5]) == pytest.approx([1, 1.8, 2.6, 3.4, 4.2, 6])
    # 2,2,2,4,4,4,4,4: quantiles 2, 3.6, 4, 4; the min (2) and the duplicate 4 are dropped
    assert length_bucket_edges([2, 2, 4, 4, 2, 4, 4, 4]) == pytest.approx([2, 3.6, 4, 5])


def test_length_driven_gain_fires_only_when_the_gain_vanishes_within_buckets():
    # before: short completions score 0, long ones 1; after: more of them are long, no better at either length.
    # overall 0.5 -> 0.75 (+0.25); buckets [2, 3.6): 0 -> 0, [3.6, 4): empty, [4, 5): 1 -> 1; within 0 < 0.5 x 0.25
    ev = length_driven_gain(([2, 2, 4, 4], [0, 0, 1, 1]), ([2, 4, 4, 4], [0, 1, 1, 1]), share=0.5)
    assert ev["overall_gain"] == pytest.approx(0.25) and ev["within_bucket_gain"] == pytest.approx(0.0)
    assert ev["buckets"][1][2] is None and (ev["length_before"], ev["length_after"]) == (3.0, 3.5)
    # the same lengths, every completion 0.5 better: within-bucket gain 0.5 = overall -> no alarm
    assert length_driven_gain(([2, 2, 4, 4], [0, .5, 0, .5]), ([2, 2, 4, 4], [.5, 1, .5, 1]), share=0.5) is None
    # the reward fell: no alarm
    assert length_driven_gain(([2, 4], [1, 1]), ([2, 4], [0, 0]), share=0.5) is None


def test_monitor_length_bucket_and_rm_disagreement():
    mon = AlarmMonitor([AlarmSpec("length_bucket", threshold=0.5, window=1),
                        AlarmSpec("rm_disagreement", threshold=1.5)])
    assert mon.update({"step": 1, "sample_lengths_rewards": ([2, 2, 4, 4], [0, 0, 1, 1]), "rm_disagreement": 0.2}) == []
    assert mon.update({"step": 2, "sample_lengths_rewards": ([2, 2, 4, 4], [0, 0, 1, 1]), "rm_disagreement": 0.25}) == []
    fired = mon.update({"step": 3, "sample_lengths_rewards": ([2, 4, 4, 4], [0, 1, 1, 1]), "rm_disagreement": 0.31})
    by_kind = {f.kind: f.evidence for f in fired}
    assert by_kind["length_bucket"]["overall_gain"] == pytest.approx(0.25)  # step 1 (first window) vs step 3
    assert by_kind["rm_disagreement"] == {"initial": 0.2, "now": 0.31, "ratio": pytest.approx(1.55)}


def test_bad_alarm_specs_are_user_errors():
    with pytest.raises(PosttrainError, match="action"):
        AlarmSpec("proxy_gold", action="explode")
    with pytest.raises(PosttrainError, match="unknown"):
        AlarmSpec("vibes")
    with pytest.raises(PosttrainError, match="step"):
        AlarmMonitor([]).update({"reward_mean": 1})


def test_proxy_gold_alarm_carries_the_gold_vs_kl_fit():
    # KL = d^2 with d = step / 2, gold = d * (2 - 0.5 d) (peak at d = 2, KL = 4, step 4); proxy rises throughout.
    # Window 3 at step 5: gold(d=2, 2.5) = 2, 1.875 after 1.875 at d=1.5 -> slope (1.875-1.875)/2 = 0 -> fires;
    # the fit over steps 0..5 recovers alpha = 2, beta = 0.5 exactly, so peak_kl = 4.
    mon = AlarmMonitor([AlarmSpec("proxy_gold", window=3)])
    fired = []
    for s in range(8):
        d = s / 2
        fired += mon.update({"step": s, "reward_mean": s, "kl": d * d, "eval/gold": d * (2 - 0.5 * d)})
    first = fired[0]
    assert first.step == 5
    assert first.evidence["peak_kl"] == pytest.approx(4.0) and first.evidence["kl_now"] == pytest.approx(6.25)
