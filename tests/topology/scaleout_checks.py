"""Run inside a private network namespace (`unshare -rn`, only `lo` up): `run` is called by cluster_checks.py on
its 2-node loopback Ray cluster (test_scaleout_cluster.py reads its facts); `main` starts that cluster alone. It runs `posttrain.loop.train` on it with 2 sharded trainer ranks and
2 rollout engines laid out by the colocated plan on 2 nodes x 2 logical GPUs, and records the plan's slots, where
each actor ran (Ray's state API: node id per actor) and the run's summary as JSON.

    python tests/topology/scaleout_checks.py OUT.json MODEL_DIR WORK_DIR"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from cluster_checks import GCS_PORT, GPUS_PER_NODE, alive_nodes, start_cluster, stop_cluster, wait_for_nodes

ROLE_CLASSES = ("ShardedTrainer", "RolloutWorker", "ReferenceModel", "RewardWorker")


def run(model_dir: str, work: Path) -> dict:
    from ray.util.state import list_actors

    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.topology.placement import placement_for_run

    cfg = load_config(None, [
        f"model.path={model_dir}", f"runs_dir={work / 'runs'}", "name=scaleout", "task.heldout_size=8",
        "algorithm.group_size=2", "algorithm.prompts_per_step=4", "algorithm.skip_zero_variance_groups=false",
        "algorithm.kl_coef=0.02", "reward.weights={verifier: 1.0, length: 1.0}", "rollout.engine=hf", "train.steps=2", "eval.every=0", "checkpoint.every=0",
        "logging.progress=false", "topology.torch_threads=1", "topology.mode=colocated",
        f"topology.cluster=2x{GPUS_PER_NODE}xH100-80GB", "topology.trainer_ranks=2", "rollout.num_workers=2",
        f"ray.address=127.0.0.1:{GCS_PORT}",
    ])
    spec = placement_for_run(cfg)
    summary = train(cfg, progress=False)
    # the address named: the state API's own search fails when another Ray runs on this machine (a second suite)
    actors = [a for a in list_actors(address=f"127.0.0.1:{GCS_PORT}", limit=1000, detail=True)
              if a.class_name in ROLE_CLASSES]
    return {
        "nodes": alive_nodes(),
        "slots": {n: {"group": s.group, "bundle": s.bundle, "resources": s.resources} for n, s in spec.actors.items()},
        "actors": [{"class": a.class_name, "repr": a.repr_name, "node_id": a.node_id, "pid": a.pid} for a in actors],
        "summary": summary,
        "metrics": [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()],
    }


def main() -> None:
    out, model_dir, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    (work / "home").mkdir(parents=True, exist_ok=True)
    os.environ.update(HOME=str(work / "home"), RAY_AUTH_MODE="disabled")
    import ray

    result: dict = {}
    procs = start_cluster(tempfile.mkdtemp(prefix="rpt-"))
    try:
        ray.init(address=f"127.0.0.1:{GCS_PORT}", log_to_driver=False)
        wait_for_nodes(2)
        result.update(run(model_dir, work))
    except Exception as e:  # noqa: BLE001 -- reported to the test, which fails on it
        result["error"] = traceback.format_exc() + repr(e)
    finally:
        ray.shutdown()
        stop_cluster(procs)
        Path(out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
