"""Exports that close the loop: a session's human-decided pairs as preference data (`posttrain rm train`,
`posttrain dpo`), as a held-out preference suite (`posttrain eval` / `compare`), and flagged run samples as a
regression suite.

Which pairs: the human-decided items (review/stats.py: preference not None and not 0.5), the human's choice as
"chosen". Items whose two outputs are the same text are left out: they carry no preference, only noise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Optional

import yaml

from posttrain.review import stats
from posttrain.review.results import verdicts_by_item
from posttrain.review.store import ReviewInputError, ReviewStore

DEFAULT_SCORER_RM = "runs/rm/model"
EXPORTED_FLAGS = ("reward_hacked", "wrong_but_rewarded")  # "good" flags are not failures


def decided_pairs(store: ReviewStore, session_id: str) -> tuple[list[dict], int]:
    """([{id, prompt, chosen, rejected, source, votes}], items left out because both outputs are one text)."""
    verdicts = verdicts_by_item(store.judgments(session_id))
    rows, same = [], 0
    for it in store.items(session_id):
        votes = verdicts.get(it.id, [])
        choice = stats.human_choice(stats.item_preference(votes))
        if choice is None:
            continue
        if it.output_a == it.output_b:
            same += 1
            continue
        chosen, rejected = (it.output_b, it.output_a) if choice == "b" else (it.output_a, it.output_b)
        rows.append({"prompt": it.prompt, "chosen": chosen, "rejected": rejected, "id": it.id, "source": it.source,
                     "votes": votes})
    return rows, same


def _no_pairs(session_id: str) -> ReviewInputError:
    return ReviewInputError(f"session {session_id!r} has no human-decided pair yet (an item is decided when its "
                            "judgments prefer A or B; ties and both-bad are not)", hint="review some items first")


def export_pairs(store: ReviewStore, session_id: str, out: str | Path, log: Callable[[str], None] = print) -> int:
    """Writes {prompt, chosen, rejected} rows (plus id, source and votes, which the readers ignore) to a .jsonl
    that `posttrain rm train` (rm.data) and `posttrain dpo` (dpo.pairs) read as it is. Returns the row count."""
    rows, same = decided_pairs(store, session_id)
    if not rows:
        raise _no_pairs(session_id)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if same:
        log(f"left out {same} decided item(s) whose two outputs are the same text")
    return len(rows)


def _suite_name(session_id: str) -> str:
    return "review-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", session_id)


def export_suite(store: ReviewStore, session_id: str, out: str | Path, *, scorer_rm: str = DEFAULT_SCORER_RM,
                 log: Callable[[str], None] = print) -> int:
    """Writes a preference suite (kind: preference, evals/suites.py) of the decided pairs scored by the reward model
    at `scorer_rm`: `posttrain eval --suite OUT.yaml` reports its pairwise accuracy. Preference suites hold string
    prompts, so items with chat-format prompts are left out (said in `log`); train on them through --pairs."""
    rows, same = decided_pairs(store, session_id)
    chat = [r for r in rows if not isinstance(r["prompt"], str)]
    pairs = [{"id": r["id"], "prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
             for r in rows if isinstance(r["prompt"], str)]
    if chat:
        log(f"left out {len(chat)} pair(s) with chat-format prompts: a preference suite's prompts are strings "
            "(export them with --pairs instead)")
    if same:
        log(f"left out {same} decided item(s) whose two outputs are the same text")
    if not pairs:
        raise _no_pairs(session_id) if not chat else ReviewInputError(
            f"session {session_id!r}: every decided pair has a chat-format prompt; a preference suite holds string "
            "prompts", hint="export with --pairs and train/evaluate the reward model on that file")
    if not (Path(scorer_rm) / "posttrain_reward.json").is_file():
        log(f"note: {scorer_rm} is not a reward-model directory yet; the suite loads once it is "
            "(train one with `posttrain rm train`, or pass --scorer-rm DIR)")
    doc = {"suites": [{"name": _suite_name(session_id), "kind": "preference",
                       "scorer": {"type": "reward_model", "path": str(scorer_rm)}, "pairs": pairs}]}
    _write_suite_file(out, doc, f"Held-out preference suite from review session {session_id} ({store.path}): the "
                      "people's choice is 'chosen'.")
    return len(pairs)


def must_not_repeat(output: str) -> str:
    """A regression `format` regex that fails exactly when the output (stripped) is the flagged output again.

    Why not must_not_contain: it is a substring test, and flagged outputs are often short ("47"), so it would also
    fail correct answers that contain them ("147", "47 apples"). The regression runner full-matches `format`
    against the stripped output; `(?s)(?!X\\Z).*` matches any text except exactly X. What it does not catch is a
    variation of the same hack (one character more): a case guards against a repeat, not the whole failure mode."""
    return r"(?s)(?!" + re.escape(output.strip()) + r"\Z).*"


def _same_run(stored: str, given: str) -> bool:
    """The page names a run by its directory (relative to --runs-root, or absolute); match on the run's name."""
    return stored == given or Path(stored).name == Path(given).name


def export_flags(store: ReviewStore, run: str, out: str | Path, *, max_new_tokens: Optional[int] = None,
                 log: Callable[[str], None] = print) -> int:
    """Writes the run's reward_hacked / wrong_but_rewarded flags as a regression suite: each flagged sample's prompt,
    failing when the model repeats the flagged output exactly (must_not_repeat). Greedy, with the run's
    rollout.max_new_tokens when its config.yaml is there (else `max_new_tokens`, else 64). Returns the case count."""
    flags = [f for f in store.flags() if _same_run(f.run, run)]
    if not flags:
        known = sorted({f.run for f in store.flags()})
        raise ReviewInputError(f"--run {run}: no flags for this run in {store.path} (runs with flags: "
                               f"{', '.join(known) or 'none'})", hint="flag samples on the review page's sample "
                               "browser first, or pass the run as the page names it")
    cases, seen, chat = [], set(), 0
    for f in flags:
        if f.kind not in EXPORTED_FLAGS:
            continue
        if not isinstance(f.prompt, str):
            chat += 1
            continue
        key = (f.step, f.sample_id)
        if key in seen:  # flagged by two reviewers: one case
            continue
        seen.add(key)
        cases.append({"id": re.sub(r"[^A-Za-z0-9_.#-]+", "-", f"step{f.step}-{f.sample_id}"), "prompt": f.prompt,
                      "format": must_not_repeat(f.output)})
    if chat:
        log(f"left out {chat} flag(s) with chat-format prompts: a regression case's prompt is a string")
    if not cases:
        raise ReviewInputError(f"--run {run}: no reward_hacked or wrong_but_rewarded flag with a string prompt "
                               f"({len(flags)} flag(s) in all)")
    tokens = max_new_tokens or _run_max_new_tokens(run) or 64
    doc = {"suites": [{"name": "flags-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(run).name or run),
                       "kind": "regression", "cases": cases,
                       "sampling": {"temperature": 0.0, "max_new_tokens": tokens}}]}
    _write_suite_file(out, doc, f"Regression suite from flagged samples of {run} ({store.path}): a case fails when "
                      "the model repeats the flagged output exactly (see posttrain.review.export.must_not_repeat).")
    return len(cases)


def _write_suite_file(out: str | Path, doc: dict, header: str) -> None:
    """A suite YAML file that `posttrain eval` loads, with a one-line comment saying where it came from."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {header}\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120))


def _run_max_new_tokens(run: str) -> Optional[int]:
    config = Path(run) / "config.yaml"
    if not config.is_file():
        return None
    from posttrain.config import load_config

    return load_config(config).rollout.max_new_tokens
