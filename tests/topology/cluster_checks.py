"""Run inside a private network namespace (`unshare -rn`, only `lo` up) by test_cluster_integration.py: starts a
2-node Ray cluster on 127.0.0.1 (two `ray start --block` raylets, each declaring 2 logical GPUs; the machine has no
physical ones), places stand-in actors through the plan -> placement-group code create_roles uses, submits a real
`posttrain train` job through `posttrain launch --target ray`'s submission path, runs scaleout_checks.py's sharded
run on the same cluster (before the submission), records what happened as JSON and stops the processes it started (never `ray stop`, which would reach other users' Ray processes).

    python tests/topology/cluster_checks.py OUT.json MODEL_DIR WORK_DIR"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GPUS_PER_NODE = 2
GCS_PORT, DASHBOARD_PORT = 6379, 8265


def _ray_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update(RAY_USAGE_STATS_ENABLED="0", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", **(extra or {}))
    return env


def _common(cpus: float, gpus: int) -> list[str]:
    return ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus), "--num-gpus", str(gpus),
            "--object-store-memory", str(200 * 2**20)]


def start_head(temp: str, env: dict | None = None, cpus: int = 3, gpus: int = GPUS_PER_NODE) -> subprocess.Popen:
    """The head node (GCS, dashboard) as its own process group."""
    head = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--port", str(GCS_PORT), "--temp-dir", temp,
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(DASHBOARD_PORT),
            *_common(cpus, gpus)]
    return subprocess.Popen(head, env=_ray_env(env), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=open(Path(temp) / "head.err", "w"))


def start_worker_node(temp: str, index: int, label: bool = False, cpus: int = 3,
                      gpus: int = GPUS_PER_NODE) -> subprocess.Popen:
    """Worker node `index` (1, 2, ...) as its own process group (SIGKILL the group to lose the node), with ports of
    its own so that several share the loopback address; `label`: a custom resource node<index> names it in
    ray.nodes()."""
    base = 52366 + 10 * (index - 1)
    worker = [str(Path(sys.executable).with_name("ray")), "start", "--address", f"127.0.0.1:{GCS_PORT}",
              "--dashboard-agent-listen-port", str(base), "--metrics-export-port", str(base + 1),
              "--runtime-env-agent-port", str(base + 2), *_common(cpus, gpus),
              *(["--resources", json.dumps({f"node{index}": 1})] if label else [])]
    return subprocess.Popen(worker, env=_ray_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=open(Path(temp) / f"worker{index}.err", "w"))


def wait_for_gcs(head: subprocess.Popen, timeout: float = 60) -> None:
    """Until the head's GCS accepts connections on GCS_PORT (a worker node started before that gives up joining);
    raises when the head exited or the port stayed closed (its stderr is in the temp dir's head.err)."""
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"the Ray head exited with {head.returncode} before its GCS listened")
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex(("127.0.0.1", GCS_PORT)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the Ray head's GCS did not listen on 127.0.0.1:{GCS_PORT} within {timeout:.0f} s")


def alive_nodes() -> list[str]:
    """The node ids Ray's GCS reports alive (the driver is connected)."""
    import ray

    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


def wait_for_nodes(n: int, timeout: float = 90) -> list[str]:
    """Until exactly `n` nodes are alive or `timeout` passed (the caller asserts on what it gets): their ids."""
    deadline = time.time() + timeout
    while len(alive_nodes()) != n and time.time() < deadline:
        time.sleep(0.1)
    return alive_nodes()


def start_cluster(temp: str) -> list[subprocess.Popen]:
    procs = [start_head(temp)]
    wait_for_gcs(procs[0])
    procs.append(start_worker_node(temp, 1))
    return procs


def run_in_namespace(script: Path, out: Path, model_dir: str, work: Path, nodes: int = 2, timeout: int = 600) -> dict:
    """Runs `script OUT MODEL_DIR WORK` in a private network namespace with only `lo` up (the tests' harness) and
    returns the JSON it wrote; fails the test on an error it recorded or when not all `nodes` joined."""
    import shutil

    import pytest

    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a private loopback network")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))
    cmd = f"ip link set lo up && exec {sys.executable} {script} {out} {model_dir} {work}"
    r = subprocess.run(["unshare", "-rn", "bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), f"{script.name} wrote nothing (rc {r.returncode}):\n{r.stderr[-3000:]}"
    facts = json.loads(out.read_text())
    assert "error" not in facts, facts["error"]
    assert len(facts["nodes"]) == nodes, f"{nodes - len(facts['nodes'])} node(s) did not join"
    return facts


def stop_cluster(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):  # `ray start --block` stops the processes it started on SIGTERM
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def place(cfg) -> dict:
    """The spec create_roles would execute, reserved; one stand-in actor per role on its slot; where each landed."""
    import ray
    from ray.util import placement_group_table

    from posttrain.topology.from_config import plan_for_config
    from posttrain.topology.placement import actor_options, placement_for_run, release, reserve

    @ray.remote
    class Probe:
        def where(self):
            return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids()

    _, _, plan = plan_for_config(cfg)
    spec = placement_for_run(cfg)
    pgs = reserve(spec, timeout_s=60)
    try:
        actors = {name: Probe.options(**actor_options(spec, pgs, name)).remote() for name in spec.actors}
        where = {name: ray.get(a.where.remote(), timeout=60) for name, a in actors.items()}
        tables = [placement_group_table(pg) for pg in pgs]
        for a in actors.values():
            ray.kill(a)
    finally:
        release(pgs)
    return {
        "plan": {"layout": plan.layout, "devices": plan.devices},
        "groups": [{"node": g.node, "strategy": g.strategy, "bundles": g.bundles} for g in spec.groups],
        "slots": {n: {"group": s.group, "bundle": s.bundle, "resources": s.resources} for n, s in spec.actors.items()},
        "tables": [{"strategy": t["strategy"], "bundles_to_node_id": {str(k): v for k, v in
                                                                       t["bundles_to_node_id"].items()}}
                   for t in tables],
        "actors": {n: {"node_id": w[0], "gpu_ids": [str(g) for g in w[1]]} for n, w in where.items()},
    }


def submit(model_dir: str, work: Path) -> dict:
    from rich.console import Console

    from posttrain.orchestration.launch import launch_command

    cfg = work / "submitted.yaml"
    cfg.write_text(
        f"name: submitted\nruns_dir: {work / 'runs'}\nmodel: {{path: {model_dir}}}\n"
        "task: {heldout_size: 8}\nalgorithm: {group_size: 2, prompts_per_step: 2, skip_zero_variance_groups: false}\n"
        "rollout: {engine: hf}\ntrain: {steps: 2}\neval: {every: 0}\ncheckpoint: {every: 0}\n"
        "logging: {progress: false}\n"
    )
    from ray.job_submission import JobSubmissionClient

    job = launch_command(Console(file=open(os.devnull, "w")), str(cfg), "ray",
                         address=f"http://127.0.0.1:{DASHBOARD_PORT}")
    client = JobSubmissionClient(f"http://127.0.0.1:{DASHBOARD_PORT}")
    deadline = time.time() + 240
    while not client.get_job_status(job).is_terminal() and time.time() < deadline:
        time.sleep(0.2)
    summary = work / "runs" / "submitted" / "summary.json"
    return {"job": job, "status": str(client.get_job_status(job)), "logs_tail": client.get_job_logs(job)[-3000:],
            "summary": json.loads(summary.read_text()) if summary.exists() else None}


def main() -> None:
    out, model_dir, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    # A private HOME: a token another user's cluster left in ~/.ray must not switch this one to token auth.
    (work / "home").mkdir(parents=True, exist_ok=True)
    os.environ.update(HOME=str(work / "home"), RAY_AUTH_MODE="disabled")
    import ray

    from posttrain.config import load_config

    result: dict = {}
    import tempfile

    procs = start_cluster(tempfile.mkdtemp(prefix="rpt-"))  # short: Ray's socket paths must stay < 108 chars
    try:
        ray.init(address=f"127.0.0.1:{GCS_PORT}", log_to_driver=False)
        result["nodes"] = wait_for_nodes(2)
        for mode in ("colocated", "split"):
            cfg = load_config(None, [f"model.path={model_dir}", f"topology.mode={mode}",
                                     f"topology.cluster=2x{GPUS_PER_NODE}xH100-80GB", "rollout.num_workers=2",
                                     "algorithm.kl_coef=0.02"])
            result[mode] = place(cfg)
        from scaleout_checks import run as train_scaled_out  # test_scaleout_cluster's run: one cluster start for both

        result["scaleout"] = train_scaled_out(model_dir, work)
        ray.shutdown()
        result["submission"] = submit(model_dir, work)
    except Exception as e:  # noqa: BLE001 -- reported to the test, which fails on it
        import traceback

        result["error"] = traceback.format_exc() + repr(e)
    finally:
        ray.shutdown()
        stop_cluster(procs)
        Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
