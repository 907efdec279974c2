"""Run inside a private network namespace (`unshare -rn`, only `lo` up) by test_chaos.py: a 40-step run on a 2-node
Ray cluster on 127.0.0.1 while an injector, at seeded random steps, SIGKILLs the worker node (raylet and workers),
wedges a rollout engine (remote/faults.py), SIGKILLs the reward worker's process and starts a new node. Then
the same run without faults, for the comparison.

The head has 2 CPUs: exactly the run's placement group (trainer 1, reference 0.25, reward 0.25, rollout0 0.5), so
the elastic workers (rollout.num_workers=1..3) can only live on the worker node (1 CPU: two of them).

    POSTTRAIN_CHAOS_SEED=11 python tests/topology/chaos_checks.py OUT.json MODEL_DIR WORK_DIR"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import psutil
from cluster_checks import GCS_PORT, start_head, start_worker_node, stop_cluster, wait_for_gcs, wait_for_nodes
from nodeloss_checks import FAST_HEALTH, last_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the pace reward function
from pace_reward import install as install_pace  # noqa: E402

STEPS = 40


def config(model_dir: str, work: Path, name: str):
    from posttrain.config import load_config

    pace, _ = install_pace(work / "pace")  # holds the steps slow while a new node's engine starts (Injector)
    return load_config(None, [
        pace, f"model.path={model_dir}", f"runs_dir={work / 'runs'}", f"name={name}", "task.heldout_size=8", "seed=7",
        "algorithm.group_size=8", "algorithm.prompts_per_step=16", "algorithm.skip_zero_variance_groups=false",
        "algorithm.kl_coef=0.02", "reward.weights={verifier: 1.0, length: 1.0}", "rollout.engine=hf",
        "model.dtype=float64",  # chaos and straight runs alike: the comparison cannot depend on kernel choice
        f"train.steps={STEPS}", "eval.every=0", "checkpoint.every=10", "checkpoint.keep_last=10",
        "logging.progress=false", "topology.torch_threads=1", "rollout.num_workers=1..3",
        f"ray.address=127.0.0.1:{GCS_PORT}", "ops.hang_min_seconds=10", "ops.hang_factor=5",
        "ops.hang_cold_seconds=120", "ops.capacity_wait_s=120",
    ])


def schedule(seed: int) -> list[tuple[int, str]]:
    """(after step, fault), in step order: the node goes early (once an extra engine works on it), a new one comes
    4-7 steps later; the wedge and the reward kill fall in the second half."""
    rng = random.Random(seed)
    kill = rng.randint(6, 10)
    return sorted([(kill, "kill_node"), (kill + rng.randint(4, 7), "add_node"), (rng.randint(22, 28), "wedge_engine"),
                   (rng.randint(32, 36), "kill_reward")])


def step_records(run_dir: Path) -> list[dict]:
    """The step records in the run's metrics.jsonl so far ([] while a line is being written)."""
    from posttrain.tracking import read_metrics

    try:
        return [m for m in read_metrics(run_dir) if "time/step" in m]
    except (OSError, ValueError):
        return []


class Injector(threading.Thread):
    def __init__(self, run_dir: Path, plan: list[tuple[int, str]], nodes: dict, temp: str, faults: Path, hold: Path):
        super().__init__(daemon=True)
        self.run_dir, self.plan, self.nodes, self.temp, self.faults = run_dir, plan, nodes, temp, faults
        self.hold = hold  # the pace reward function's hold file
        self.timeline: list[dict] = []

    def run(self) -> None:
        for after, fault in self.plan:
            while last_step(self.run_dir) < after:
                time.sleep(0.05)
            t = time.time()
            detail = getattr(self, fault)()
            self.timeline.append({"fault": fault, "planned_after_step": after, "after_step": last_step(self.run_dir),
                                  "time": t, "detail": detail})

    def kill_node(self) -> str:
        """Once an elastic worker runs on the worker node (the fleet has 2), so that the loss costs the run one."""
        from posttrain.tracking import read_metrics

        while not any(m.get("fleet/workers", 0) >= 2 for m in read_metrics(self.run_dir)[-1:]):
            time.sleep(0.05)
        name, proc = self.nodes.popitem()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        return f"{name} SIGKILLed (its raylet and every worker on it)"

    def add_node(self) -> str:
        """A new 1-CPU node. The steps go slow (the pace reward function, 1 s each) until a step after the add ran on
        two engines, the event the test asserts: a new engine must start, be synced and be admitted, and that took
        longer than the run's remaining fast steps (~0.5 s each) while another test file ran beside this one."""
        name = f"node{len(self.timeline) + 2}"
        self.hold.touch()
        node = self.nodes[name] = start_worker_node(self.temp, len(self.timeline) + 2, label=True, cpus=1, gpus=0)
        threading.Thread(target=self._release_when_the_fleet_grew, args=(len(self.timeline),), daemon=True).start()
        return f"{name} started (1 CPU)"

    def _release_when_the_fleet_grew(self, fault_index: int, limit_s: float = 300) -> None:
        """Removes the hold once a step after fault `fault_index` (its `after_step` in the timeline) has
        fleet/workers >= 2 in metrics.jsonl, or after `limit_s` (then the test's assertion says what happened)."""
        deadline = time.time() + limit_s
        try:
            while time.time() < deadline:
                if len(self.timeline) > fault_index:
                    after = self.timeline[fault_index]["after_step"]
                    if any(m["step"] > after and (m.get("fleet/workers") or 0) >= 2
                           for m in step_records(self.run_dir)):
                        return
                time.sleep(0.1)
        finally:
            self.hold.unlink(missing_ok=True)

    def wedge_engine(self) -> str:
        from posttrain.remote.faults import arm

        arm(self.faults, "generate")
        return "the next rollout generate call blocks forever"

    def kill_reward(self) -> str:
        for p in psutil.process_iter(["pid", "cmdline"]):
            if "ray::RewardWorker" in " ".join(p.info["cmdline"] or []):
                p.kill()
                return f"RewardWorker pid {p.pid} SIGKILLed"
        return "no RewardWorker process found"


