"""The `posttrain` command line. Every user-facing error is one message without a traceback (exit code 2).

The command modules of this package define plain functions; this is the one place that registers them, each behind
the user-error handler (common.user_errors): the top-level commands in COMMANDS, the command groups in GROUPS, in
the order `posttrain --help` lists them. The command modules keep their heavy imports inside the functions, so
`posttrain --help` stays fast.
"""

from __future__ import annotations

from typing import Callable

import typer

from posttrain.cli import config, dpo, eval, export, model, probe, review, rm, run, serve, topology, verifiers, view
from posttrain.cli.common import user_errors

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RL post-training of language models.")

COMMANDS: list[tuple[str, Callable]] = [
    ("train", run.train),
    ("sft", run.sft),
    ("demo", run.demo),
    ("view", view.view),
    ("plan", topology.plan),
    ("cost", topology.cost),
    ("launch", topology.launch),
    ("dpo", dpo.dpo),
    ("eval", eval.eval_cmd),
    ("compare", eval.compare_cmd),
    ("export", export.export),
    ("probe", probe.probe),
    ("serve", serve.serve),
]

GROUPS: list[tuple[str, str, list[tuple[str, Callable]]]] = [  # (name, help, its commands)
    ("config", "Inspect run configs.", [
        ("show", config.config_show),
        ("reference", config.config_reference),
    ]),
    ("model", "Build model directories.", [
        ("tiny", model.model_tiny),
        ("import", model.model_import),
    ]),
    ("rm", "Reward models: preference pairs and Bradley-Terry training.", [
        ("pairs", rm.rm_pairs),
        ("train", rm.rm_train),
    ]),
    ("review", "Blind pairwise review of checkpoints by people: sessions, the review page, results and exports.", [
        ("new", review.new),
        ("results", review.results),
        ("export", review.export),
        ("export-flags", review.export_flags_cmd),
        ("serve", review.serve),
    ]),
    ("verifiers", "Environments of the verifiers library: a taskset as data, its rubric as a reward.", [
        ("export", verifiers.export_cmd),
    ]),
]


def command(target: typer.Typer, name: str, fn: Callable) -> None:
    """Register `fn` as the command `name` of `target`, behind the user-error handler."""
    target.command(name)(user_errors(fn))


@app.callback()
def _setup() -> None:
    """posttrain: RL post-training of language models on Ray, with vLLM rollout."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no per-load/save bars under ours
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


for _name, _fn in COMMANDS:
    command(app, _name, _fn)
for _name, _help, _commands in GROUPS:
    _group = typer.Typer(no_args_is_help=True, help=_help)
    for _sub, _fn in _commands:
        command(_group, _sub, _fn)
    app.add_typer(_group, name=_name)


def main() -> None:  # pragma: no cover
    app()
