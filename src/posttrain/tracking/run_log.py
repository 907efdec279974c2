"""The driver's one handle on tracking: `write(record)` appends to metrics.jsonl and forwards the record's numbers
to every sink named in `logging.sinks`; `log_checkpoint` records a checkpoint's path; `close` ends every sink with
the run's outcome. A sink that fails mid-run is reported once and dropped: tracking never stops training."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from posttrain.errors import PosttrainError
from posttrain.tracking.jsonl import MetricsWriter
from posttrain.tracking.redaction import redact, secret_env_values
from posttrain.tracking.sink import Sink, numeric_metrics

IDS_FILE = "tracking.json"  # the MLflow / W&B run ids, so a resumed run continues the same tracked run
EXTRA_HINT = "install the tracking extra: pip install -e '.[tracking]'"


class RunLog:
    def __init__(self, jsonl: MetricsWriter, sinks: list[Sink], warn=None):
        self.jsonl = jsonl
        self.sinks = list(sinks)
        self._warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))

    def _each(self, call) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as e:  # noqa: BLE001 - a tracking backend's failure must not end the training run
                self._warn(f"tracking sink {sink.name} failed ({type(e).__name__}: {e}); it is off for the rest of the run")
                self.sinks.remove(sink)

    def log_config(self, config: dict, config_yaml: str) -> None:
        self._each(lambda s: s.log_config(config, config_yaml))

    def write(self, record: dict) -> None:
        self.jsonl.write(record)
        numbers = numeric_metrics(record)
        if numbers:
            self._each(lambda s: s.log_metrics(int(record["step"]), numbers))

    def log_checkpoint(self, step: int, path) -> None:
        if path is not None:
            self._each(lambda s: s.log_checkpoint(step, str(path)))

    def close(self) -> None:
        """Called from the driver's `finally`: an exception in flight marks the tracked run as failed."""
        failed = sys.exc_info()[0] is not None
        self.jsonl.close()
        self._each(lambda s: s.close(failed))
        self.sinks = []


def _read_ids(run_dir: Path) -> dict:
    p = run_dir / IDS_FILE
    return json.loads(p.read_text()) if p.exists() else {}


def open_sinks(cfg, run_dir: Path, config: dict, resume_from_step: int | None) -> list[Sink]:
    """Starts the sinks `cfg.logging.sinks` names (jsonl is always on and is not one of them)."""
    log = cfg.logging
    ids = _read_ids(run_dir) if resume_from_step is not None else {}
    sinks: list[Sink] = []
    try:
        if "tensorboard" in log.sinks:
            from posttrain.tracking.tensorboard_sink import TensorBoardSink

            sinks.append(TensorBoardSink(run_dir / "tensorboard", resume_from_step))
        if "mlflow" in log.sinks:
            from posttrain.tracking.mlflow_sink import MlflowSink

            sinks.append(MlflowSink(run_dir, log.mlflow_tracking_uri, log.mlflow_experiment, cfg.name, ids.get("mlflow_run_id")))
            ids["mlflow_run_id"] = sinks[-1].run_id
        if "wandb" in log.sinks:
            from posttrain.tracking.wandb_sink import WandbSink

            sinks.append(WandbSink(run_dir, log.wandb_mode, log.wandb_project, log.wandb_entity, cfg.name, config,
                                   ids.get("wandb_run_id")))
            ids["wandb_run_id"] = sinks[-1].run_id
    except ImportError as e:
        for s in sinks:
            s.close(failed=True)
        raise PosttrainError(f"logging.sinks: the {e.name} package is not installed", hint=EXTRA_HINT) from None
    if ids:
        (run_dir / IDS_FILE).write_text(json.dumps(ids, indent=1))
    return sinks


def logged_config(cfg) -> dict:
    """The run's config as the sinks get it: secret-named keys, passwords in URLs and secret env values redacted,
    and the webhook URLs of ops.notify too (a Slack webhook URL is itself the credential)."""
    return redact(cfg.to_dict(), secret_env_values(os.environ) + [t.url for t in cfg.ops.notify])


def open_run_log(cfg, run_dir: str | Path, resume_from_step: int | None = None) -> RunLog:
    """metrics.jsonl plus the configured sinks, with the run's config (secrets redacted) already logged."""
    run_dir = Path(run_dir)
    config = logged_config(cfg)
    jsonl = MetricsWriter(run_dir, resume_from_step=resume_from_step)
    run_log = RunLog(jsonl, open_sinks(cfg, run_dir, config, resume_from_step))
    run_log.log_config(config, yaml.safe_dump(config, sort_keys=False))
    return run_log
