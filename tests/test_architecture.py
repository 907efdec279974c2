"""The import graph of src/posttrain: no circles, at most 3 imports that point down-to-up, no long functions.

The layers, bottom to top, are docs/architecture.md's; scripts/import_graph.py reads the graph (every import,
also those inside functions). A new circle fails here with its modules named.
"""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

# Bottom to top. A module of the package root not named here is at the top (the run: loop, step, demo, ...); the
# command line (cli/) sits above it, since its commands call the run.
GROUND = {"posttrain", "errors", "machine", "usercode", "sandbox", "checkpoint", "preemption", "stop_guard", "progress",
          "probe_stats"}
# rollout sits below training: the trainers read rollout's records (rollout/trajectory.py), and nothing in rollout/
# imports training/ (the step that joins them is at the top, step.py).
LAYERS = ["ground", "config", "tracking", "remote", "models", "algorithms", "tasks", "rewards", "rollout",
          "training", "evals", "cost", "topology", "orchestration", "view", "review", "service", "top",
          "cli"]
ALLOWED_UPWARD = 3  # the ceiling; there are none today
MAX_FUNCTION_LINES = 80


def layer_of(module: str) -> int:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "posttrain"
    if name in LAYERS:
        return LAYERS.index(name)
    return LAYERS.index("ground") if name in GROUND else LAYERS.index("top")


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((source, target) for source, targets in graph.items() for target in targets
                  if layer_of(target) > layer_of(source))


def test_every_package_of_src_has_a_layer():
    packages = {m.split(".")[1] for m in import_graph.module_files() if m.count(".") >= 1}
    subpackages = {p for p in packages if (import_graph.SRC / "posttrain" / p).is_dir()}
    assert subpackages <= set(LAYERS), f"packages without a layer in LAYERS: {sorted(subpackages - set(LAYERS))}"


def test_the_import_graph_has_no_circles():
    found = import_graph.circles(import_graph.import_graph())
    assert not found, "import circles (each a set of modules that import each other in a loop):\n" + "\n".join(
        "  " + " <-> ".join(circle) for circle in found)


def test_at_most_three_imports_point_up_a_layer():
    upward = upward_imports(import_graph.import_graph())
    assert len(upward) <= ALLOWED_UPWARD, f"{len(upward)} imports point up a layer (at most {ALLOWED_UPWARD}):\n" + \
        "\n".join(f"  {s} -> {t}" for s, t in upward)


def test_no_function_in_src_is_over_80_lines():
    long = import_graph.longest_functions(limit=MAX_FUNCTION_LINES)
    assert not long, "functions over 80 lines:\n" + "\n".join(f"  {n} lines: {name}" for n, name in long)


def test_the_checker_finds_a_planted_circle(tmp_path):
    package = tmp_path / "posttrain"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("from posttrain.low.b import g\n\ndef f():\n    return g()\n")
    (package / "low" / "b.py").write_text("def g():\n    from posttrain.low import a  # hidden in a function\n")
    (package / "top.py").write_text("import posttrain.low.a\n")
    graph = import_graph.import_graph(tmp_path)
    assert import_graph.circles(graph) == [["posttrain.low.a", "posttrain.low.b"]]
    assert graph["posttrain.top"] == {"posttrain.low.a"}
