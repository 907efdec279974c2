"""`posttrain review ...`: blind pairwise review of two checkpoints, its results, and the exports that close the loop.

    posttrain review new --a runs/demo/sft --b runs/demo/checkpoints/final --prompts addition --n 100 --name demo
    posttrain review serve                                  # http://127.0.0.1:8780, reviewers judge in the browser
    posttrain review results demo --rm runs/rm/model        # win rate, agreement, does the RM agree with us?
    posttrain review export demo --pairs pairs.jsonl --suite review-suite.yaml
    posttrain review export-flags --run runs/demo --out flags-suite.yaml
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.common import console

DEFAULT_DB = "reviews/review.db"
DB_HELP = "The review database (SQLite)."


def new(
    a: str = typer.Option(..., "--a", help="Model directory A (e.g. the baseline)."),
    b: str = typer.Option(..., "--b", help="Model directory B (the candidate): the win rate is B's over A."),
    prompts: str = typer.Option(..., "--prompts", help="A suite file or built-in suite name (its generation "
                                "suites), run:RUN_DIR (the run's held-out split) or a .jsonl of {\"prompt\"} rows."),
    n: int = typer.Option(100, "--n", help="How many prompts (the first n of the source)."),
    name: Optional[str] = typer.Option(None, "--name", help="Session id (default: A-vs-B-<time>)."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    double: float = typer.Option(0.2, "--double", help="Share of items that go to two reviewers (agreement)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed of every prompt (the same for A and B) and the seed "
                             "of the left/right order and of which items are doubly reviewed."),
    engine: str = typer.Option("vllm", "--engine", help="vllm, or hf (transformers) as a fallback."),
    dtype: str = typer.Option("float32", "--dtype"),
    max_model_len: int = typer.Option(128, "--max-model-len", help="Longest prompt + completion (tokens)."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Longest completion (tokens); "
                                                 "default: the suite's (64 for a prompts file)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Sampling temperature (0 = greedy); "
                                                "default: the suite's (0 for a prompts file)."),
):
    """Generate A's and B's outputs on the same prompts (one engine, same seeds) and create a review session."""
    from posttrain.review.build import new_session

    session = new_session(a=a, b=b, prompts=prompts, n=n, db=db, name=name, double_share=double, seed=seed,
                          engine=engine, dtype=dtype, max_model_len=max_model_len, max_new_tokens=max_new_tokens,
                          temperature=temperature, log=lambda m: console.print(m, highlight=False))
    console.print(f"session {session.id}: {session.meta['items']} items from {session.source} in {db} "
                  f"({session.meta['generation_seconds']:.1f} s of generation)", highlight=False)
    console.print(f"review it: posttrain review serve --db {db}", highlight=False)


def _store_with(db: str, session: str):
    """The review database at `db`, checked to hold `session` (an unknown one is an error naming the sessions)."""
    from posttrain.review.store import ReviewStore

    store = ReviewStore(db)
    store.session(session)
    return store


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ci(d: dict, key: str) -> str:
    if d[key] is None:
        return "-  (nothing decided)"
    return f"{d[key]:.3f}  95% CI [{d['ci_low']:.3f}, {d['ci_high']:.3f}]  (n={d['n']})"


def print_results(r: dict) -> None:
    out = lambda text: console.print(text, highlight=False, soft_wrap=True)  # noqa: E731
    out(f"session {r['session']}: A = {r['a_model']}, B = {r['b_model']}")
    out(f"{r['items']} items, {r['judgments']} judgments")
    out(f"B over A win rate  {_ci(r['win_rate'], 'b_over_a')}")
    out(f"ties {r['ties']}, both bad {r['both_bad']} (items)")
    for s in r["by_source"]:
        out(f"  {s['source']:<22} {_ci(s, 'b_over_a')}, both bad {s['both_bad']}")
    g = r["agreement"]
    out(f"reviewer agreement: Cohen's kappa {_num(g['kappa'])}, observed {_num(g['observed'])} "
        f"({g['n_pairs']} doubly reviewed items)")
    for s in r["scorers"]:
        out(f"{s['scorer']} agrees with the people on {_ci(s, 'agree')}")
    if not r["scorers"]:
        out("no scorer yet: --rm DIR or --judge-url URL scores the pairs and shows whether it agrees with the people")


def results(
    session: str = typer.Argument(..., help="Session id."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    rm: Optional[str] = typer.Option(None, "--rm", help="Score both outputs of every item with this reward model "
                                     "first (stored as rm:DIR)."),
    judge_url: Optional[str] = typer.Option(None, "--judge-url", help="Score with an LLM judge at this "
                                            "OpenAI-compatible endpoint first (stored as judge:URL)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the results as JSON here."),
):
    """B's win rate over A with a 95% CI, ties, both-bad, per source, reviewer agreement, scorer agreement."""
    from posttrain.review.results import score_session, session_results

    store = _store_with(db, session)  # an unknown session fails before any model loads
    if rm or judge_url:
        for name in score_session(store, session, rm_dir=rm, judge_url=judge_url):
            console.print(f"scored with {name}", highlight=False)
    r = session_results(store, session)
    print_results(r)
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(r, indent=1))
        console.print(f"wrote {json_out}", highlight=False)


