"""The scale-out config on a real 2-node Ray cluster on loopback (see cluster_checks.py for why a private network
namespace): 2 FSDP2 trainer ranks and 2 rollout engines placed by the colocated plan on 2 nodes x 2 logical GPUs.
The loop completes, and each trainer rank and each engine ran on the node the plan gave it: rank 0 with engine 0
on one node, rank 1 with engine 1 on the other."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def facts(two_node_cluster_facts) -> dict:
    return two_node_cluster_facts["scaleout"]  # run by cluster_checks.py on the shared cluster (conftest.py)


def test_two_ranks_and_two_engines_complete_on_two_nodes(facts):
    summary = facts["summary"]
    assert summary["steps"] == 2 and Path(summary["final_checkpoint"]).name == "step_000002"
    steps = [m for m in facts["metrics"] if "time/step" in m]
    assert len(steps) == 2 and all(m["loss"] is not None and m["time/sync"] > 0 for m in steps)
    assert any(m["loss"] != 0 for m in steps)  # the length reward gives the random model non-zero advantages


def test_trainer_ranks_and_engines_run_where_the_plan_put_them(facts):
    slots = facts["slots"]
    # The plan: 4 policy devices, ranks on devices 0 and 2 (= group 0 and group 1, one group per node), engines too.
    assert slots["trainer"]["group"] == slots["rollout0"]["group"] == 0
    assert slots["trainer1"]["group"] == slots["rollout1"]["group"] == 1
    ranks = {a["repr"]: a["node_id"] for a in facts["actors"] if a["class"] == "ShardedTrainer"}
    engines = [a["node_id"] for a in facts["actors"] if a["class"] == "RolloutWorker"]
    assert set(ranks) == {"ShardedTrainer(rank=0)", "ShardedTrainer(rank=1)"}
    node0, node1 = ranks["ShardedTrainer(rank=0)"], ranks["ShardedTrainer(rank=1)"]
    assert node0 != node1 and {node0, node1} == set(facts["nodes"])
    assert sorted(engines) == sorted([node0, node1])  # one engine on each node
    reference = [a["node_id"] for a in facts["actors"] if a["class"] == "ReferenceModel"]
    assert reference == [node0]  # device 0, with rank 0
