"""`posttrain train`, `posttrain sft` and `posttrain demo`: a run, its supervised warm start, and the built-in demo."""

from __future__ import annotations

from typing import Optional

import typer

from posttrain.cli.common import console, err_console, print_summary, split_config_args
from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.evals.no_signal import EXIT_NO_SIGNAL, NoLearningSignal
from posttrain.evals.progress import EXIT_NO_PROGRESS, NoProgress
from posttrain.orchestration.reform import EXIT_CAPACITY, CapacityLost
from posttrain.preemption import Preempted, StoppedWithoutCheckpoint


def train(
    config: str = typer.Argument(..., help="YAML run config."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. algorithm.kl_coef=0.02"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest valid checkpoint of the run."),
    allow_data_change: bool = typer.Option(
        False, "--allow-data-change", help="With --resume: go on although the training data differ from the "
        "checkpoint's (same data cursor over the new data; recorded as data_changes in state.json and summary.json)."),
    address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster instead of starting one."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
):
    """Train a policy with the configured algorithm (rollout on vLLM engines, roles as Ray actors; dpo: offline)."""
    from posttrain.loop import train as run_train

    if allow_data_change and not resume:
        raise PosttrainError("--allow-data-change applies only to a resume",
                             hint="add --resume to continue the run on changed data, or drop --allow-data-change")
    extra = [f"ray.address={address}"] if address else []
    cfg = load_config(config, (overrides or []) + extra)
    if cfg.algorithm.name == "dpo":  # offline: no Ray, no rollout
        from posttrain.cli.dpo import run as run_dpo

        return print_summary(run_dpo(cfg, quiet))
    if cfg.ray.address is None:  # the roles start on this machine: a dtype its CPU lacks is refused before Ray starts
        from posttrain.models.dtype import weights_dtype

        weights_dtype(cfg.model.dtype)
    try:
        summary = run_train(cfg, resume=resume, progress=not quiet, allow_data_change=allow_data_change)
    except (Preempted, StoppedWithoutCheckpoint) as e:  # SIGTERM: 75, Ctrl-C: 130 (preemption.py)
        err_console.print(str(e), highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except CapacityLost as e:
        err_console.print(f"[bold red]capacity lost:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CAPACITY) from None
    except NoLearningSignal as e:
        err_console.print(f"[bold red]no learning signal:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_NO_SIGNAL) from None
    except NoProgress as e:
        err_console.print(f"[bold red]not learning:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_NO_PROGRESS) from None
    print_summary(summary)


def sft(
    config: Optional[str] = typer.Argument(None, help="YAML run config (default: built-in)."),
    overrides: list[str] = typer.Argument(None),
    base: Optional[str] = typer.Option(None, "--base", help="Model dir to start from (default: a new tiny model)."),
    out: Optional[str] = typer.Option(None, "--out", help="Where to write the SFT model (default: sft.out)."),
    quiet: bool = typer.Option(False, "--quiet"),
):
    """Supervised warm start on the task's training split, stopping at a held-out accuracy target."""
    from posttrain.demo import run_sft_with_progress
    from posttrain.models.tiny import build_tiny_model

    config, overrides = split_config_args(config, overrides or [])
    cfg = load_config(config, overrides)
    if base is None:
        base = str(build_tiny_model(cfg.run_dir / "base-model", "1m", seed=cfg.seed))
    result = run_sft_with_progress(cfg, base, out or cfg.sft.out, progress=not quiet)
    console.print(f"SFT: {result.steps} steps in {result.wall_seconds:.1f} s, held-out accuracy "
                  f"{result.heldout_accuracy:.3f}; model written to {result.out_dir}")


def demo(
    overrides: list[str] = typer.Argument(None, help="Dotted overrides of the demo's config (the built-in defaults; "
                                          "with --task tools, posttrain.demo_tools.DEMO_TOOLS_CONFIG)."),
    quiet: bool = typer.Option(False, "--quiet"),
    task: str = typer.Option("addition", "--task", help="addition: the addition demo; tools: RL teaches the tiny "
                             "model to call a calculator (multi-turn episodes, runs/demo-tools/)."),
):
    """Tiny model -> SFT warm start -> GRPO on the built-in addition task (or, with --task tools, on arithmetic
    solved with a calculator tool). Writes runs/demo/summary.json (runs/demo-tools/summary.json)."""
    log = lambda m: err_console.print(m, highlight=False)  # noqa: E731
    if task == "tools":
        from posttrain.demo_tools import demo_tools_config, run_tools_demo

        cfg = demo_tools_config(overrides or [])
        summary = run_tools_demo(cfg, progress=not quiet, log=log)
    elif task == "addition":
        from posttrain.demo import run_demo

        cfg = load_config(None, overrides or [])
        summary = run_demo(cfg, progress=not quiet, log=log)
    else:
        raise PosttrainError(f"--task: unknown demo {task!r}", hint="use addition or tools")
    print_summary(summary)
    console.print(f"summary: {cfg.run_dir / 'summary.json'}")
