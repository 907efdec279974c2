"""Where step metrics go: `runs/<name>/metrics.jsonl` always (one JSON object per line, flushed every step);
the same writer keeps `samples.jsonl` (every sample's id, completion and reward, one line per step)."""

from __future__ import annotations

import json
import math
from pathlib import Path


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _step_of(line: str) -> float:
    """The step of a jsonl line; a blank line or one cut short by a killed writer sorts after every step."""
    try:
        return json.loads(line).get("step", 0)
    except (json.JSONDecodeError, AttributeError):
        return float("inf")


class MetricsWriter:
    def __init__(self, run_dir: Path, resume_from_step: int | None = None, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        if resume_from_step is not None and self.path.exists():
            # Drop lines of steps after the checkpoint we resume from: they will be recomputed.
            kept = [l for l in self.path.read_text().splitlines() if _step_of(l) <= resume_from_step]
            self.path.write_text("".join(l + "\n" for l in kept))
        self._fh = open(self.path, "a")

    def write(self, record: dict) -> None:
        self._fh.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
