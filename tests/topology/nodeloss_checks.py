"""Run inside a private network namespace (`unshare -rn`, only `lo` up) by test_node_loss.py: a 3-node Ray cluster
on 127.0.0.1 (a head and two labelled worker nodes, 3 CPUs and 2 logical GPUs each), and two runs of
`posttrain.loop.train` laid out by the colocated plan on 2 nodes x 2 devices (2 sharded trainer ranks, 2 engines):

1. "continue": after step 3 (of 6), the worker node holding a trainer rank is SIGKILLed (its raylet and workers, the whole
   process group). Two nodes remain, enough for the plan: the run re-forms its roles from the checkpoint of step 2
   and finishes.
2. "exit": on the 2 nodes left, the other worker node is killed after step 3; one node cannot hold the plan, so the
   run waits ops.capacity_wait_s and exits with CapacityLost (exit 76 in the CLI). A new node joins, and
   `train(resume=True)` finishes the run.

Webhooks go to an HTTP server on 127.0.0.1 in this script. Everything observed is written as JSON.

    python tests/topology/nodeloss_checks.py OUT.json MODEL_DIR WORK_DIR"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cluster_checks import (GCS_PORT, GPUS_PER_NODE, alive_nodes, start_head, start_worker_node, stop_cluster,
                            wait_for_gcs, wait_for_nodes)

STEPS, KILL_AFTER = 6, 3
# Ray declares a node dead after health_check_failure_threshold missed checks (default: 5 x 3 s + timeouts, ~30 s,
# longer than the re-form takes here); a 1 s period brings that to ~5-10 s, with a timeout loose enough for 2 busy
# cores.
FAST_HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "3000",
               "RAY_health_check_failure_threshold": "5"}
DELIVERED: list[dict] = []


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        DELIVERED.append({"time": time.time(), **json.loads(self.rfile.read(int(self.headers["Content-Length"])))})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def config(model_dir: str, work: Path, name: str, hook: str, wait_s: float):
    from posttrain.config import load_config

    return load_config(None, [
        f"model.path={model_dir}", f"runs_dir={work / 'runs'}", f"name={name}", "task.heldout_size=8", "seed=5",
        "algorithm.group_size=2", "algorithm.prompts_per_step=4", "algorithm.skip_zero_variance_groups=false",
        "algorithm.kl_coef=0.02", "reward.weights={verifier: 1.0, length: 1.0}", "rollout.engine=hf",
        f"train.steps={STEPS}", "eval.every=0", "checkpoint.every=2", "logging.progress=false",
        "topology.torch_threads=1", "topology.mode=colocated", f"topology.cluster=2x{GPUS_PER_NODE}xH100-80GB",
        "topology.trainer_ranks=2", "rollout.num_workers=2", f"ray.address=127.0.0.1:{GCS_PORT}",
        f"ops.capacity_wait_s={wait_s}", f"ops.notify=[{{url: '{hook}'}}]",
    ])


def label_of(node_id: str) -> str | None:
    import ray

    for n in ray.nodes():
        if n["NodeID"] == node_id:
            return next((k for k in n["Resources"] if k.startswith("node") and k[4:].isdigit()), None)
    return None


def last_step(run_dir: Path) -> int:
    """The newest step in the run's metrics.jsonl (0 before the first; a line being written is skipped)."""
    from posttrain.tracking import read_metrics

    try:
        return max((m["step"] for m in read_metrics(run_dir) if "time/step" in m), default=0)
    except (OSError, ValueError):
        return 0


