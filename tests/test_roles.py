"""Which roles a config asks Ray for: a bundle per role; no reference model when the KL coefficient is 0."""

import pytest

from posttrain.config import load_config
from posttrain.topology.placement import needed_cpus, role_bundles


def test_reference_exists_only_with_a_kl_term():
    with_kl = [name for name, _ in role_bundles(load_config(None, ["algorithm.kl_coef=0.02", "rollout.num_workers=2"]))]
    without = [name for name, _ in role_bundles(load_config(None, ["algorithm.kl_coef=0", "rollout.num_workers=2"]))]
    assert with_kl == ["trainer", "reference", "reward", "rollout0", "rollout1"]
    assert without == ["trainer", "reward", "rollout0", "rollout1"]


def test_bundles_carry_the_topology_shares():
    cfg = load_config(None, ["algorithm.kl_coef=0", "rollout.num_workers=3", "topology.rollout_cpus=0.5",
                             "topology.trainer_cpus=1", "topology.reward_cpus=0.25", "topology.trainer_gpus=1"])
    bundles = dict(role_bundles(cfg))
    assert bundles["trainer"] == {"CPU": 1.0, "GPU": 1.0}
    assert bundles["rollout2"] == {"CPU": 0.5}
    assert needed_cpus(cfg) == 1 + 0.25 + 3 * 0.5


def test_a_user_error_raised_in_an_actor_constructor_comes_back_as_one_message():
    """Ray gives a constructor's exception back only as text (ActorDiedError.error_msg, checked by hand on Ray 2.60:
    the remote traceback ending in 'posttrain.errors.PosttrainError: <message>\\n  -> <hint>')."""
    from posttrain.errors import PosttrainError
    from posttrain.orchestration.roles import raise_user_error_of

    class ActorDied(Exception):
        error_msg = ("The actor died because of an error raised in its creation task\nTraceback ...\n"
                     "posttrain.errors.PosttrainError: reward.functions.0.fn: no symbol 'x'\n  -> check the name")

    with pytest.raises(PosttrainError) as info:
        raise_user_error_of(ActorDied())
    assert str(info.value).startswith("a role failed to start: reward.functions.0.fn: no symbol 'x'\n  -> check")
    with pytest.raises(KeyError):  # anything else is re-raised as it is
        raise_user_error_of(KeyError("x"))
