"""Launch specs, each parsed and checked: the SkyPilot task by SkyPilot's own loader (no cloud credentials
needed), the Slurm script by `bash -n` and its Ray start-up lines, the RayJob against the fields KubeRay's CRD
requires. (The submission to a running Ray cluster is in tests/topology/test_cluster_integration.py, which owns
the 2-node cluster.)"""

import subprocess

import pytest
import yaml
from typer.testing import CliRunner

from posttrain.cli import app

CONFIG = "examples/plan-7b-grpo.yaml"


def _launch(tmp_path, target, *extra):
    r = CliRunner().invoke(app, ["launch", CONFIG, "--target", target, "--cluster", "2x8xH100-80GB",
                                 "--out", str(tmp_path), *extra])
    assert r.exit_code == 0, r.output
    return r


def test_skypilot_task_loads_with_skypilots_own_loader(tmp_path, monkeypatch):
    sky = pytest.importorskip("sky", reason="skypilot not installed (pip install 'posttrain[launch]')")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.sky state or credentials are read
    _launch(tmp_path, "skypilot", "--checkpoint-bucket", "my-ckpts")
    task = sky.Task.from_yaml(str(tmp_path / "skypilot.yaml"))
    assert task.num_nodes == 2
    (res,) = task.resources
    assert res.accelerators == {"H100": 8} and res.use_spot
    raw = yaml.safe_load((tmp_path / "skypilot.yaml").read_text())
    assert raw["file_mounts"]["/checkpoints"] == {"name": "my-ckpts", "mode": "MOUNT"}
    # Spot recovery: the relaunched job resumes from the mounted checkpoints.
    assert "--resume" in raw["run"] and "runs_dir=/checkpoints" in raw["run"]


def test_slurm_script_is_valid_bash_and_starts_ray_head_then_workers(tmp_path):
    _launch(tmp_path, "slurm")
    script = tmp_path / "posttrain.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-task=8" in text
    head = text.index("ray start --head")
    worker = text.index('ray start --address "$ip_head"')
    run = text.index("posttrain train")
    assert head < worker < run
    assert "ray.address=auto" in text and "--resume" in text


def test_rayjob_manifest_has_the_fields_kuberay_requires(tmp_path):
    _launch(tmp_path, "kuberay", "--image", "rayproject/ray:2.60.0-py312-gpu")
    doc = yaml.safe_load((tmp_path / "rayjob.yaml").read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    spec = doc["spec"]
    assert spec["entrypoint"].startswith("bash -c") and "posttrain train" in spec["entrypoint"]
    head = spec["rayClusterSpec"]["headGroupSpec"]
    (workers,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 1  # 2 nodes: the head plus one worker
    for group in (head, workers):
        assert "rayStartParams" in group
        (container,) = group["template"]["spec"]["containers"]
        assert container["image"] == "rayproject/ray:2.60.0-py312-gpu"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert yaml.safe_load(spec["runtimeEnvYAML"])["working_dir"] == "."


def test_launch_errors_are_one_message(tmp_path):
    r = CliRunner().invoke(app, ["launch", CONFIG, "--target", "lsf", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "not one of" in r.output
    r = CliRunner().invoke(app, ["launch", CONFIG, "--target", "ray"])
    assert r.exit_code == 2 and "needs --address" in r.output


def test_the_launched_command_resumes_exactly_when_a_checkpoint_exists(tmp_path):
    """The generated shell line, run by bash: `posttrain` is a stand-in that prints its arguments (the real CLI
    would need Ray), the checkpoint a real one from checkpoint.py."""
    from posttrain.orchestration.launch import train_command
    from posttrain import checkpoint as ckpt

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "posttrain").write_text('#!/bin/sh\necho "$@"\n')
    (bin_dir / "posttrain").chmod(0o755)
    runs = tmp_path / "runs"
    line = train_command("run.yaml", str(runs))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    def run() -> str:
        return subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, check=True).stdout

    assert "--resume" not in run()  # a fresh run
    (runs / "demo" / "checkpoints").mkdir(parents=True)
    ckpt.begin_checkpoint(runs / "demo" / "checkpoints", 5)  # a temp dir of a checkpoint killed mid-write
    assert "--resume" not in run()
    tmp = ckpt.begin_checkpoint(runs / "demo" / "checkpoints", 10)
    (tmp / "state.json").write_text("{}")
    ckpt.finalize_checkpoint(tmp, 10)
    assert run().split()[-1] == "--resume"  # the preempted job's rerun continues it
