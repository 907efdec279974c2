"""`posttrain dpo`: offline DPO from a jsonl of preference pairs (training/dpo.py)."""

from __future__ import annotations

from typing import Optional

import typer


def dpo(
    config: Optional[str] = typer.Argument(None, help="YAML run config (default: built-in)."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. dpo.pairs=pairs.jsonl"),
    quiet: bool = typer.Option(False, "--quiet"),
):
    """Offline DPO from preference pairs (dpo.pairs: jsonl of prompt, chosen, rejected) starting at model.path."""
    from posttrain.cli.common import console, print_summary, split_config_args
    from posttrain.config import load_config

    config, overrides = split_config_args(config, overrides or [])
    cfg = load_config(config, ["algorithm.name=dpo", *overrides])
    print_summary(run(cfg, quiet))
    console.print(f"summary: {cfg.run_dir / 'summary.json'}")


def run(cfg, quiet: bool = False) -> dict:
    from posttrain.cli.common import err_console
    from posttrain.training.dpo import run_dpo

    return run_dpo(cfg, log=(lambda m: None) if quiet else (lambda m: err_console.print(m, highlight=False)))