class NodeKiller(threading.Thread):
    """Once step KILL_AFTER is in metrics.jsonl, SIGKILLs the process group of a worker node that holds a trainer
    rank (the head holds the GCS and this driver; losing it ends any Ray cluster)."""

    def __init__(self, run_dir: Path, nodes: dict):
        super().__init__(daemon=True)
        self.run_dir, self.nodes, self.killed = run_dir, nodes, None

    def run(self) -> None:
        from ray.util.state import list_actors

        self.wait_for(1)  # where the ranks are, asked early: the state API is slow next to a 0.5 s step
        ranks = list_actors(address=f"127.0.0.1:{GCS_PORT}", detail=True,  # not found by scanning: others may run
                            filters=[("class_name", "=", "ShardedTrainer"), ("state", "=", "ALIVE")])
        target = next(((label_of(a.node_id), a) for a in ranks if label_of(a.node_id) in self.nodes), None)
        if target is None:
            return
        label, actor = target
        self.wait_for(KILL_AFTER)
        proc = self.nodes.pop(label)
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.time()
        proc.wait(30)
        self.killed = {"node": label, "node_id": actor.node_id, "rank": actor.repr_name, "time": killed_at,
                       "after_step": last_step(self.run_dir)}

    def wait_for(self, step: int) -> None:
        while last_step(self.run_dir) < step:
            time.sleep(0.02)


def outcome(cfg, started: float) -> dict:
    from posttrain.tracking import read_metrics
    from posttrain.tracking.interruptions import read_interruptions

    samples = [json.loads(x) for x in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    return {"wall_s": time.time() - started, "interruptions": read_interruptions(cfg.run_dir),
            "steps": [m["step"] for m in read_metrics(cfg.run_dir) if "time/step" in m],
            "sample_ids": [s[0] for rec in samples for s in rec["samples"]],
            "checkpoints": sorted(p.name for p in (cfg.run_dir / "checkpoints").glob("step_*"))}


def run(model_dir: str, work: Path, temp: str, nodes: dict, result: dict) -> None:
    from posttrain.loop import train
    from posttrain.orchestration.reform import CapacityLost

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
    result["nodes"] = alive_nodes()

    cfg = config(model_dir, work, "continue", hook, wait_s=60)
    killer = NodeKiller(cfg.run_dir, nodes)
    killer.start()
    t = time.time()
    summary = train(cfg, progress=False)
    result["continue"] = {"killed": killer.killed, "summary_steps": summary["steps"], **outcome(cfg, t),
                          "alive_after": len(alive_nodes())}

    cfg = config(model_dir, work, "exit", hook, wait_s=15)
    killer = NodeKiller(cfg.run_dir, nodes)
    killer.start()
    t = time.time()
    try:
        train(cfg, progress=False)
        result["exit"] = {"error": None}
    except CapacityLost as e:
        result["exit"] = {"error": str(e), "hint": e.hint if hasattr(e, "hint") else None, "exited_s": time.time() - t}
    result["exit"]["killed"] = killer.killed
    result["exit"]["alive_after"] = len(alive_nodes())
    nodes["node3"] = start_worker_node(temp, 3, label=True)
    wait_for_nodes(2)
    t = time.time()
    summary = train(cfg, resume=True, progress=False)
    result["resumed"] = {"summary_steps": summary["steps"], **outcome(cfg, t)}
    deadline = time.time() + 10  # the notifier delivers from its own thread: until the resumed run's last event
    while not any(w.get("run") == "exit" and w.get("event") == "run_finished" for w in DELIVERED) and time.time() < deadline:
        time.sleep(0.1)
    result["webhooks"] = list(DELIVERED)


def main() -> None:
    out, model_dir, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    (work / "home").mkdir(parents=True, exist_ok=True)
    os.environ.update(HOME=str(work / "home"), RAY_AUTH_MODE="disabled")
    import ray

    result: dict = {}
    temp = tempfile.mkdtemp(prefix="rnl-")
    head = start_head(temp, FAST_HEALTH)
    nodes = {}
    try:
        wait_for_gcs(head)
        ray.init(address=f"127.0.0.1:{GCS_PORT}", log_to_driver=False)
        for i in (1, 2):  # one at a time: two raylets starting at once on 2 busy cores time out waiting for the GCS
            nodes[f"node{i}"] = start_worker_node(temp, i, label=True)
            wait_for_nodes(i + 1)
        run(model_dir, work, temp, nodes, result)
    except Exception as e:  # noqa: BLE001 -- reported to the test, which fails on it
        result["error"] = traceback.format_exc() + repr(e)
    finally:
        result["webhooks"] = result.get("webhooks", list(DELIVERED))
        ray.shutdown()
        stop_cluster([head, *nodes.values()])
        Path(out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
