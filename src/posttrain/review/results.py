"""A review session's results (the results page and `posttrain review results`), and scoring its pairs with a reward
model or an LLM judge so the page can show whether the scorer agrees with the people.

`session_results` reads the store and applies the pure functions of review/stats.py; every number's meaning is in
that module's docstring and in docs/review.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from posttrain.errors import PosttrainError
from posttrain.review import stats
from posttrain.review.store import Judgment, ReviewInputError, ReviewStore
from posttrain.tasks.base import prompt_text


def verdicts_by_item(judgments: list[Judgment]) -> dict[str, list[str]]:
    """{item id: its verdicts, oldest first}."""
    out: dict[str, list[Judgment]] = defaultdict(list)
    for j in judgments:
        out[j.item].append(j)
    return {item: [j.verdict for j in sorted(js, key=lambda j: j.created)] for item, js in out.items()}


def _rate(r: stats.Rate) -> dict:
    return {"b_over_a": r.value, "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n}


def session_results(store: ReviewStore, session_id: str) -> dict:
    """Every number of the results page (keys documented in docs/review.md, "## Commands")."""
    session = store.session(session_id)
    items = store.items(session_id)
    judgments = store.judgments(session_id)
    verdicts = verdicts_by_item(judgments)
    prefs = {it.id: stats.item_preference(verdicts.get(it.id, [])) for it in items}
    both_bad = {it.id for it in items if stats.is_both_bad(verdicts.get(it.id, []))}

    by_source = []
    for source in dict.fromkeys(it.source for it in items):
        ids = [it.id for it in items if it.source == source]
        r = stats.win_rate([prefs[i] for i in ids])
        by_source.append({"source": source, "n": r.n, "b_over_a": r.value, "ci_low": r.ci_low,
                          "ci_high": r.ci_high, "both_bad": sum(i in both_bad for i in ids)})

    kappa = stats.cohens_kappa([(v[0], v[1]) for v in verdicts.values() if len(v) >= 2])
    choices = {i: stats.human_choice(p) for i, p in prefs.items()}
    scorers = []
    for name, scored in sorted(store.scores(session_id).items()):
        ids = [i for i, c in choices.items() if c is not None and i in scored]
        r = stats.scorer_agreement([choices[i] for i in ids], [scored[i] for i in ids])
        scorers.append({"scorer": name, "agree": r.value, "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n})

    return {
        "session": session.id,
        "a_model": session.a_model,
        "b_model": session.b_model,
        "items": len(items),
        "judgments": len(judgments),
        "win_rate": _rate(stats.win_rate(list(prefs.values()))),
        "ties": sum(p == 0.5 for p in prefs.values()),
        "both_bad": len(both_bad),
        "by_source": by_source,
        "agreement": {"kappa": kappa.kappa, "observed": kappa.observed, "n_pairs": kappa.n_pairs},
        "scorers": scorers,
    }


def score_session(store: ReviewStore, session_id: str, *, rm_dir: Optional[str] = None,
                  judge_url: Optional[str] = None) -> list[str]:
    """Scores both outputs of every item with a reward model (`rm_dir`, normalized scores: the `reward_model`
    eval scorer) and/or an LLM judge at `judge_url` (the `judge` scorer, default judge options), stores them under
    "rm:<dir>" / "judge:<url>" and returns those names. Scoring again replaces the earlier scores."""
    from posttrain.evals.scorers import build_scorer

    if rm_dir is None and judge_url is None:
        raise ReviewInputError("give --rm DIR (a reward model `posttrain rm train` wrote) or --judge-url URL")
    items = store.items(session_id)
    specs = []
    if rm_dir is not None:
        specs.append((f"rm:{rm_dir}", {"type": "reward_model", "path": str(rm_dir)}, "--rm"))
    if judge_url is not None:
        specs.append((f"judge:{judge_url}", {"type": "judge", "url": judge_url}, "--judge-url"))
    names = []
    for name, spec, field in specs:
        try:
            scorer = build_scorer(spec, where=field)
        except PosttrainError as e:
            raise ReviewInputError(str(e)) from None
        scores = {}
        for it in items:
            # the reward model reads chat prompts through its chat template; the judge's template wants text
            prompt = it.prompt if spec["type"] == "reward_model" else prompt_text(it.prompt)
            record = {"id": it.id}
            scores[it.id] = (scorer(prompt, it.output_a, record), scorer(prompt, it.output_b, record))
        store.save_scores(session_id, name, scores)
        names.append(name)
    return names
