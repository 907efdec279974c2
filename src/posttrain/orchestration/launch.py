"""Launch specs for running a config elsewhere: a SkyPilot task (spot with recovery through our own --resume from
a mounted checkpoint dir), a Slurm batch script that starts a Ray head and workers the way Ray's Slurm guide does
and then the run, a KubeRay RayJob; and submission to a running Ray cluster (Ray Jobs API). The specs are built
as data / text here (pure) and written or submitted at the edge (`launch_command`)."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from posttrain.config import RunConfig, load_config
from posttrain.errors import PosttrainError
from posttrain.topology.devices import Cluster, parse_cluster

TARGETS = ("skypilot", "slurm", "kuberay", "ray")
CKPT_MOUNT = "/checkpoints"  # where the run directory lives on the remote side (a bucket / PVC mount)


def train_command(config_path: str, runs_dir: str, extra: list[str] | None = None) -> str:
    """The run, resuming when a valid checkpoint of it already exists (a preempted spot job restarts here)."""
    base = ["posttrain", "train", config_path, f"runs_dir={runs_dir}", "ray.address=auto", "--quiet", *(extra or [])]
    cmd = " ".join(shlex.quote(x) for x in base)
    from posttrain.checkpoint import PREFIX

    found = f"ls -d {shlex.quote(runs_dir)}/*/checkpoints/{PREFIX}* >/dev/null 2>&1"
    return f"if {found}; then {cmd} --resume; else {cmd}; fi"


def _accelerator(cluster: Cluster) -> tuple[str, int]:
    return cluster.device.name.split("-")[0], cluster.devices_per_node


def skypilot_task(cfg: RunConfig, config_path: str, cluster: Cluster, spot: bool, bucket: str | None) -> dict:
    gpu, per_node = _accelerator(cluster)
    resources: dict = {"accelerators": f"{gpu}:{per_node}", "use_spot": spot}
    if spot:
        # Managed jobs relaunch a preempted job on new capacity; the run itself continues from its checkpoint.
        resources["job_recovery"] = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3}
    mount = {"name": bucket or f"posttrain-{cfg.name}-ckpt", "mode": "MOUNT"}
    head_only = f"if [ \"$SKYPILOT_NODE_RANK\" = 0 ]; then {train_command(config_path, CKPT_MOUNT)}; fi"
    return {
        "name": f"posttrain-{cfg.name}",
        "resources": resources,
        "num_nodes": cluster.nodes,
        "workdir": ".",
        "file_mounts": {CKPT_MOUNT: mount},
        "setup": "pip install -e '.[gpu]'",
        "run": "\n".join([
            "set -e",
            "HEAD_IP=$(echo \"$SKYPILOT_NODE_IPS\" | head -n1)",
            "if [ \"$SKYPILOT_NODE_RANK\" = 0 ]; then",
            "  ray start --head --port 6379 --disable-usage-stats",
            "else",
            "  sleep 10; ray start --address $HEAD_IP:6379 --disable-usage-stats",
            "fi",
            head_only,
        ]) + "\n",
    }


def slurm_script(cfg: RunConfig, config_path: str, cluster: Cluster) -> str:
    """sbatch script after Ray's Slurm guide: one task per node, the head on the first node, workers on the rest
    joining its address, then the driver on the head."""
    _, per_node = _accelerator(cluster)
    return f"""#!/bin/bash
#SBATCH --job-name=posttrain-{cfg.name}
#SBATCH --nodes={cluster.nodes}
#SBATCH --exclusive
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task={per_node}
#SBATCH --output=posttrain-{cfg.name}-%j.log
set -euo pipefail

nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
nodes_array=($nodes)
head_node=${{nodes_array[0]}}
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{{print $1}}')
port=6379
ip_head=$head_node_ip:$port
export RAY_ADDRESS=$ip_head

srun --nodes=1 --ntasks=1 -w "$head_node" \\
    ray start --head --node-ip-address="$head_node_ip" --port=$port \\
    --num-cpus "${{SLURM_CPUS_PER_TASK:-8}}" --num-gpus {per_node} --block &
sleep 10

worker_num=$((SLURM_JOB_NUM_NODES - 1))
for ((i = 1; i <= worker_num; i++)); do
    node_i=${{nodes_array[$i]}}
    srun --nodes=1 --ntasks=1 -w "$node_i" \\
        ray start --address "$ip_head" --num-cpus "${{SLURM_CPUS_PER_TASK:-8}}" --num-gpus {per_node} --block &
    sleep 5
done

