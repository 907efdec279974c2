"""Reads runs/numerics/<setting>/pytest.log (written by scripts/numerics_matrix.sh) and prints the markdown table
of the measured effects per setting: each algorithm's reward gain and z, DPO's held-out margin z, the compare gate
on the degraded checkpoint, the planted over-optimization case, and the pass/fail count.

    scripts/numerics_table.py [ROOT]            # print the table
    scripts/numerics_table.py [ROOT] --write    # and write it between the numerics markers of docs/algorithms.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SETTINGS = ("native", "avx2", "novec", "threads1", "mkl-compat", "mkl-avx2", "mkl-avx512", "mkl-isa-avx2")
ALGOS = ("grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo")


def effects(log: str) -> dict[str, str]:
    out = {}
    for name in ALGOS:
        m = re.search(rf"^{name}: reward steps .*?gain ([+-][\d.]+), z ([-\d.]+)", log, re.M)
        if m:
            out[name] = f"{m.group(1)} (z {m.group(2)})"
    m = re.search(r"^dpo: held-out implicit-reward margin ([\d.]+) \+- [\d.]+ \(z ([-\d.]+)\), ranked ([\d.]+)", log, re.M)
    if m:
        out["dpo"] = f"margin {m.group(1)} (z {m.group(2)}), ranked {m.group(3)}"
    m = re.search(r"compare warm -> degraded:.*?\n\| addition-heldout \| \d+ \| ([\d.]+) \| ([\d.]+) \|.*?\| ([\d.e-]+) \| "
                  r"([\d.e-]+) \| (\d+/\d+/\d+) \| ([a-z ]+) \|", log, re.S)
    if m:
        out["compare degraded"] = f"{m.group(1)} → {m.group(2)}, p {m.group(3)}, W/T/L {m.group(5)}: {m.group(6)}"
    m = re.search(r"compare warm -> twin:.*?\n\| addition-heldout \| \d+ \| ([\d.]+) \| ([\d.]+) \|.*?\| (\d+/\d+/\d+) \| "
                  r"([a-z ]+) \|", log, re.S)
    if m:
        out["compare twin"] = f"{m.group(1)} → {m.group(2)}, W/T/L {m.group(3)}: {m.group(4)}"
    m = re.search(r"peak gold ([\d.]+) at step (\d+); first fell 10% below it at step (\d+).*?first proxy_gold alarm at "
                  r"step (\d+)", log)
    if m:
        out["planted: gold peak / -10% / first alarm"] = f"step {m.group(2)} / {m.group(3)} / {m.group(4)}"
    m = re.search(r"^proxy RM held-out pairwise accuracy ([\d.]+)", log, re.M)
    if m:
        out["rlhf: proxy RM held-out acc"] = m.group(1)
    m = re.search(r"^greedy on \d+ held-out problems: proxy ([\d.]+) -> ([\d.]+)", log, re.M)  # its line before it sampled
    if m:
        out["rlhf: greedy proxy before → after"] = f"{m.group(1)} → {m.group(2)}"
    m = re.search(r"^\d+ samples of \d+ held-out problems: proxy ([\d.]+) -> ([\d.]+)", log, re.M)
    if m:
        out["rlhf: sampled proxy before → after"] = f"{m.group(1)} → {m.group(2)}"
    m = re.search(r"^=+ (.*) in [\d.]+s", log, re.M)
    out["pytest"] = m.group(1) if m else "?"
    return out


DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"


def table(root: str = "runs/numerics") -> str:
    cols = [s for s in SETTINGS if (Path(root) / s / "pytest.log").is_file()]
    rows = {s: effects((Path(root) / s / "pytest.log").read_text(errors="replace")) for s in cols}
    keys = [*ALGOS, "dpo", "compare degraded", "compare twin", "planted: gold peak / -10% / first alarm",
            "rlhf: proxy RM held-out acc", "rlhf: greedy proxy before → after",
            "rlhf: sampled proxy before → after", "pytest"]
    lines = ["| test | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {k} | " + " | ".join(rows[s].get(k, "—") for s in cols) + " |" for k in keys]
    return "\n".join(lines)


def write(md: str, doc: Path = DOC) -> None:
    """Replaces the block between <!-- numerics:start --> and <!-- numerics:end --> of docs/algorithms.md."""
    text = doc.read_text()
    if "<!-- numerics:start -->" not in text:
        raise SystemExit(f"no numerics markers in {doc}")
    block = f"<!-- numerics:start -->\n{md}\n<!-- numerics:end -->"
    doc.write_text(re.sub(r"<!-- numerics:start -->.*?<!-- numerics:end -->", lambda _m: block, text, flags=re.S))


def main(*argv: str) -> int:
    args = [a for a in argv if a != "--write"]
    root = args[0] if args else "runs/numerics"
    if not any((Path(root) / s / "pytest.log").is_file() for s in SETTINGS):
        raise SystemExit(f"no {root}/<setting>/pytest.log: run scripts/numerics_matrix.sh first")
    md = table(root)
    print(md)
    if "--write" in argv:
        write(md)
        print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
