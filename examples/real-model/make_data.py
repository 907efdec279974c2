"""Single-digit addition in chat format, generated here (no hub): `python examples/real-model/make_data.py OUT_DIR`.

Every pair (a, b) with 0 <= a, b <= 9 is asked in four phrasings. The held-out split holds 30 ordered pairs whose
numbers the training split never adds in either order or any phrasing, so a held-out gain is the model answering
new questions, not recalling old ones (nor their mirror image).
Rows: {"prompt": [{"role": "user", "content": ...}], "answer": "<a+b>"} (the answer column the reward reads).
"""

import json
import random
import sys
from pathlib import Path

PHRASINGS = ("What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}.", "What is the sum of {a} and {b}?")
HELDOUT_PAIRS = 30


def rows(pairs: list[tuple[int, int]]) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": p.format(a=a, b=b)}], "answer": str(a + b)}
            for a, b in pairs for p in PHRASINGS]


def both_orders(a: int, b: int) -> list[tuple[int, int]]:
    return [(a, b)] if a == b else [(a, b), (b, a)]


def split(seed: int = 0) -> tuple[list[dict], list[dict]]:
    unordered = [(a, b) for a in range(10) for b in range(a, 10)]
    random.Random(seed).shuffle(unordered)
    held: list[tuple[int, int]] = []
    while len(held) < HELDOUT_PAIRS:
        held += both_orders(*unordered.pop())
    trained = [pair for a, b in unordered for pair in both_orders(a, b)]
    train, heldout = rows(trained), rows(held)
    random.Random(seed + 1).shuffle(train)
    return train, heldout


def write_jsonl(path: Path, data: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/real-model-data")
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = split()
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "test.jsonl", heldout)
    print(f"{out}/train.jsonl: {len(train)} rows; {out}/test.jsonl: {len(heldout)} rows (pairs never trained on)")
