"""What every tracking sink does. Sinks get the run's config once (already redacted), each step's numbers, each
checkpoint's path, and are closed with the run's outcome; they never see the driver's objects."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol


class Sink(Protocol):
    name: str

    def log_config(self, config: dict, config_yaml: str) -> None: ...

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_checkpoint(self, step: int, path: str) -> None: ...

    def close(self, failed: bool) -> None: ...


def numeric_metrics(record: Mapping) -> dict[str, float]:
    """The finite numbers of a metrics.jsonl record, without its step (None, NaN and strings are left out)."""
    out = {}
    for k, v in record.items():
        if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out


def flatten(config: Mapping, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values."""
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
