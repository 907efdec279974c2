"""TensorBoard event files under runs/<name>/tensorboard/ (`tensorboard --logdir runs/<name>/tensorboard`)."""

from __future__ import annotations

from pathlib import Path


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, log_dir: Path, resume_from_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        # purge_step: on resume, events after the checkpoint's step are hidden; the resumed run rewrites them.
        purge = resume_from_step + 1 if resume_from_step is not None else None
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge, flush_secs=10)

    def log_config(self, config: dict, config_yaml: str) -> None:
        # Markdown: an indented block keeps the YAML readable in TensorBoard's text tab.
        self._writer.add_text("config", "\n".join("    " + line for line in config_yaml.splitlines()), 0)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def log_checkpoint(self, step: int, path: str) -> None:
        self._writer.add_text("checkpoint", path, step)
        self._writer.flush()

    def close(self, failed: bool) -> None:
        self._writer.close()
