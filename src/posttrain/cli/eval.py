"""`posttrain eval` and `posttrain compare`: suites on a model, and a paired regression gate between two.

    posttrain eval --model runs/x/final --suite addition --out evals/x
    posttrain eval --model runs/x/final --from-run runs/x --out evals/x-reward  # the run's held-out split + reward
    posttrain compare runs/base runs/x/final --suite addition --margin 0.02 --out evals/x-vs-base  # exit 1 = regressed
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "posttrain" / "evals"


def _evaluator(engine: str, dtype: str, max_model_len: int, cache_dir: Optional[str], no_cache: bool):
    from posttrain.errors import PosttrainError
    from posttrain.evals.runner import EngineSettings, ModelEvaluator

    if engine not in ("vllm", "hf"):
        raise PosttrainError(f"--engine {engine!r}: choose vllm or hf")
    cache = None if no_cache else Path(cache_dir) if cache_dir else DEFAULT_CACHE
    return ModelEvaluator(EngineSettings(kind=engine, dtype=dtype, max_model_len=max_model_len), cache)


def _results_json(model: str, model_hash: str, results, wall: float) -> dict:
    generated = sum(len(r.records) for r in results if not r.cached and r.kind != "preference")
    gen_seconds = sum(r.seconds for r in results if not r.cached and r.kind != "preference")
    return {"model": model, "model_hash": model_hash, "wall_seconds": wall,
            "throughput_samples_per_s": generated / gen_seconds if gen_seconds > 0 else None,
            "suites": [r.to_json() for r in results]}


def _suite_progress(description: str, total: int, quiet: bool):
    """A progress bar over suites (rate and ETA on a terminal, plain lines otherwise) and its per-suite callback."""
    from posttrain.progress import StepProgress

    bar = StepProgress(description, total, enabled=not quiet, fields=("suite", "mean"))
    return bar, lambda done, r: bar.update(done, suite=r.suite, mean=float(r.summary["mean"]))


def _load_suites(suites: list[str], from_run: str | None, allow_changed: bool):
    """--suite refs plus, with --from-run, the run's own `run_reward` suite (evals/run_suite.py)."""
    from posttrain.errors import PosttrainError
    from posttrain.evals.run_suite import RUN_REWARD
    from posttrain.evals.catalog import load_suites

    refs = list(suites) + ([RUN_REWARD] if from_run and RUN_REWARD not in suites else [])
    if not refs:
        raise PosttrainError("give --suite (a suite file or built-in name) or --from-run runs/<name>")
    return load_suites(refs, from_run, allow_changed=allow_changed, warn=lambda text: typer.echo(text, err=True))


def _summary_line(name: str, s: dict, note: str = "") -> str:
    """'name  0.750 +- 0.097  95% CI [0.560, 0.940]  (n=20)': a suite's (or a reward source's) mean, SE and CI."""
    return (f"{name:<24} {s['mean']:.3f} +- {s['se']:.3f}  95% CI [{s['ci_low']:.3f}, {s['ci_high']:.3f}]  "
            f"(n={s['n']}{note})")


def run_eval(model: str, suites: list[str], out: Path, evaluator, quiet: bool = True, *, from_run: str | None = None,
             allow_changed: bool = False) -> dict:
    from posttrain.evals.report import eval_report
    from posttrain.evals.runner import evaluate

    loaded = _load_suites(suites, from_run, allow_changed)
    start = time.perf_counter()
    bar, on_suite = _suite_progress("eval", len(loaded), quiet)
    try:
        results = evaluate(model, loaded, evaluator, on_suite)
    finally:
        bar.close()
    doc = _results_json(model, evaluator.model_hash, results, time.perf_counter() - start)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    (out / "report.html").write_text(eval_report(model, doc["suites"]))
    return doc


FROM_RUN_HELP = ("A run directory (runs/<name>): adds the suite run_reward, the run's held-out split scored by "
                 "the run's own reward (its reward functions and weights, composed as in training).")
ALLOW_CHANGED_HELP = "With --from-run: score with a reward function whose file changed since the run (a warning)."


