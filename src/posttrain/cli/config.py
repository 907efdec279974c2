"""`posttrain config show` and `posttrain config reference`: the resolved run config, and every key it has."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from posttrain.cli.common import split_config_args
from posttrain.config import dump_config, load_config


def config_show(
    config: Optional[str] = typer.Argument(None, help="YAML run config (default: built-in)."),
    overrides: list[str] = typer.Argument(None),
):
    """Print the resolved config, defaults filled in."""
    config, overrides = split_config_args(config, overrides or [])
    sys.stdout.write(dump_config(load_config(config, overrides)))


def config_reference():
    """Print every config key with its type, default and meaning (markdown; the README's config reference)."""
    from posttrain.config import config_reference_markdown

    sys.stdout.write(config_reference_markdown() + "\n")
