"""What every `posttrain` command module shares: the consoles, the user-error wrapper (one message, exit code 2,
no traceback), config-argument splitting and the run-summary table. Command modules import this, never the
package's __init__ (which imports them to register their commands)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from posttrain.errors import PosttrainError, user_message

console = Console()
err_console = Console(stderr=True)

EXIT_USER_ERROR = 2


def user_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PosttrainError as e:
            err_console.print(f"[bold red]error:[/] {user_message(e)}", highlight=False, soft_wrap=True)  # paths stay whole for copy-paste
            raise typer.Exit(EXIT_USER_ERROR)

    return wrapper


def split_config_args(config: Optional[str], overrides: list[str]) -> tuple[Optional[str], list[str]]:
    """Lets the config path be omitted: `posttrain demo a.b=1` treats a.b=1 as an override."""
    if config is not None and "=" in config and not Path(config).exists():
        return None, [config, *overrides]
    return config, overrides


def print_summary(summary: dict) -> None:
    table = Table(title=f"run {summary.get('name')}")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.2e}" if v and abs(v) < 1e-2 else f"{v:.3f}"
        return str(v)

    for key in ("steps", "heldout_accuracy_before", "heldout_accuracy_after", "mean_step_seconds", "logprob_gap_mean",
                "train_wall_seconds", "wall_seconds", "sft_steps", "sft_seconds"):
        if summary.get(key) is not None:
            table.add_row(key, fmt(summary[key]))
    for k, v in (summary.get("step_time_split") or {}).items():
        table.add_row(f"step time: {k}", f"{100 * v:.1f}%")
    if summary.get("final_checkpoint"):
        table.add_row("final checkpoint", summary["final_checkpoint"])
    console.print(table)