def eval_cmd(
    model: str = typer.Option(..., "--model", help="HF model directory (a checkpoint)."),
    suite: list[str] = typer.Option([], "--suite", help="Suite file, built-in suite file (addition, sorting) "
                                    "or built-in suite name; repeat for several."),
    out: str = typer.Option(..., "--out", help="Directory for results.json and report.html."),
    from_run: Optional[str] = typer.Option(None, "--from-run", help=FROM_RUN_HELP),
    allow_changed_reward: bool = typer.Option(False, "--allow-changed-reward", help=ALLOW_CHANGED_HELP),
    engine: str = typer.Option("vllm", "--engine", help="vllm, or hf (transformers) as a fallback."),
    dtype: str = typer.Option("float32", "--dtype"),
    max_model_len: int = typer.Option(128, "--max-model-len", help="Longest prompt + completion (tokens)."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="Results cache (default ~/.cache/posttrain/evals)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Generate even when cached results exist."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar (plain lines are printed off a terminal anyway)."),
):
    """Evaluate a model on suites: results.json (per-sample records, per-suite mean and SE) and report.html."""
    from rich.console import Console

    doc = run_eval(model, suite, Path(out), _evaluator(engine, dtype, max_model_len, cache_dir, no_cache),
                   quiet=quiet, from_run=from_run, allow_changed=allow_changed_reward)
    console = Console()
    for r in doc["suites"]:
        s = r["summary"]
        console.print(_summary_line(r["suite"], s, ", cached" if r["cached"] else ""), highlight=False)
        for name, c in s.get("components", {}).items():  # run_reward: each source of the run's reward
            failed = s["failures"].get(name, 0)
            console.print(_summary_line(f"  {name}", c, f", {failed} failed" if failed else ""), highlight=False)
    if doc["throughput_samples_per_s"]:
        console.print(f"throughput: {doc['throughput_samples_per_s']:.1f} samples/s", highlight=False)
    console.print(f"wrote {Path(out) / 'results.json'} and {Path(out) / 'report.html'}", highlight=False)


def run_compare(model_a: str, model_b: str, suites: list[str], out: Path, evaluator, *, margin: float,
                alpha: float, seed: int, quiet: bool = True, from_run: str | None = None,
                allow_changed: bool = False) -> tuple[list, str]:
    from posttrain.evals.compare import biggest_changes, compare_suites, markdown_summary, rows_to_json
    from posttrain.evals.report import compare_report
    from posttrain.evals.runner import evaluate

    loaded = _load_suites(suites, from_run, allow_changed)
    start = time.perf_counter()
    bar, on_suite = _suite_progress("compare", 2 * len(loaded), quiet)
    try:
        res_a = evaluate(model_a, loaded, evaluator, on_suite)
        hash_a = evaluator.model_hash
        res_b = evaluate(model_b, loaded, evaluator, lambda done, r: on_suite(len(loaded) + done, r))
    finally:
        bar.close()
    wall = time.perf_counter() - start
    rows = compare_suites({a.suite: (a.records, b.records) for a, b in zip(res_a, res_b)},
                          margin=margin, alpha=alpha, seed=seed)
    md = markdown_summary(rows, name_a=model_a, name_b=model_b, margin=margin, alpha=alpha)
    doc_a = _results_json(model_a, hash_a, res_a, wall)
    doc_b = _results_json(model_b, evaluator.model_hash, res_b, wall)
    changes = {a.suite: biggest_changes(a.records, b.records) for a, b in zip(res_a, res_b)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(
        {"a": model_a, "b": model_b, "margin": margin, "alpha": alpha, "suites": rows_to_json(rows),
         "results_a": doc_a, "results_b": doc_b}, indent=1))
    (out / "summary.md").write_text(md)
    (out / "report.html").write_text(
        compare_report(model_a, model_b, rows_to_json(rows), doc_a["suites"], doc_b["suites"], changes, md))
    return rows, md


def compare_cmd(
    model_a: str = typer.Argument(..., help="Baseline model directory (A)."),
    model_b: str = typer.Argument(..., help="Candidate model directory (B)."),
    suite: list[str] = typer.Option([], "--suite", help="Suite file or built-in name; repeat for several."),
    out: str = typer.Option(..., "--out", help="Directory for comparison.json, summary.md and report.html."),
    from_run: Optional[str] = typer.Option(None, "--from-run", help=FROM_RUN_HELP),
    allow_changed_reward: bool = typer.Option(False, "--allow-changed-reward", help=ALLOW_CHANGED_HELP),
    margin: float = typer.Option(0.0, "--margin", help="Tolerated drop of a suite's mean score (score units)."),
    alpha: float = typer.Option(0.05, "--alpha", help="Significance level after Holm correction across suites."),
    seed: int = typer.Option(0, "--seed", help="Seed of the paired bootstrap."),
    engine: str = typer.Option("vllm", "--engine", help="vllm, or hf (transformers) as a fallback."),
    dtype: str = typer.Option("float32", "--dtype"),
    max_model_len: int = typer.Option(128, "--max-model-len"),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir"),
    no_cache: bool = typer.Option(False, "--no-cache"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar (plain lines are printed off a terminal anyway)."),
):
    """Paired comparison of B against A on identical samples; exit code 1 when B significantly regresses."""
    from posttrain.evals.compare import any_regression

    rows, md = run_compare(model_a, model_b, suite, Path(out),
                           _evaluator(engine, dtype, max_model_len, cache_dir, no_cache),
                           margin=margin, alpha=alpha, seed=seed, quiet=quiet, from_run=from_run,
                           allow_changed=allow_changed_reward)
    typer.echo(md)
    if any_regression(rows):
        raise typer.Exit(1)
