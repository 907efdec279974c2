"""MLflow: by default a sqlite store in runs/<name>/mlflow.db with artifacts beside it (nothing leaves the machine);
`logging.mlflow_tracking_uri` points it at a server instead. Uses MlflowClient, not the global fluent API, so a
run never depends on process-wide MLflow state. Browse with `mlflow ui --backend-store-uri sqlite:///runs/<name>/mlflow.db`."""

from __future__ import annotations

import time
from pathlib import Path

from posttrain.tracking.sink import flatten

MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limits
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_CHARS = 6000


def default_tracking_uri(run_dir: Path) -> str:
    return f"sqlite:///{(Path(run_dir) / 'mlflow.db').resolve()}"


class MlflowSink:
    name = "mlflow"

    def __init__(self, run_dir: Path, tracking_uri: str | None, experiment: str, run_name: str,
                 resume_run_id: str | None = None):
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri or default_tracking_uri(run_dir)
        self.client = MlflowClient(self.tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            artifacts = (Path(run_dir) / "mlflow-artifacts").resolve().as_uri() if tracking_uri is None else None
            exp_id = self.client.create_experiment(experiment, artifact_location=artifacts)
        else:
            exp_id = exp.experiment_id
        self.resumed = resume_run_id is not None
        if self.resumed:
            self.run_id = resume_run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(exp_id, run_name=run_name, tags={"posttrain.run_dir": str(Path(run_dir).resolve())})
            self.run_id = run.info.run_id

    def log_config(self, config: dict, config_yaml: str) -> None:
        from mlflow.entities import Param

        if not self.resumed:  # params are immutable in MLflow; a resume may change train.steps
            params = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in flatten(config).items()]
            for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS_PER_BATCH])
        self.client.log_text(self.run_id, config_yaml, "config.yaml")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + MAX_METRICS_PER_BATCH])

    def log_checkpoint(self, step: int, path: str) -> None:
        self.client.set_tag(self.run_id, f"checkpoint.step_{step:06d}", path)
        self.client.set_tag(self.run_id, "checkpoint.latest", path)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