# The checkpoint directory must be on a shared filesystem: a requeued job resumes from it.
RUNS_DIR=${{POSTTRAIN_RUNS_DIR:-$SLURM_SUBMIT_DIR/runs}}
{train_command(config_path, "$RUNS_DIR").replace("'$RUNS_DIR'", '"$RUNS_DIR"')}
"""


def rayjob_manifest(cfg: RunConfig, config_path: str, cluster: Cluster, image: str) -> dict:
    gpu, per_node = _accelerator(cluster)
    limits = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(per_node)}
    volume = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"posttrain-{cfg.name}-ckpt"}}]
    mounts = [{"name": "checkpoints", "mountPath": CKPT_MOUNT}]

    def pod(name: str) -> dict:
        return {"spec": {"containers": [{"name": name, "image": image, "resources": {"limits": limits,
                                                                                   "requests": limits},
                                         "volumeMounts": mounts}], "volumes": volume}}

    spec: dict = {
        "entrypoint": f"bash -c {shlex.quote(train_command(config_path, CKPT_MOUNT))}",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": 600,
        "backoffLimit": 2,
        # The submitter runs beside the head in its pod, so the dashboard stays bound to loopback (KubeRay >= 1.3).
        "submissionMode": "SidecarMode",
        "runtimeEnvYAML": yaml.safe_dump({"working_dir": ".", "pip": ["posttrain[gpu]"]}),
        "rayClusterSpec": {
            "rayVersion": "2.60.0",
            "headGroupSpec": {"rayStartParams": {"dashboard-host": "127.0.0.1"}, "template": pod("ray-head")},
        },
    }
    if cluster.nodes > 1:
        spec["rayClusterSpec"]["workerGroupSpecs"] = [{
            "groupName": f"{gpu.lower()}-workers", "replicas": cluster.nodes - 1, "minReplicas": cluster.nodes - 1,
            "maxReplicas": cluster.nodes - 1, "rayStartParams": {}, "template": pod("ray-worker"),
        }]
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": f"posttrain-{cfg.name}".lower()},
            "spec": spec}


def submit_to_ray(address: str, config_path: str, extra: list[str], working_dir: str | None = None) -> tuple:
    """Submits `posttrain train` as a Ray job; returns (client, job id)."""
    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(address)
    except Exception as e:  # noqa: BLE001 -- one clear message for an unreachable cluster
        raise PosttrainError(f"--address {address}: no Ray job server there ({e})",
                             hint="pass the dashboard address of a running cluster, e.g. http://HEAD:8265") from None
    base = ["posttrain", "train", config_path, "ray.address=auto", "--quiet", *extra]
    runtime_env = {"working_dir": working_dir} if working_dir else None
    job = client.submit_job(entrypoint=" ".join(shlex.quote(x) for x in base), runtime_env=runtime_env)
    return client, job


def launch_command(console, config: str, target: str, *, out=None, address=None, cluster=None, image="",
                   checkpoint_bucket=None, spot=True, wait=False, extra: list[str] | None = None) -> Path | str:
    if target not in TARGETS:
        raise PosttrainError(f"--target {target!r} is not one of {', '.join(TARGETS)}")
    cfg = load_config(config, extra or [])
    if target == "ray":
        if not address:
            raise PosttrainError("--target ray needs --address", hint="e.g. --address http://127.0.0.1:8265")
        client, job = submit_to_ray(address, config, extra or [])
        console.print(f"submitted job {job} to {address}")
        if wait:
            import time

            while (status := client.get_job_status(job)).is_terminal() is False:
                time.sleep(2)
            console.print(client.get_job_logs(job)[-4000:])
            console.print(f"job {job}: {status}")
        return job
    text = cluster or cfg.topology.cluster
    if not text:
        raise PosttrainError("no cluster to launch on", hint="pass --cluster 2x8xH100-80GB or set topology.cluster")
    c = parse_cluster(text)
    outdir = Path(out or f"runs/{cfg.name}/launch")
    outdir.mkdir(parents=True, exist_ok=True)
    rel = Path(config).name if Path(config).is_absolute() else config
    if target == "skypilot":
        path = outdir / "skypilot.yaml"
        path.write_text(yaml.safe_dump(skypilot_task(cfg, rel, c, spot, checkpoint_bucket), sort_keys=False))
    elif target == "slurm":
        path = outdir / "posttrain.sbatch"
        path.write_text(slurm_script(cfg, rel, c))
    else:
        path = outdir / "rayjob.yaml"
        path.write_text(yaml.safe_dump(rayjob_manifest(cfg, rel, c, image), sort_keys=False))
    console.print(f"wrote {path}")
    return path
