"""The `posttrain` command line. Every user-facing error is one message without a traceback (exit code 2)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posttrain.cli_common import console, err_console, print_summary, split_config_args, user_errors
from posttrain.config import dump_config, load_config
from posttrain.errors import PosttrainError
from posttrain.evals.no_signal import EXIT_NO_SIGNAL, NoLearningSignal
from posttrain.orchestration.reform import EXIT_CAPACITY, CapacityLost
from posttrain.preemption import Preempted, StoppedWithoutCheckpoint

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RL post-training of language models.")
config_app = typer.Typer(no_args_is_help=True, help="Inspect run configs.")
model_app = typer.Typer(no_args_is_help=True, help="Build model directories.")
app.add_typer(config_app, name="config")
app.add_typer(model_app, name="model")


@app.callback()
def _setup() -> None:
    """posttrain: RL post-training of language models on Ray, with vLLM rollout."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no per-load/save bars under ours
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@app.command()
@user_errors
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
        from posttrain.cli_dpo import run as run_dpo

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
    print_summary(summary)


@app.command()
@user_errors
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


@app.command()
@user_errors
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


@config_app.command("show")
@user_errors
def config_show(
    config: Optional[str] = typer.Argument(None, help="YAML run config (default: built-in)."),
    overrides: list[str] = typer.Argument(None),
):
    """Print the resolved config, defaults filled in."""
    config, overrides = split_config_args(config, overrides or [])
    sys.stdout.write(dump_config(load_config(config, overrides)))


@config_app.command("reference")
def config_reference():
    """Print every config key with its type, default and meaning (markdown; the README's config reference)."""
    from posttrain.config import config_reference_markdown

    sys.stdout.write(config_reference_markdown() + "\n")


@model_app.command("tiny")
@user_errors
def model_tiny(
    out: str = typer.Argument(..., help="Directory to write."),
    size: str = typer.Option("1m", help="1m | 4m | 80m"),
    arch: str = typer.Option("qwen2", help="qwen2 | llama"),
    tied: bool = typer.Option(False, "--tied", help="Tie input and output embeddings."),
    seed: int = typer.Option(0),
    bpe: int = typer.Option(0, "--bpe", help="Train a byte-level BPE tokenizer of this many tokens with a ChatML "
                            "chat template (0 = the character tokenizer)."),
    texts: Optional[str] = typer.Option(None, "--texts", help="With --bpe: a .jsonl whose string values (chat "
                                        "contents included) join the tokenizer's training text."),
    max_len: int = typer.Option(128, "--max-len", help="Longest sequence (max_position_embeddings)."),
):
    """Write a randomly initialised tiny causal LM with a local tokenizer (characters, or BPE with --bpe)."""
    from posttrain.models.tiny import TINY_SIZES, build_tiny_model

    if size not in TINY_SIZES:
        raise PosttrainError(f"--size: unknown size {size!r}", hint=f"use one of {', '.join(TINY_SIZES)}")
    tokenizer = None
    if bpe:
        from posttrain.models.bpe import texts_of_jsonl, train_bpe_tokenizer

        if bpe < 300:
            raise PosttrainError(f"--bpe {bpe}: too small", hint="use at least 300 tokens (256 bytes + specials)")
        extra = texts_of_jsonl(texts) if texts else []
        tokenizer = train_bpe_tokenizer(Path(out) / "tokenizer", bpe, extra_texts=extra * 5, seed=seed,
                                        lexicon_size=min(bpe, 2000), sentences=2000)
    elif texts:
        raise PosttrainError("--texts needs --bpe", hint="add --bpe N (e.g. --bpe 2000)")
    model = build_tiny_model(out, size, arch=arch, tie_word_embeddings=tied, seed=seed, tokenizer=tokenizer,
                             max_position_embeddings=max_len)
    console.print(f"wrote {model}")


@model_app.command("import")
@user_errors
def model_import(
    source: str = typer.Argument(..., help="A .gguf file (llama.cpp's format), or `smollm2` for the "
                                 "SmolLM2-135M-Instruct file that `make install` installs."),
    out: str = typer.Argument(..., help="The HF model directory to write (must not exist)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16: the dtype the weights are saved in."),
):
    """Convert a GGUF model into a plain HF directory (weights, tokenizer, chat template) and check it."""
    from posttrain.models.gguf_import import import_gguf, smollm2_gguf

    report = import_gguf(smollm2_gguf() if source == "smollm2" else source, out, dtype,
                         log=lambda m: err_console.print(m, highlight=False, soft_wrap=True))
    console.print(f"wrote {out}: {report.architecture}, {report.parameters:,} parameters, vocabulary "
                  f"{report.vocab_size:,}, {report.dtype}, {report.seconds:.0f} s\n"
                  f"check: the saved model's greedy completion equals the GGUF model's ({report.check_tokens_equal} "
                  f"tokens): {report.check_completion!r}", highlight=False, soft_wrap=True)


def _register_view() -> None:
    from posttrain.cli_view import view

    app.command("view")(user_errors(view))


_register_view()


from posttrain.cli_topology import register as _register_topology  # noqa: E402  (plan, cost, launch)

_register_topology(app, user_errors)

from posttrain.cli_dpo import dpo as _dpo  # noqa: E402  (its own module: the command is more than a few lines)

app.command("dpo")(user_errors(_dpo))

from posttrain.cli_rm import rm_app  # noqa: E402

app.add_typer(rm_app, name="rm")

from posttrain.cli_review import review_app  # noqa: E402

app.add_typer(review_app, name="review")

from posttrain.cli_eval import compare_cmd, eval_cmd  # noqa: E402  (eval commands live in their own module)

app.command("eval")(user_errors(eval_cmd))
app.command("compare")(user_errors(compare_cmd))

from posttrain.cli_export import export as _export  # noqa: E402  (posttrain export RUN_DIR --merge OUT)

app.command("export")(user_errors(_export))

from posttrain.cli_probe import probe as _probe  # noqa: E402  (posttrain probe CONFIG: will RL work on this task?)

app.command("probe")(user_errors(_probe))


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
