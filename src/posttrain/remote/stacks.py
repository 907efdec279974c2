"""Python stacks of every role's process and of the driver, written to disk when a call hangs (watchdog.py).

A hung actor cannot answer a method call (its calls queue behind the stuck one), so its stacks are read from
outside: `py-spy dump --pid PID`, run by a zero-CPU Ray task pinned to the actor's node (a pid means nothing on
another machine), time-limited. Each role says where its process is through `ActorProcess.process()`; the watchdog
asks every role when it starts and again after a restart, and keeps the answers for when one cannot answer.

Layout: runs/<name>/hangs/<step>/<role>-<pid>.txt (py-spy's output, or why there is none), driver-<pid>.txt (the
driver's threads) and index.json (which call hung and the files)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

PY_SPY_TIMEOUT_S = 20.0   # one py-spy dump; a process with thousands of threads takes a few seconds
TASK_START_S = 30.0       # on top: Ray starting a worker process for the dump task on a loaded node
ASK_TIMEOUT_S = 3.0       # an idle actor answers process() in milliseconds; a busy one not at all


class ActorProcess:
    """Mixed into every role class: where this actor's process is, for the stacks dump."""

    def process(self) -> dict:
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}


def ask_processes(actors: dict, timeout_s: float = ASK_TIMEOUT_S) -> dict[str, dict]:
    """role -> {"pid", "node_id"} of every actor that answers within timeout_s (a hung or busy one does not)."""
    import ray

    if not actors:
        return {}
    refs = {role: actor.process.remote() for role, actor in actors.items()}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    out = {}
    for role, ref in refs.items():
        if ref in ready:
            try:
                out[role] = ray.get(ref)
            except Exception:  # noqa: BLE001 - a dead actor has no stacks to show
                pass
    return out


def py_spy_dump(pid: int, timeout_s: float = PY_SPY_TIMEOUT_S) -> str:
    """py-spy's dump of process `pid` on this machine, or the reason there is none."""
    beside = Path(sys.executable).with_name("py-spy")  # the venv's, when Ray workers run its python
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        return f"py-spy not found (next to {sys.executable} or on PATH): install it with `pip install py-spy`\n"
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"py-spy dump --pid {pid} ran longer than {timeout_s:g} s and was stopped\n"
    if done.returncode != 0:
        return f"py-spy dump --pid {pid} failed (exit code {done.returncode}):\n{done.stderr}{done.stdout}"
    return done.stdout


def driver_stacks() -> str:
    """Every thread of this (the driver's) process, as Python prints a traceback."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = [f"driver pid {os.getpid()}\n"]
    for ident, frame in sys._current_frames().items():
        parts.append(f"\nThread {ident} ({names.get(ident, '?')}):\n" + "".join(traceback.format_stack(frame)))
    return "".join(parts)


def new_hang_dir(run_dir: Path, step: int) -> Path:
    """runs/<name>/hangs/<step>/, or <step>-2/, <step>-3/ ... for a second hang in the same step (never reused)."""
    root = Path(run_dir) / "hangs"
    root.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        d = root / (str(step) if n == 1 else f"{step}-{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            n += 1


def dump_stacks(out_dir: Path, processes: dict[str, dict], index: dict) -> dict[str, str]:
    """Writes <role>-<pid>.txt for every role in `processes` (role -> {"pid", "node_id"}), driver-<pid>.txt and
    index.json (`index` plus the files) into out_dir; returns role -> file name. Takes at most
    PY_SPY_TIMEOUT_S + TASK_START_S seconds: a node that does not answer gets a file saying so."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    dump = ray.remote(num_cpus=0, max_retries=0)(py_spy_dump)
    refs = {role: dump.options(scheduling_strategy=NodeAffinitySchedulingStrategy(p["node_id"], soft=False))
            .remote(p["pid"]) for role, p in processes.items()}
    limit = PY_SPY_TIMEOUT_S + TASK_START_S
    ready = ray.wait(list(refs.values()), num_returns=len(refs), timeout=limit)[0] if refs else []
    files = {}
    for role, ref in refs.items():
        p = processes[role]
        try:
            text = ray.get(ref) if ref in ready else (
                f"no answer within {limit:g} s from the dump task on node {p['node_id']}\n")
        except Exception as e:  # noqa: BLE001 - the node may be gone; say so in the file
            text = f"the dump task on node {p['node_id']} failed: {type(e).__name__}: {e}\n"
        files[role] = f"{role}-{p['pid']}.txt"
        (out_dir / files[role]).write_text(f"role {role}, pid {p['pid']}, node {p['node_id']}\n\n{text}")
    for ref in refs.values():
        if ref not in ready:
            ray.cancel(ref, force=True)
    driver = f"driver-{os.getpid()}.txt"
    (out_dir / driver).write_text(driver_stacks())
    record = {**index, "time": round(time.time(), 3), "files": files, "driver": driver,
              "processes": {role: {"pid": p["pid"], "node_id": p["node_id"]} for role, p in processes.items()}}
    (out_dir / "index.json").write_text(json.dumps(record, indent=1, default=str))
    return files
