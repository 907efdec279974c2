"""Rewrites the generated blocks of README.md and docs/ from the code and the tree. Run by `make readme`.

- docs/config.md `config-reference`: every config key, its type, default and meaning (`posttrain config reference`).
- docs/architecture.md `layers`: the layers bottom to top, read from tests/test_architecture.py, which checks them.
- docs/architecture.md `modules`: one line per module of src/posttrain: its path and the first line of its docstring.
- docs/performance.md `perf`: the `make bench` tables from benchmarks/results/perf.json (benchmarks/perf_report.py;
  `make bench` also redraws docs/perf.png, this does not).
- README.md `layout`: one line per package of src/posttrain.

docs/algorithms.md `numerics` comes from logs that are not committed: `scripts/numerics_table.py --write`.

`--check` writes nothing and exits 1, naming each block that is out of date (tests/test_docs_sync.py uses `stale`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "posttrain"
README = ROOT / "README.md"
CONFIG_DOC = ROOT / "docs" / "config.md"
ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"

# One line per package where its __init__ docstring says no more than its name. A package missing here and
# without a docstring is listed with "(no docstring)": write one in its __init__.py.
PACKAGE_LINES = {
    "algorithms": "losses and advantages as pure functions on tensors (GRPO, Dr.GRPO, DAPO, RLOO, REINFORCE++, PPO, DPO)",
    "cli": "the `posttrain` command and its subcommands",
    "config": "the config sections, YAML and override loading, the config reference",
    "cost": "`posttrain cost`: build vs buy, the on-call line measured from runs",
    "evals": "eval suites, scorers, paired comparison, the in-loop evaluator and gate, reward-hacking alarms",
    "orchestration": "Ray roles in placement groups, the sharded trainer group, re-forming roles, launch specs",
    "remote": "remote-call plumbing for Ray actors: stacks, faults, the hang watchdog, redo",
    "rollout": "engines (vLLM, transformers), rollout workers, sampling seeds, weight sync, multi-turn episodes",
    "topology": "`posttrain plan`: role sizing, layouts, placement from the plan",
    "training": "trainer actor, sharded ranks, reference, critic, batches and packing, SFT, DPO, checkpoints",
}

# What each layer holds, bottom to top (the layer names are tests/test_architecture.py's LAYERS).
LAYER_LINES = {
    "ground": "errors, machine facts, user-code loading, sandbox, the checkpoint directory format, preemption signals and their last-resort guard, progress",
    "config": "the config sections, their loading, and what each algorithm name presets",
    "tracking": "where a run's numbers go (metrics.jsonl, TensorBoard, MLflow, W&B)",
    "remote": "Ray call plumbing: where an actor is, its stacks, faults, the watchdog, redo",
    "models": "model directories: loading, the tiny-model factory, LoRA, the weight payload, GGUF import",
    "algorithms": "losses and advantages as pure tensor functions",
    "tasks": "built-in tasks and user datasets, the task registry",
    "rewards": "verifiers, reward functions, reward models, judges, composition",
    "training": "the trainer and its ranks, its checkpoint state, reference, critic, SFT, DPO, reward-model training, held-out greedy accuracy",
    "rollout": "engines, rollout workers, the fleet, weight sync, multi-turn episodes",
    "evals": "suites, scorers, comparison, the in-loop evaluator, alarms",
    "cost": "build vs buy and the on-call line",
    "topology": "sizing roles and laying them out on a cluster",
    "service": "`posttrain serve`: the Tinker-compatible training service (wire, seq_id queue, futures, LoRA backend)",
    "orchestration": "Ray runtime, roles in placement groups, the trainer group, re-forming roles, launch",
    "view": "the run page",
    "review": "blind review with your team",
    "top": "the run: loop, step, demo, probe (modules of the package root not in the ground layer)",
    "cli": "the `posttrain` command line: every command and command group, registered in one place",
}


def docstring_line(path: Path) -> str:
    """The first sentence of the docstring's first paragraph (it starts with the docstring's first line)."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except (SyntaxError, UnicodeDecodeError):
        return "(does not parse)"
    if not doc or not doc.strip():
        return "(no docstring)"
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.search(r"\.(\s|$)", paragraph)
    return paragraph[: m.start() + 1] if m else paragraph


