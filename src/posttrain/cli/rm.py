"""`posttrain rm ...`: preference pairs and reward-model training.

    posttrain rm pairs cfg.yaml            # built-in pairs (gold-labelled addition completions) -> rm.data
    posttrain rm train cfg.yaml rm.epochs=3
"""

from __future__ import annotations

from typing import Optional

import typer

from posttrain.cli.common import console, split_config_args
from posttrain.config import load_config

def rm_pairs(
    config: Optional[str] = typer.Argument(None, help="YAML run config (default: built-in)."),
    overrides: list[str] = typer.Argument(None),
    out: Optional[str] = typer.Option(None, "--out", help="jsonl to write (default: rm.data)."),
):
    """Write rm.pairs preference pairs over the task's training problems, labelled by its hidden gold function
    with rm.label_noise of the labels swapped."""
    from posttrain.rewards.preferences import gold_pairs, write_jsonl
    from posttrain.tasks import load_task

    config, overrides = split_config_args(config, overrides or [])
    cfg = load_config(config, overrides)
    task = load_task(cfg.task, cfg.seed)
    rows = gold_pairs(task.train, cfg.task.name, cfg.rm.pairs, cfg.rm.label_noise, cfg.seed)
    path = write_jsonl(rows, out or cfg.rm.data)
    flipped = sum(r["flipped"] for r in rows)
    console.print(f"wrote {len(rows)} pairs ({flipped} labels swapped) to {path}")


def rm_train(
    config: Optional[str] = typer.Argument(None, help="YAML run config (default: built-in)."),
    overrides: list[str] = typer.Argument(None),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar (plain lines are printed off a terminal anyway)."),
):
    """Train a Bradley-Terry reward model on rm.data from rm.base; writes rm.out with its reward mean/std."""
    from posttrain.training.rm import train_reward_model

    config, overrides = split_config_args(config, overrides or [])
    cfg = load_config(config, overrides)
    from posttrain.progress import StepProgress

    bar = StepProgress("rm train", 1, enabled=not quiet, fields=("loss",))

    def progress(done: int, total: int, loss: float) -> None:
        if total != bar.total:
            bar.set_total(total)
        bar.update(done, loss=loss)

    try:
        result = train_reward_model(cfg, log=bar.log, progress=progress)
    finally:
        bar.close()
    console.print(f"reward model: held-out pairwise accuracy {result.heldout_accuracy:.3f}, mean margin "
                  f"{result.heldout_margin:.3f} ({result.heldout_pairs} pairs), reward mean {result.reward_mean:.3f} "
                  f"std {result.reward_std:.3f}, {result.wall_seconds:.1f} s; written to {result.out_dir}")
