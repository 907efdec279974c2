"""A step's multi-turn episodes summed up for metrics.jsonl (`episode/*`): pure functions on `Episode.record()`
dicts (rollout/trajectory.py), so the run viewer and tests can recompute them from samples.jsonl.

Every tool call has one outcome: the error kind the call carries itself (it did not parse: "malformed"), else the
error kind of its result (`unknown_tool`, `bad_arguments`, `exception`, `timeout`, `limit`), else "ok" when it ran
cleanly, else "not_run" (the episode ended first, e.g. at max_turns). Validity is the share of "ok" among the
calls that were run (`episode_heldout` reports the same number); a call never run is neither valid nor an error.
"""

from __future__ import annotations

from collections import Counter


OK, NOT_RUN = "ok", "not_run"


def call_outcomes(turns: list[dict]) -> list[str]:
    """Each tool call's outcome (an error kind, OK or NOT_RUN), in the order the assistant turns made them. A call's
    result is in the tool turns after its assistant turn; when there are as many results as calls they pair by
    position (the tool runner answers every call, a malformed one with its error), else the results pair with the
    calls that parsed."""
    out: list[str] = []
    for i, turn in enumerate(turns):
        calls = (turn.get("tool_calls") or []) if turn.get("role") == "assistant" else []
        if not calls:
            continue
        results = []
        for later in turns[i + 1:]:
            if later.get("role") == "assistant":
                break
            results += later.get("tool_results") or []
        answered = range(len(calls)) if len(results) == len(calls) else [k for k, c in enumerate(calls) if not c.get("error")]
        result_error = {k: r.get("error") or OK for k, r in zip(answered, results)}
        out += [c.get("error") or result_error.get(k, NOT_RUN) for k, c in enumerate(calls)]
    return out


def episode_metrics(records: list[dict]) -> dict:
    """metrics.jsonl keys for one step's episodes; {} for none. Means are per episode (tokens include the prompt),
    tool rates are per tool call that was run, end shares per episode for each end reason that occurred.
    `episode/tool_call_validity` and `episode/tool_error_rate` are None when no episode called a tool."""
    if not records:
        return {}
    n = len(records)
    outcomes = [o for r in records for o in call_outcomes(r.get("turns") or [])]
    assistant = [t for r in records for t in r.get("turns") or [] if t.get("role") == "assistant"]
    out = {
        "episode/turns": len(assistant) / n,
        "episode/tool_calls": len(outcomes) / n,
        "episode/tokens": sum(r.get("tokens", 0) for r in records) / n,
        "episode/sampled_tokens": sum(t.get("tokens", 0) for t in assistant) / n,
        "episode/tool_call_validity": None,
        "episode/tool_error_rate": None,
    }
    run = [o for o in outcomes if o != NOT_RUN]
    if run:
        kinds = Counter(o for o in run if o != OK)
        out["episode/tool_call_validity"] = run.count(OK) / len(run)
        out["episode/tool_error_rate"] = sum(kinds.values()) / len(run)
        out.update({f"episode/tool_errors/{kind}": c / len(run) for kind, c in sorted(kinds.items())})
    ends = Counter(str(r.get("end_reason")) for r in records)
    out.update({f"episode/end/{reason}": c / n for reason, c in sorted(ends.items())})
    return out