def shorten(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    cut = text[: width - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def packages() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())


def package_line(name: str) -> str:
    line = docstring_line(PACKAGE / name / "__init__.py")
    if name in PACKAGE_LINES and (line == "(no docstring)" or line.rstrip(".").lower() == name):
        return PACKAGE_LINES[name]
    return shorten(line.rstrip("."), 100)


def layout_block() -> str:
    names = packages()
    width = max(len(n) for n in names) + 2
    top = [p.name for p in sorted(PACKAGE.glob("*.py")) if p.name != "__init__.py"]
    lines = ["```", "src/posttrain/"]
    lines += [f"  {(n + '/').ljust(width)}{package_line(n)}" for n in names]
    row, rows = "", []
    for name in top:
        if row and len(row) + len(name) + 2 > 100:
            rows.append(row)
            row = ""
        row = f"{row}  {name}" if row else name
    rows.append(row)
    lines += [f"  {('*.py' if i == 0 else '').ljust(width)}{r}" for i, r in enumerate(rows)]
    lines += ["```"]
    return "\n".join(lines)


def modules_block() -> str:
    lines = ["| module | what it holds (first line of its docstring) |", "|---|---|"]
    for path in modules():
        rel = path.relative_to(PACKAGE.parent).as_posix()
        lines.append(f"| `{rel}` | {shorten(docstring_line(path), 160).replace('|', '/')} |")
    return "\n".join(lines)


def architecture_test():
    spec = importlib.util.spec_from_file_location("test_architecture", ROOT / "tests" / "test_architecture.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "src"))
    spec.loader.exec_module(mod)
    return mod


def layers_block() -> str:
    arch = architecture_test()
    on_disk = set(packages())
    lines = ["| # | layer | holds | packages and modules |", "|---|---|---|---|"]
    for i, layer in enumerate(arch.LAYERS):
        if layer == "ground":
            what = ", ".join(f"`{g}`" for g in sorted(arch.GROUND) if g != "posttrain")
        elif layer == "top":
            what = "every other module of the package root (`loop.py`, `step.py`, `demo.py`, ...)"
        else:
            what = f"`{layer}/`" + ("" if layer in on_disk else " (not in the tree)")
        lines.append(f"| {i} | {layer} | {LAYER_LINES.get(layer, '')} | {what} |")
    lines.append("")
    lines.append(f"At most {arch.ALLOWED_UPWARD} imports may point up a layer; no import circles; no function in "
                 f"src/ over {arch.MAX_FUNCTION_LINES} lines.")
    return "\n".join(lines)


def config_block() -> str:
    from posttrain.config import config_reference_markdown

    return config_reference_markdown()


def perf_block() -> str:
    spec = importlib.util.spec_from_file_location("perf_report", ROOT / "benchmarks" / "perf_report.py")
    perf_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perf_report)
    return perf_report.markdown(json.loads(perf_report.RESULTS.read_text()))


BLOCKS = [  # (file, marker, builder)
    (CONFIG_DOC, "config-reference", config_block),
    (ARCHITECTURE_DOC, "layers", layers_block),
    (ARCHITECTURE_DOC, "modules", modules_block),
    (ROOT / "docs" / "performance.md", "perf", perf_block),
    (README, "layout", layout_block),
]


def replace_block(text: str, marker: str, body: str) -> str:
    pattern = rf"<!-- {marker}:start -->.*?<!-- {marker}:end -->"
    if not re.search(pattern, text, flags=re.S):
        raise ValueError(f"no <!-- {marker}:start/end --> markers")
    block = f"<!-- {marker}:start -->\n{body}\n<!-- {marker}:end -->"
    return re.sub(pattern, lambda _m: block, text, flags=re.S)


def stale() -> list[str]:
    """The blocks whose text differs from what the code and the tree give now, as 'file: marker'."""
    out = []
    for path, marker, build in BLOCKS:
        text = path.read_text()
        if replace_block(text, marker, build()) != text:
            out.append(f"{path.relative_to(ROOT)}: {marker}")
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        found = stale()
        for s in found:
            print(f"out of date: {s} (run `make readme`)")
        return 1 if found else 0
    for path, marker, build in BLOCKS:
        text = path.read_text()
        new = replace_block(text, marker, build())
        if new != text:
            path.write_text(new)
            print(f"updated {path.relative_to(ROOT)} ({marker})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
