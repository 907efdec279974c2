"""Writes this example's dataset: chat-format word problems with an extra `unit` column, as a team would export
them (data/train.jsonl, data/test.jsonl). The files are committed; re-running gives the same rows.

    python examples/custom-task/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Tom", "Ana", "Lee", "Sam", "Kim", "Max", "Eva", "Ben"]
UNITS = ["apples", "pears", "books", "coins", "cards", "boats", "shells", "stamps"]
HERE = Path(__file__).resolve().parent


def row(rng: random.Random) -> dict:
    a, b, who, unit = rng.randint(1, 49), rng.randint(1, 49), rng.choice(NAMES), rng.choice(UNITS)
    question = f"{who} has {a} {unit} and gets {b} more. How many {unit} does {who} have now?"
    return {"prompt": [{"role": "user", "content": question}], "answer": f"{a + b} {unit}", "unit": unit}


def main() -> None:
    rng = random.Random(2026)
    rows, seen = [], set()
    while len(rows) < 2200:  # distinct questions, so the test split shares none with training
        r = row(rng)
        if r["prompt"][0]["content"] not in seen:
            seen.add(r["prompt"][0]["content"])
            rows.append(r)
    (HERE / "data").mkdir(exist_ok=True)
    for name, part in (("train", rows[:2000]), ("test", rows[2000:])):
        (HERE / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))


if __name__ == "__main__":
    main()
