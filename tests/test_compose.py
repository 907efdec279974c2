"""Reward composition and the gold function: pure, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest

from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.rewards.compose import (
    compose, ensemble_mean, ensemble_spread, format_component, length_component, normalize,
)
from posttrain.rewards.gold import addition_gold
from posttrain.rewards.scoring import component_means


def test_compose_weights_sources_and_ignores_unweighted_ones():
    comps = {"verifier": [1.0, 0.0], "rm": [0.5, -1.0], "length": [-0.25, -1.0], "gold": [9.0, 9.0]}
    # sample 0: 1*1 + 0.5*0.5 + 0.2*(-0.25) = 1 + 0.25 - 0.05 = 1.2 ; sample 1: 0 - 0.5 - 0.2 = -0.7
    assert compose(comps, {"verifier": 1.0, "rm": 0.5, "length": 0.2}) == pytest.approx([1.2, -0.7])
    # today's default: the verifier alone
    assert compose(comps, {"verifier": 1.0}) == [1.0, 0.0]
    with pytest.raises(ValueError, match="judge"):
        compose(comps, {"judge": 1.0})
    with pytest.raises(ValueError, match="length"):
        compose({"verifier": [1.0], "rm": [1.0, 2.0]}, {"verifier": 1.0})


def test_components_by_hand():
    assert normalize([3.0, 1.0], mean=2.0, std=0.5) == [2.0, -2.0]          # (3-2)/0.5, (1-2)/0.5
    assert length_component([0, 2, 8], max_new_tokens=8) == [0.0, -0.25, -1.0]
    assert format_component(["432", " 12 ", "4a", ""], r"\d+") == [1.0, 1.0, 0.0, 0.0]
    assert component_means({"rm": [1.0, 2.0, 6.0]}) == {"reward/rm": 3.0}


def test_reward_model_ensemble_by_hand():
    members = [[0.0, 1.0, 2.0], [2.0, 1.0, -1.0]]  # two RMs' normalized scores of three samples
    assert ensemble_mean(members) == [1.0, 1.0, 0.5]
    # population std of (0, 2), (1, 1), (2, -1): 1, 0, 1.5
    assert ensemble_spread(members) == pytest.approx([1.0, 0.0, 1.5])
    assert ensemble_mean([[0.3, -0.2]]) == [0.3, -0.2] and ensemble_spread([[0.3, -0.2]]) == [0.0, 0.0]


def test_addition_gold_by_hand():
    assert addition_gold("432", "432") == 1.0
    assert addition_gold("432", "431") == pytest.approx(2 / 3)        # two of three digits right
    assert addition_gold("432", "4320") == pytest.approx(-0.1)        # every digit shifts: 0, one char too long
    assert addition_gold("1027", "1020") == pytest.approx(0.75)
    assert addition_gold("432", "ab") == 0.0


def test_reward_config_default_is_the_verifier_and_bad_sources_are_named():
    assert load_config(None).reward.weights == {"verifier": 1.0}
    with pytest.raises(PosttrainError, match="unknown source"):
        load_config(None, ["reward.weights={verifer: 1.0}"])
    with pytest.raises(PosttrainError, match="rm_path"):
        load_config(None, ["reward.weights={rm: 1.0}"])
    with pytest.raises(PosttrainError, match="judge.url"):
        load_config(None, ["reward.weights={judge: 1.0}"])