def outcome(cfg, started: float) -> dict:
    from posttrain.tracking import read_metrics
    from posttrain.tracking.interruptions import read_interruptions

    samples = [json.loads(x) for x in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    metrics = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    return {"wall_s": time.time() - started, "interruptions": read_interruptions(cfg.run_dir),
            "steps": [m["step"] for m in metrics], "fleet": [m.get("fleet/workers") for m in metrics],
            "step_end_times": [], "samples": {s[0]: s[1] for rec in samples for s in rec["samples"]},
            "sample_ids": [s[0] for rec in samples for s in rec["samples"]],
            "hangs": sorted(p.name for p in (cfg.run_dir / "hangs").iterdir()) if (cfg.run_dir / "hangs").exists() else []}


def final_weights(cfg) -> dict:
    from safetensors.torch import load_file

    return load_file(str(cfg.run_dir / "checkpoints" / f"step_{STEPS:06d}" / "model" / "model.safetensors"))


def main() -> None:
    out, model_dir, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    seed = int(os.environ.get("POSTTRAIN_CHAOS_SEED", "11"))
    (work / "home").mkdir(parents=True, exist_ok=True)
    faults = work / "faults"
    faults.mkdir(exist_ok=True)
    os.environ.update(HOME=str(work / "home"), RAY_AUTH_MODE="disabled", POSTTRAIN_FAULTS_DIR=str(faults))
    import ray

    from posttrain.loop import train
    from posttrain.orchestration.runtime import actor_env

    result: dict = {"schedule": schedule(seed)}
    temp = tempfile.mkdtemp(prefix="rch-")
    head = start_head(temp, FAST_HEALTH, cpus=2, gpus=0)
    nodes: dict = {}
    injector = None
    try:
        wait_for_gcs(head)
        nodes["node1"] = start_worker_node(temp, 1, label=True, cpus=1, gpus=0)
        ray.init(address=f"127.0.0.1:{GCS_PORT}", log_to_driver=False, runtime_env={"env_vars": actor_env()})
        result["nodes"] = wait_for_nodes(2)
        cfg = config(model_dir, work, "chaos")
        injector = Injector(cfg.run_dir, result["schedule"], nodes, temp, faults, work / "pace" / "hold")
        injector.start()
        t = time.time()
        train(cfg, progress=False)
        result["chaos"] = outcome(cfg, t)
        result["timeline"] = injector.timeline
        straight = config(model_dir, work, "straight")
        t = time.time()
        train(straight, progress=False)
        result["straight"] = outcome(straight, t)
        a, b = final_weights(cfg), final_weights(straight)
        result["weights_equal"] = all((a[k] == b[k]).all().item() for k in a)
        result["weights_max_abs_diff"] = max(float((a[k] - b[k]).abs().max()) for k in a)
        result["weights_gap"] = max(float((a[k] - b[k]).abs().max()) / max(1.0, float(b[k].abs().max())) for k in a)
    except Exception as e:  # noqa: BLE001 -- reported to the test, which fails on it
        result["error"] = traceback.format_exc() + repr(e)
        result["timeline"] = injector.timeline if injector else []
    finally:
        ray.shutdown()
        stop_cluster([head, *nodes.values()])
        Path(out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
