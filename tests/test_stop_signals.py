"""Stopping `posttrain train` the way clusters and people stop it, each a real subprocess run in its own session
(like a Slurm job step or a container) with its own embedded Ray cluster:

- SIGTERM to the run's process group (scancel, a preempted job step): the Ray processes live in a session of
  their own, so only the driver gets it; it checkpoints within checkpoint.grace_seconds and exits 75;
- SIGTERM to every process of the run at once (a cgroup kill): the trainer is gone too; exit 75 within seconds,
  naming the newest valid checkpoint, with no worker restart and no 60 s wait for the GCS;
- Ctrl-C (SIGINT to the foreground group): checkpoint at the step boundary, exit 130 (a second Ctrl-C, which
  stops at once, is tests/test_preemption.py's: here a step is too short to land one inside it);
- SIGKILL of the driver alone: its GCS and raylet die with it (Ray's fate-sharing survives the new session).

The stages share one run, in file order: each stage resumes from where the one before stopped, so a run is
started five times, not nine. The last resume ends the run: samples.jsonl holds every sample id of every step
exactly once, across all the stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from test_reliability_driver import _finish, _start, _wait_for_step, _write_config
from sample_ids import lost_and_duplicated  # every sample id exactly once

from posttrain.config import load_config
from posttrain.preemption import EXIT_INTERRUPTED, EXIT_PREEMPTED
from posttrain.rollout.sampler import PromptSampler
from posttrain.tasks import load_task
from posttrain import checkpoint as ckpt
from posttrain.tracking import read_metrics

pytestmark = pytest.mark.integration

STEPS, PROMPTS, GROUP, GRACE = 10, 4, 4, 30


class Run:
    """One run (config, run dir) that every stage stops in its own way and the next stage resumes."""

    def __init__(self, config: Path, run_dir: Path):
        self.config, self.run_dir = config, run_dir
        self.started = False

    @property
    def resume_command(self) -> str:
        return f"posttrain train {(self.run_dir / 'config.yaml').resolve()} --resume"

    def start_and_wait_for_a_new_step(self) -> tuple[subprocess.Popen, str]:
        """Starts the run (resumed after the first time) and waits until it has trained one step more than the
        newest checkpoint; returns the process and the checkpoint it resumed from (or "")."""
        newest = ckpt.latest_valid_checkpoint(self.root, warn=lambda _: None)
        started = time.time()
        proc = _start(self.config, *(["--resume"] if self.started else []))
        self.started = True
        if newest is None:
            _wait_for_step(self.run_dir, proc, 2)
        else:  # metrics.jsonl holds the steps the last stop lost until this run drops them: wait for a new one
            self._wait_for_new_step(proc, int(newest.name[len(ckpt.PREFIX):]) + 1, started)
        return proc, str(newest or "")

    def _wait_for_new_step(self, proc: subprocess.Popen, step: int, since: float, timeout: float = 300) -> None:
        metrics, deadline = self.run_dir / "metrics.jsonl", time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"run ended before step {step}: {_finish(proc)[1][-3000:]}"
            written = metrics.stat().st_mtime  # before the read: a new mtime means the old lines are dropped
            if written > since and self.steps_done() >= step:
                return
            time.sleep(0.05)
        raise TimeoutError(f"no new step {step} in {self.run_dir}")

    @property
    def root(self) -> Path:
        return self.run_dir / "checkpoints"

    def steps_done(self) -> int:
        try:
            return max((m["step"] for m in read_metrics(self.run_dir) if "time/step" in m), default=0)
        except json.JSONDecodeError:
            return 0  # a line being written


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir) -> Run:
    tmp = tmp_path_factory.mktemp("stops")
    # checkpoint.every=0: every checkpoint is one a stop wrote
    # The random tiny model earns no verifier reward: the run trains on nothing on purpose (what is tested is how
    # it stops), so the zero-signal alarm, which would stop it at step 5, is off.
    config = _write_config(tmp, tiny_model_dir, "stopped", {"train": {"steps": STEPS},
                                                            "alarms": {"no_signal_steps": 0}}, every=0,
                           grace_seconds=GRACE)
    return Run(config, tmp / "stopped")


def _family(proc: subprocess.Popen) -> list[psutil.Process]:
    return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]


def _ray_heads(family: list[psutil.Process]) -> list[psutil.Process]:
    """The GCS and raylet of the run's cluster among these processes, those still running."""
    out = []
    for p in family:
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any(n in " ".join(p.cmdline()) for n in ("gcs_server", "raylet")):
                out.append(p)
        except psutil.Error:
            pass
    return out


def _kill_leftovers(family: list[psutil.Process]) -> None:
    for p in family:
        try:
            p.kill()
        except psutil.Error:
            pass


