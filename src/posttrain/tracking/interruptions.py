"""What went wrong during a run and what the run did about it, one JSON line per interruption in
runs/<name>/interruptions.jsonl: hangs (ops.watchdog), lost nodes and workers, roles re-formed from a checkpoint,
preemptions and exits for want of capacity. Written by the driver as it recovers; read by `posttrain cost` (the
on-call line: recovered device-hours, human interventions avoided) and `posttrain view`.

A record: {"kind", "step", "role", "time" (unix seconds at detection), "recovery_s" (detection until the work went
on again), "redone_steps" (steps trained again from a checkpoint), "redone_s" (their wall time), "action" (what the
run did, one line), "automatic" (no person was needed), ...extra fields}."""

from __future__ import annotations

import json
import time
from pathlib import Path

FILE = "interruptions.jsonl"
KINDS = {
    "hang": "a remote call ran far past its recent median; the actor was restarted and its work redone",
    "worker_lost": "a rollout worker's process or node died; its share was redone on the fleet",
    "node_lost": "a Ray node left the cluster",
    "node_added": "a Ray node joined the cluster (capacity back)",
    "roles_reformed": "roles lost (trainer rank, node): re-created and resumed from the last checkpoint in process",
    "capacity_exit": "the cluster could not hold the plan any more: exit 76, resume by hand once capacity is back",
    "preempted": "SIGTERM: checkpoint written, exit 75, resumed by whoever restarts the job",
}


def record_interruption(run_dir: str | Path, kind: str, *, step: int, role: str, action: str,
                        recovery_s: float = 0.0, redone_steps: int = 0, redone_s: float = 0.0,
                        automatic: bool = True, detected_at: float | None = None, **extra) -> dict:
    """Appends one record to runs/<name>/interruptions.jsonl and returns it."""
    if kind not in KINDS:
        raise ValueError(f"unknown interruption kind {kind!r}; one of {', '.join(KINDS)}")
    record = {"kind": kind, "step": step, "role": role, "time": round(detected_at or time.time(), 3),
              "recovery_s": round(float(recovery_s), 3), "redone_steps": int(redone_steps),
              "redone_s": round(float(redone_s), 3), "action": action, "automatic": automatic, **extra}
    path = Path(run_dir) / FILE
    with path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")
    return record


def read_interruptions(run_dir: str | Path) -> list[dict]:
    """Every record of a run, oldest first; [] when nothing was interrupted. A torn last line (the driver killed
    mid-write) is skipped."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
