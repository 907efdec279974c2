"""Preference data: reading and checking user files (jsonl, or parquet when pyarrow is installed), and the built-in
source that labels pairs of synthesized completions of the addition task with the hidden gold function.

A row is {"prompt": ..., "chosen": ..., "rejected": ...} where each value is a string, or a chat-format list of
{"role", "content"} messages (the prompt's turns, and the assistant turn(s) of each answer). An optional numeric
"margin" per row is added to the configured margin of the Bradley-Terry loss.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from posttrain.errors import PosttrainError
from posttrain.rewards.gold import gold_function
from posttrain.tasks.base import Problem

Text = Union[str, list]  # a string or a list of {"role", "content"} messages


@dataclass(frozen=True)
class PreferencePair:
    prompt: Text
    chosen: Text
    rejected: Text
    margin: float = 0.0


# ---------------------------------------------------------------- reading user files


def _check_text(value, field: str, where: str) -> Text:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    ):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise PosttrainError(
        f"{where}: field '{field}' must be a string or a non-empty list of {{role, content}} messages, "
        f"got {type(value).__name__}",
        hint="fix or drop that row",
    )


def parse_row(row, where: str) -> PreferencePair:
    """One row -> PreferencePair; `where` names the file and row for the error message."""
    if not isinstance(row, dict):
        raise PosttrainError(f"{where}: a row must be an object with prompt, chosen, rejected; got {type(row).__name__}")
    missing = [k for k in ("prompt", "chosen", "rejected") if row.get(k) is None]
    if missing:
        raise PosttrainError(f"{where}: missing field(s) {', '.join(missing)}",
                             hint="every row needs 'prompt', 'chosen' and 'rejected'")
    margin = row.get("margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)):
        raise PosttrainError(f"{where}: field 'margin' must be a number, got {margin!r}")
    return PreferencePair(*(_check_text(row[k], k, where) for k in ("prompt", "chosen", "rejected")), float(margin))


def read_preferences(path: str | Path, field: str = "rm.data", min_pairs: int = 2) -> list[PreferencePair]:
    """Reads a .jsonl or .parquet preference file (for the reward model, rm.data, or DPO, dpo.pairs); errors name
    the config field, the file and the 1-based row (line)."""
    p = Path(path)
    if not p.is_file():
        raise PosttrainError(f"{field}: preference file {p} does not exist",
                             hint=f"point {field} at a .jsonl/.parquet file, or make one with `posttrain rm pairs`")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise PosttrainError(f"{field}: reading {p} needs pyarrow", hint="pip install pyarrow, or use jsonl") from None
        rows = pq.read_table(p).to_pylist()
        pairs = [parse_row(r, f"{p} row {i + 1}") for i, r in enumerate(rows)]
    else:
        pairs = []
        for i, line in enumerate(p.read_text().splitlines()):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise PosttrainError(f"{p} line {i + 1}: not valid JSON ({e.msg})") from None
            pairs.append(parse_row(row, f"{p} line {i + 1}"))
    if len(pairs) < min_pairs:
        raise PosttrainError(f"{field}: {p} holds {len(pairs)} preference pair(s); need at least {min_pairs}",
                             hint='add rows of {"prompt", "chosen", "rejected"}')
    return pairs


# ---------------------------------------------------------------- the built-in source


def perturbations(answer: str, rng: random.Random) -> list[str]:
    """Plausible wrong completions of an addition answer: one or two digits changed, a digit dropped or added,
    an off-by-one-carry number, a random number, letters."""
    digits = "0123456789"

    def change(s: str, k: int) -> str:
        s = list(s)
        for i in rng.sample(range(len(s)), min(k, len(s))):
            s[i] = rng.choice([d for d in digits if d != s[i]])
        return "".join(s)

    n = int(answer)
    return [
        change(answer, 1), change(answer, 1), change(answer, 2),
        answer[:-1] or "0", answer + rng.choice(digits), str(n + rng.choice([-10, 10, -100, 100, 1, -1])),
        str(rng.randint(0, 10 ** len(answer))), "".join(rng.choice("abcxyz") for _ in range(rng.randint(1, 4))),
    ]


def gold_pairs(problems: list[Problem], task_name: str, n_pairs: int, label_noise: float, seed: int) -> list[dict]:
    """n_pairs rows {prompt, chosen, rejected, gold_chosen, gold_rejected, flipped}: two distinct completions of a
    problem (the answer or a perturbation), the one with the higher gold score chosen, then the labels swapped
    with probability `label_noise` (annotator noise). Pairs with equal gold scores are redrawn."""
    gold = gold_function(task_name)
    if gold is None:
        raise PosttrainError(f"task.name={task_name!r} has no built-in gold function",
                             hint="use task.name=addition for built-in preference pairs")
    if not 0 <= label_noise < 0.5:
        raise PosttrainError(f"label_noise={label_noise}: must be in [0, 0.5)")
    rng = random.Random(seed)
    rows = []
    while len(rows) < n_pairs:
        p = problems[rng.randrange(len(problems))]
        a, b = rng.sample([p.answer, *perturbations(p.answer, rng)], 2)
        ga, gb = gold(p.answer, a), gold(p.answer, b)
        if ga == gb:
            continue
        (chosen, gc), (rejected, gr) = sorted([(a, ga), (b, gb)], key=lambda t: -t[1])
        flipped = rng.random() < label_noise
        if flipped:
            (chosen, gc), (rejected, gr) = (rejected, gr), (chosen, gc)
        rows.append({"prompt": p.prompt, "chosen": chosen, "rejected": rejected,
                     "gold_chosen": gc, "gold_rejected": gr, "flipped": flipped})
    return rows


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p
