"""`posttrain verifiers export --python PY --taskset ID --out DIR`: a verifiers taskset as a posttrain dataset and
its rubric as a reward function (rewards/verifiers_taskset.py, docs/verifiers.md)."""

from __future__ import annotations

from typing import Optional

import typer


def export_cmd(
    taskset: str = typer.Option(..., "--taskset", help="The taskset's id: an importable module whose __all__ "
                                "exports one verifiers Taskset (an Environments Hub package's name, or your file's)."),
    out: str = typer.Option(..., "--out", help="Directory for train.jsonl and verifiers_reward.py."),
    python: str = typer.Option(".venv-verifiers/bin/python", "--python",
                               help="The Python of the virtual environment that has verifiers installed."),
    path: Optional[str] = typer.Option(None, "--path", help="A directory to import the taskset from."),
):
    """Export a verifiers taskset's tasks as data and its rubric as a reward function."""
    from posttrain.cli.common import console
    from posttrain.rewards.verifiers_taskset import export_taskset

    console.print(export_taskset(python, taskset, out, path), highlight=False, soft_wrap=True)
