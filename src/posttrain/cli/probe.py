"""`posttrain probe CONFIG`: will RL work on this task? (posttrain/probe.py)."""

from __future__ import annotations

import typer

from posttrain.cli.common import console, split_config_args
from posttrain.errors import PosttrainError
from posttrain.evals.no_signal import EXIT_NO_SIGNAL  # a no-signal verdict: training would train on nothing


def probe(
    config: str = typer.Argument(None, help="YAML run config (the run's own: engine, template, reward)."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. rollout.max_new_tokens=64"),
    prompts: int = typer.Option(16, "--prompts", help="Training prompts to sample (the first N of the split)."),
    k: int = typer.Option(8, "--k", help="Samples per prompt (K)."),
    no_train_step: bool = typer.Option(False, "--no-train-step", help="Skip the measured policy update (its time "
                                       "and the trainer's peak memory)."),
):
    """Sample K completions for N training prompts and say whether RL has a signal to learn from."""
    from posttrain.config import load_config
    from posttrain.probe import report_text, run_probe

    config, overrides = split_config_args(config, overrides or [])
    cfg = load_config(config, overrides)
    report = run_probe(cfg, prompts, k, log=lambda m: console.print(m, highlight=False, soft_wrap=True),
                       train_step=not no_train_step)
    console.print(report_text(report), highlight=False, soft_wrap=True, markup=False)
    console.print(f"report: {cfg.run_dir / 'probe.html'}", highlight=False)
    if report.verdict.name == "reward-fails":
        raise PosttrainError(f"probe: the reward failed on every one of the {report.prompts * report.k} samples; "
                             f"first failure: {report.failures[0] if report.failures else '?'}",
                             hint="fix the reward function or the dataset's columns it reads, then probe again")
    if report.verdict.name == "no-signal":
        raise typer.Exit(EXIT_NO_SIGNAL)
