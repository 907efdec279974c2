"""The CLI as a user runs it (real subprocesses): user errors are one clear message with exit code 2 and no
traceback; `train --address` joins a running Ray cluster on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def posttrain(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "posttrain"), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    "args, expected",
    [
        (["config", "show", "algorithm.klcoef=1"], "unknown key 'algorithm.klcoef'"),
        (["config", "show", "rollout.num_workers=two"], "rollout.num_workers"),
        (["train", "does-not-exist.yaml"], "config file does-not-exist.yaml does not exist"),
        (["train", "examples/addition-grpo.yaml", "model.path=/nonexistent/model"], "model directory /nonexistent/model does not exist"),
        (["train", "examples/addition-grpo.yaml", "task.name=chess"], "task.name: unknown task 'chess'"),
        (["model", "tiny", "/tmp/x", "--size", "7b"], "--size: unknown size '7b'"),
    ],
)
def test_user_errors_are_one_message_without_traceback(args, expected):
    r = posttrain(*args)
    assert r.returncode == 2, r.stderr
    assert expected in r.stderr.replace("\n", " ")
    assert "Traceback" not in r.stderr + r.stdout


def test_config_show_prints_every_default():
    r = posttrain("config", "show", "examples/addition-grpo.yaml", "algorithm.kl_coef=0.05")
    assert r.returncode == 0, r.stderr
    assert "kl_coef: 0.05" in r.stdout and "max_model_len: 128" in r.stdout and "name: addition-grpo" in r.stdout


def stop_process_group(pgid: int, port: int) -> None:
    """SIGKILL to every process left in the group (`ray start` itself has exited; its GCS, raylet and workers stay),
    and the pointer to the cluster that `ray start` wrote (/tmp/ray/ray_current_cluster), as `ray stop` removes it."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    pointer = Path("/tmp/ray/ray_current_cluster")
    with contextlib.suppress(OSError):
        if pointer.read_text().strip().endswith(f":{port}"):
            pointer.unlink()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_train_joins_a_running_ray_cluster_with_the_hf_engine(tmp_path, warm_model_dir):
    """A head started by `ray start` where a token exists (~/.ray/auth_token: any earlier local ray.init writes
    one), so it runs with token authentication, RAY_AUTH_MODE unset everywhere: the driver joins it as `ray start`
    decided (orchestration/runtime.py use_token_auth_like_ray_start)."""
    port = _free_port()
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(os.urandom(32).hex())
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}, "HOME": str(home),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    # In a process group of its own: the head's processes are stopped by that group, not by `ray stop`, which
    # stops every Ray process on the machine (another test's cluster running beside this one under pytest -n).
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=4", "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    assert head.wait(timeout=120) == 0, head.stderr.read().decode()[-2000:]
    try:
        r = posttrain(
            "train", "examples/addition-grpo.yaml", f"model.path={warm_model_dir}", f"runs_dir={tmp_path}",
            "name=joined", "train.steps=2", "rollout.engine=hf", "algorithm.prompts_per_step=4",
            "task.heldout_size=32", "eval.every=0", "checkpoint.every=0", "--address", f"127.0.0.1:{port}", "--quiet",
            env=env, timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        summary = json.loads((tmp_path / "joined" / "summary.json").read_text())
        assert summary["steps"] == 2
        status = subprocess.run([str(BIN / "ray"), "status", f"--address=127.0.0.1:{port}"], capture_output=True,
                                text=True, env={**env, "RAY_AUTH_MODE": "token"}, timeout=60)
        assert status.returncode == 0  # the cluster outlives the job: we joined it, we did not own it
    finally:
        stop_process_group(head.pid, port)


@pytest.mark.integration
def test_a_user_error_raised_in_an_actor_is_its_message_without_the_remote_traceback(capsys):
    """Ray hands the driver an actor's exception as a RayTaskError made a subclass of it, whose text is the remote
    traceback (the in-loop evaluator's family check reached a user that way); the CLI prints the error itself."""
    import ray
    import typer

    from posttrain.cli.common import user_errors
    from posttrain.config import load_config
    from posttrain.errors import PosttrainError
    from posttrain.orchestration.runtime import start_ray

    @ray.remote
    class Checker:
        def check(self):
            raise PosttrainError("suite addition: row 3 has no 'answer'", hint="add the column")

    @user_errors
    def command():
        ray.get(Checker.remote().check.remote())

    started = not ray.is_initialized()
    start_ray(load_config(None, []).ray, 1)
    try:
        with pytest.raises(typer.Exit) as stopped:
            command()
    finally:
        if started:
            ray.shutdown()
    err = " ".join(capsys.readouterr().err.split())
    assert stopped.value.exit_code == 2
    assert "error: suite addition: row 3 has no 'answer' -> add the column" in err, err
    assert "Traceback" not in err and "File " not in err and "ray::" not in err, err
