"""Which roles a config asks Ray for: a bundle per role; no reference model when the KL coefficient is 0."""

from posttrain.config import load_config
from posttrain.orchestration.roles import needed_cpus, role_bundles


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