def _assert_stop_message(run: Run, log: str, checkpoint: Path, resumed_from: str) -> None:
    """One message, no traceback: it names a valid checkpoint, the newest, and the command that continues (and
    the run had resumed from the checkpoint the stage before left)."""
    assert "Traceback" not in log, log[-3000:]
    flat = " ".join(log.split())  # the console wraps long lines
    assert not resumed_from or f"resuming from {resumed_from}" in flat, flat[:2000]
    assert str(checkpoint) in flat and f"continue with `{run.resume_command}`" in flat, flat[-2000:]
    ckpt.verify_checkpoint(checkpoint)
    assert ckpt.latest_valid_checkpoint(run.root) == checkpoint


def _new_checkpoint(run: Run, before: str) -> Path:
    newest = ckpt.latest_valid_checkpoint(run.root)
    assert newest is not None and str(newest) != before, f"no checkpoint written after {before or 'the start'}"
    return newest


def test_sigterm_to_the_process_group_checkpoints_and_exits_75(run):
    proc, before = run.start_and_wait_for_a_new_step()
    family = _family(proc)
    heads = _ray_heads(family)
    assert len(heads) == 2 and all(os.getsid(p.pid) != os.getsid(proc.pid) for p in heads), \
        "the GCS and raylet must run in a session of their own"
    sent = time.time()
    os.killpg(proc.pid, signal.SIGTERM)  # what scancel does: the driver and everything in its group
    code, log = _finish(proc, timeout=120)
    exited = time.time() - sent
    _kill_leftovers(family)
    assert code == EXIT_PREEMPTED, log[-3000:]
    newest = _new_checkpoint(run, before)
    _assert_stop_message(run, log, newest, before)
    assert "died" not in log, log[-3000:]  # no worker was lost: the cluster never saw the signal
    written = (newest / "manifest.json").stat().st_mtime - sent
    print(f"group SIGTERM after step {run.steps_done()}: checkpoint {newest.name} after {written:.2f} s, "
          f"exit after {exited:.2f} s")
    assert written < GRACE


def test_sigterm_to_every_process_at_once_exits_75_at_once_naming_the_newest_checkpoint(run):
    proc, before = run.start_and_wait_for_a_new_step()
    family = _family(proc)
    sent = time.time()
    for p in family:  # a cgroup kill: every process of the run, in one go
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    code, log = _finish(proc, timeout=120)
    exited = time.time() - sent
    heads_left = [f"{p.pid} {p.name()}" for p in _ray_heads(family)]  # named now: killed below
    _kill_leftovers(family)
    assert code == EXIT_PREEMPTED, log[-3000:]
    # Either the step ended and the checkpoint was written before the trainer went, or (usually) it was not
    # and the message names the newest one there is: both are the newest valid checkpoint now.
    newest = ckpt.latest_valid_checkpoint(run.root)
    _assert_stop_message(run, log, newest, before)
    assert "waiting for its restart" not in log and "roles lost" not in log, log[-3000:]
    print(f"SIGTERM to all {len(family)} processes after step {run.steps_done()}: exit {code} after {exited:.2f} s; "
          f"newest checkpoint {newest.name} (before: {Path(before).name})")
    assert exited < 20, f"exit took {exited:.1f} s"  # not Ray's 60 s GCS reconnect
    assert heads_left == []


def test_ctrl_c_checkpoints_at_the_step_boundary_and_exits_130(run):
    proc, before = run.start_and_wait_for_a_new_step()
    family = _family(proc)
    done = run.steps_done()
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground process group
    code, log = _finish(proc, timeout=120)
    _kill_leftovers(family)
    assert code == EXIT_INTERRUPTED, log[-3000:]
    newest = _new_checkpoint(run, before)
    _assert_stop_message(run, log, newest, before)
    assert "Ctrl-C: stopping after this step with a checkpoint" in log, log[-3000:]
    assert int(newest.name[len(ckpt.PREFIX):]) > done  # the step in progress was let finish
    print(f"Ctrl-C after step {done}: checkpoint {newest.name}, exit {code}")


def test_sigkill_of_the_driver_takes_its_ray_cluster_with_it(run):
    """The Ray processes left the driver's session, not its fate: PR_SET_PDEATHSIG still kills them."""
    proc, _ = run.start_and_wait_for_a_new_step()
    family = _family(proc)
    assert len(_ray_heads(family)) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 10
    while _ray_heads(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    heads_left = [f"{p.pid} {p.name()}" for p in _ray_heads(family)]  # named now: killed below
    _kill_leftovers(family)  # the dashboard/runtime-env agents take up to a minute to notice (as before)
    assert heads_left == []


def test_the_resumed_run_ends_with_every_sample_exactly_once(run):
    proc = _start(run.config, "--resume")
    code, log = _finish(proc, timeout=300)
    assert code == 0, log[-3000:]
    assert "resuming from" in log
    cfg = load_config(str(run.run_dir / "config.yaml"))
    sampler = PromptSampler(load_task(cfg.task, cfg.seed).train, cfg.seed)
    lines = [json.loads(line) for line in (run.run_dir / "samples.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in lines] == list(range(1, STEPS + 1))
    assert lost_and_duplicated(lines, sampler, PROMPTS, GROUP) == (0, 0)