def export(
    session: str = typer.Argument(..., help="Session id."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    pairs: Optional[str] = typer.Option(None, "--pairs", help="Write {prompt, chosen, rejected} rows here (.jsonl) "
                                        "for `posttrain rm train` (rm.data=) and `posttrain dpo` (dpo.pairs=)."),
    suite: Optional[str] = typer.Option(None, "--suite", help="Write a held-out preference suite here (.yaml) for "
                                        "`posttrain eval` / `compare`."),
    scorer_rm: str = typer.Option("runs/rm/model", "--scorer-rm", help="With --suite: the reward model the suite "
                                  "scores with."),
):
    """The session's human-decided pairs as preference data and/or a held-out preference suite."""
    from posttrain.review.export import export_pairs, export_suite
    from posttrain.review.store import ReviewInputError

    if not pairs and not suite:
        raise ReviewInputError("give --pairs OUT.jsonl and/or --suite OUT.yaml")
    store = _store_with(db, session)
    log = lambda m: console.print(m, highlight=False)  # noqa: E731
    if pairs:
        console.print(f"wrote {export_pairs(store, session, pairs, log)} pairs to {pairs}", highlight=False)
    if suite:
        count = export_suite(store, session, suite, scorer_rm=scorer_rm, log=log)
        console.print(f"wrote a preference suite of {count} pairs to {suite} (scored by {scorer_rm})",
                      highlight=False)


def export_flags_cmd(
    run: str = typer.Option(..., "--run", help="The run whose flagged samples to export (runs/<name>)."),
    out: str = typer.Option(..., "--out", help="Regression suite to write (.yaml)."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Longest completion (tokens); "
                                                 "default: the run's rollout.max_new_tokens."),
):
    """Flagged samples (reward hacked, wrong but rewarded) as a regression suite: each fails on a repeat."""
    from posttrain.review.export import export_flags
    from posttrain.review.store import ReviewStore

    count = export_flags(ReviewStore(db), run, out, max_new_tokens=max_new_tokens,
                         log=lambda m: console.print(m, highlight=False))
    console.print(f"wrote a regression suite of {count} cases to {out}", highlight=False)


def serve(
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but loopback needs --token."),
    port: int = typer.Option(8780, "--port"),
    token: Optional[str] = typer.Option(None, "--token", help="Access token checked on every request (default: "
                                        "the POSTTRAIN_REVIEW_TOKEN environment variable)."),
    runs_root: str = typer.Option("runs", "--runs-root", help="Where the sample browser finds runs."),
):
    """The review page: blind pairwise review, results, and a run's sample browser."""
    from posttrain.review.server import run_server

    run_server(db, host=host, port=port, token=token or os.environ.get("POSTTRAIN_REVIEW_TOKEN") or None,
               runs_root=runs_root)
