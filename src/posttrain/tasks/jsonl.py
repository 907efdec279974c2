"""A user dataset: a .jsonl file of {"prompt": ..., "answer": ...} rows (optional "id"), scored by task.reward
(exact match by default; "python" runs each completion as a program in the sandbox and compares its output).
The held-out split is a seeded sample of rows, disjoint from the training rows."""

from __future__ import annotations

import json
import random
from pathlib import Path

from posttrain.errors import PosttrainError
from posttrain.tasks.base import Problem, verifier_for


def jsonl_rows(p: Path):
    """(line number, parsed row) for each non-blank line; a line that is not JSON is an error naming it."""
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise PosttrainError(f"{p}, line {lineno}: not valid JSON ({e.msg})") from None


def read_jsonl_problems(path: str | Path) -> list[Problem]:
    p = Path(path)
    if not p.is_file():
        raise PosttrainError(f"task.path: dataset file {p} does not exist")
    problems: list[Problem] = []
    for lineno, row in jsonl_rows(p):
        if not isinstance(row, dict):
            raise PosttrainError(f"{p}, line {lineno}: each row must be a JSON object with 'prompt' and 'answer'")
        missing = [k for k in ("prompt", "answer") if not isinstance(row.get(k), str)]
        if missing:
            raise PosttrainError(
                f"{p}, line {lineno}: missing or non-string field(s) {', '.join(missing)}",
                hint="each row needs string fields 'prompt' and 'answer'",
            )
        problems.append(Problem(id=str(row.get("id", f"row{lineno}")), prompt=row["prompt"], answer=row["answer"]))
    if not problems:
        raise PosttrainError(f"{p}: the dataset is empty", hint="add rows of {\"prompt\": ..., \"answer\": ...}")
    return problems


class JsonlTask:
    name = "jsonl"

    def __init__(self, path: str | Path, heldout_size: int, *, seed: int = 0, reward: str = "exact"):
        self.verify = verifier_for(reward)
        rows = read_jsonl_problems(path)
        if len(rows) <= heldout_size:
            raise PosttrainError(
                f"task.heldout_size={heldout_size} leaves no training rows in {path} ({len(rows)} rows)",
                hint="lower task.heldout_size",
            )
        order = list(range(len(rows)))
        random.Random(f"{seed}/jsonl-split").shuffle(order)
        held = set(order[:heldout_size])
        self.heldout = [rows[i] for i in sorted(held)]
        self.train = [r for i, r in enumerate(rows) if i not in held]

    def score(self, problem: Problem, completion: str) -> float:
        return self.verify(problem.answer, completion)
