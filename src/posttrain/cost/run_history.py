"""Reads what `posttrain cost --runs` measures from run directories: each run's interruptions.jsonl (checked record
by record; a bad line is skipped with a warning naming the file and line), and its devices and device-hours from
config.yaml and metrics.jsonl (the run summary's accounting). The math is in oncall.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

from posttrain.cost.oncall import MeasuredRun
from posttrain.errors import PosttrainError
from posttrain.tracking.interruptions import FILE, KINDS

NUMBERS = ("time", "recovery_s", "redone_s")


def _jsonl_objects(path: Path, warn: Callable[[str], None]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every line of `path` that is a JSON object; any other non-blank line is skipped
    with a warning (a run killed mid-write leaves a torn last line)."""
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            warn(f"{path}: line {i} is not valid JSON ({e.msg}); skipped")
            continue
        if not isinstance(obj, dict):
            warn(f"{path}: line {i} is not a JSON object; skipped")
            continue
        yield i, obj


def interruption_problem(record: dict) -> str | None:
    """Why a record cannot be counted, or None when it can."""
    if record.get("kind") not in KINDS:
        return f"kind {record.get('kind')!r} is not one of {', '.join(KINDS)}"
    bad = [k for k in NUMBERS if not isinstance(record.get(k), (int, float)) or isinstance(record.get(k), bool)
           or record[k] < 0]
    if bad:
        return f"{', '.join(bad)} must be numbers >= 0"
    if not isinstance(record.get("automatic"), bool):
        return f"automatic={record.get('automatic')!r} must be true or false"
    return None


def read_measured_run(run_dir: str | Path, warn: Callable[[str], None]) -> MeasuredRun:
    """PosttrainError when `run_dir` is not a run directory (no config.yaml in it)."""
    from posttrain.config import load_config
    from posttrain.cost.run_accounting import accounting_for_run

    d = Path(run_dir)
    if not (d / "config.yaml").is_file():
        raise PosttrainError(f"--runs {d}: not a run directory (no config.yaml in it)",
                             hint="point --runs at runs/<name>, the directory `posttrain train` wrote")
    cfg = load_config(d / "config.yaml")
    metrics = d / "metrics.jsonl"
    if not metrics.is_file():
        warn(f"{metrics} does not exist: the run has no measured device-hours")
    acc = accounting_for_run(cfg, [r for _, r in _jsonl_objects(metrics, warn)] if metrics.is_file() else [])
    records = []
    path = d / FILE
    for i, r in _jsonl_objects(path, warn) if path.is_file() else ():
        problem = interruption_problem(r)
        if problem:
            warn(f"{path}: line {i}: {problem}; skipped")
        else:
            records.append(r)
    return MeasuredRun(str(d), sum(role["devices"] for role in acc["roles"].values()), acc["device_seconds"] / 3600,
                       records, path.is_file())


def read_measured_runs(run_dirs: list[str], warn: Callable[[str], None]) -> list[MeasuredRun]:
    runs = [read_measured_run(d, warn) for d in run_dirs]
    if not sum(r.device_hours for r in runs):
        raise PosttrainError(f"--runs {', '.join(run_dirs)}: no step times in metrics.jsonl, so no device-hours to "
                             "measure an interruption rate against",
                             hint="give runs that trained at least one step")
    return runs
