"""Where a run's numbers go: `metrics.jsonl` always (jsonl.py), and TensorBoard, MLflow and W&B (offline by
default) when `logging.sinks` names them, one small file per sink. run_log.py fans each step's record out to all
of them; redaction.py keeps secrets out of everything they write."""

from posttrain.tracking.jsonl import MetricsWriter, read_metrics
from posttrain.tracking.run_log import RunLog, open_run_log

__all__ = ["MetricsWriter", "RunLog", "open_run_log", "read_metrics"]
