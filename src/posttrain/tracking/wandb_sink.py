"""Weights & Biases, offline by default: the run is written under runs/<name>/wandb/offline-run-*/ and nothing
leaves the machine until the user runs `wandb sync` (or sets logging.wandb_mode=online)."""

from __future__ import annotations

from pathlib import Path


class WandbSink:
    name = "wandb"

    def __init__(self, run_dir: Path, mode: str, project: str, entity: str | None, run_name: str,
                 config: dict, resume_run_id: str | None = None):
        import wandb

        settings = wandb.Settings(console="off", silent=True, save_code=False, disable_git=True)
        self.run = wandb.init(
            mode=mode, dir=str(Path(run_dir).resolve()), project=project, entity=entity, name=run_name, config=config,
            id=resume_run_id, resume="allow" if resume_run_id else None, reinit="create_new", settings=settings,
        )
        self.run_id = self.run.id

    def log_config(self, config: dict, config_yaml: str) -> None:
        pass  # given to wandb.init: W&B records the config as the run starts

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_checkpoint(self, step: int, path: str) -> None:
        self.run.summary[f"checkpoint/step_{step:06d}"] = path
        self.run.summary["checkpoint/latest"] = path

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)
