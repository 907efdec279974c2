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
    trial: int = typer.Option(0, "--trial", help="Instead: N real training steps at each learning rate of "
                              "--factors x algorithm.lr (each its own short run), each with its reward slope and 95% "
                              "CI, and the rate to use (posttrain/probe_trial.py). 0 = no trial."),
    factors: str = typer.Option("0.3333,1,3", "--factors", help="With --trial: the multiples of algorithm.lr."),
):
    """Sample K completions for N training prompts and say whether RL has a signal to learn from."""
    from posttrain.config import load_config
    from posttrain.probe import report_text, run_probe

    config, overrides = split_config_args(config, overrides or [])
    cfg = load_config(config, overrides)
    if trial:
        return run_trial_cli(cfg, trial, factors)
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


def run_trial_cli(cfg, steps: int, factors: str) -> None:
    """`probe --trial N`: the arms, one line each, then the verdict line."""
    import time

    from posttrain.probe_trial import recommend, run_trial

    if steps < 3:
        raise PosttrainError(f"--trial {steps}: a slope needs at least 3 steps", hint="e.g. --trial 10")
    try:
        multiples = [float(x) for x in factors.split(",")]
    except ValueError:
        raise PosttrainError(f"--factors {factors!r}: not a comma-separated list of numbers",
                             hint="e.g. --factors 0.3333,1,3") from None
    if not multiples or min(multiples) <= 0:
        raise PosttrainError(f"--factors {factors!r}: each multiple of algorithm.lr must be > 0")
    t0 = time.perf_counter()
    arms = run_trial(cfg, steps, multiples, log=lambda m: console.print(m, highlight=False, soft_wrap=True))
    best, line = recommend(arms)
    console.print(f"verdict: {line} ({len(arms)} runs of {steps} steps, {time.perf_counter() - t0:.0f} s)",
                  highlight=False, soft_wrap=True)
