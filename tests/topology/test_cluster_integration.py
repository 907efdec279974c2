"""On a real 2-node Ray cluster on loopback (two `ray start` raylets on 127.0.0.1 in a private network namespace,
each declaring 2 logical GPUs; there are no physical ones): the plan's placement groups put every role's actor on
the node and bundle the plan named, for a colocated and a split plan; and `posttrain launch --target ray` submits
a real `posttrain train` job that finishes and writes its summary.

Why a namespace: with multi-node Ray enabled, Ray rewrites 127.0.0.1 to the machine's interface address; inside
`unshare -rn` with only `lo` up its address lookup falls back to 127.0.0.1, so nothing leaves loopback and no other
Ray cluster on the machine can be reached. tests/topology/cluster_checks.py runs there once for the session (the
shared cluster, conftest.py), records what happened, and stops only the processes it started; the assertions are here."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

GPUS_PER_NODE = 2


@pytest.fixture(scope="module")
def cluster_facts(two_node_cluster_facts) -> dict:
    return two_node_cluster_facts


def _check_landing(facts: dict) -> None:
    """Every actor runs on the node holding the bundle its slot names; every slot is a device the plan gave its
    role; each per-node group is STRICT_PACK on one node, the two groups on two nodes."""
    tables, groups = facts["tables"], facts["groups"]
    group_nodes = [next(iter(t["bundles_to_node_id"].values())) for t in tables]
    assert len(set(group_nodes)) == len(group_nodes)
    for g, t in zip(groups, tables):
        assert g["strategy"] == t["strategy"] == "STRICT_PACK"
        assert len(set(t["bundles_to_node_id"].values())) == 1
    devices = facts["plan"]["devices"]
    for name, slot in facts["slots"].items():
        node = tables[slot["group"]]["bundles_to_node_id"][str(slot["bundle"])]
        assert facts["actors"][name]["node_id"] == node, name
        device = groups[slot["group"]]["node"] * GPUS_PER_NODE + slot["bundle"]
        role = "rollout" if name.startswith("rollout") else {"trainer": "policy"}.get(name, name)
        assert device in devices.get(role, devices["policy"][:1]), (name, device)


def test_colocated_plan_puts_roles_on_the_named_bundles(cluster_facts):
    f = cluster_facts["colocated"]
    _check_landing(f)
    assert f["plan"]["layout"] == "colocated" and f["plan"]["devices"]["policy"] == [0, 1, 2, 3]
    slots, actors = f["slots"], f["actors"]
    # Two engines over 4 devices: rollout0 on device 0 (node 0, with trainer, reference and reward), rollout1 on
    # device 2 = node 1, bundle 0.
    assert (slots["rollout1"]["group"], slots["rollout1"]["bundle"]) == (1, 0)
    assert actors["trainer"]["node_id"] == actors["rollout0"]["node_id"] != actors["rollout1"]["node_id"]
    # Four actors share device 0: a quarter of its GPU each, and Ray hands them the same GPU id.
    assert slots["trainer"]["resources"]["GPU"] == 0.25
    assert actors["trainer"]["gpu_ids"] == actors["rollout0"]["gpu_ids"]


def test_split_plan_puts_each_role_on_its_own_devices(cluster_facts):
    f = cluster_facts["split"]
    _check_landing(f)
    assert f["plan"]["layout"] == "split"
    sets = [set(f["plan"]["devices"][r]) for r in ("policy", "reference", "rollout")]
    assert all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1:])
    slots = f["slots"]
    # The rule-based reward worker holds no model: it shares the trainer's device, half a GPU each.
    assert (slots["reward"]["group"], slots["reward"]["bundle"]) == (slots["trainer"]["group"], slots["trainer"]["bundle"])
    assert slots["trainer"]["resources"]["GPU"] == 0.5
    # Roles on disjoint devices get distinct bundles (or distinct nodes).
    at = {n: (s["group"], s["bundle"]) for n, s in slots.items()}
    assert at["trainer"] != at["reference"] and at["trainer"] != at["rollout0"] and at["reference"] != at["rollout1"]


def test_launch_target_ray_submits_a_job_that_trains(cluster_facts):
    sub = cluster_facts["submission"]
    assert sub["status"] == "SUCCEEDED", sub["logs_tail"]
    summary = sub["summary"]
    assert summary["steps"] == 2
    acc = summary["accounting"]  # device-seconds and busy fraction per role, from the step-time split
    assert set(acc["roles"]) >= {"trainer", "rollout", "reward", "reference"}
    assert 0 < acc["roles"]["rollout"]["busy_fraction"] <= 1 and acc["usd"] > 0
