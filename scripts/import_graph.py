"""The import graph of src/posttrain: circles, imports that point up a layer, longest functions.

`python scripts/import_graph.py` prints all three; tests/test_architecture.py asserts on them. Every import
counts, also those inside functions (they are how circles hide) and those under `if TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "posttrain"


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Module name -> file, for every .py file under src/posttrain."""
    modules = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that `name` is or lies inside (a from-import may name a function)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the posttrain modules it imports (a package's __init__ counts as the package)."""
    modules = module_files(src)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = set()
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                target = _resolve(name, modules)
                # `from posttrain.x import y` where y is a submodule imports both; the package itself only
                # when it is what the import names.
                if target and target != module:
                    targets.add(target)
        graph[module] = targets
    for module in graph:  # a from-import of a submodule also names its package: keep only the deepest
        graph[module] = {t for t in graph[module] if not any(o != t and o.startswith(t + ".") and
                                                             _names_submodule(module, t, o, src) for o in graph[module])}
    return graph


def _names_submodule(module: str, package: str, sub: str, src: Path) -> bool:
    """True when `module` reaches `package` only as the parent of `sub` (from package import sub)."""
    path = module_files(src)[module]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            leaf = sub[len(package) + 1:].split(".")[0]
            if all(alias.name == leaf for alias in node.names):
                return True
        if isinstance(node, ast.Import) and any(a.name == package for a in node.names):
            return False
    return False


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted, largest first."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found, key=lambda c: (-len(c), c))


def longest_functions(src: Path = SRC, limit: int = 80) -> list[tuple[int, str]]:
    """(lines, "module:qualname") of every function longer than `limit` lines, longest first."""
    found = []
    for module, path in module_files(src).items():
        tree = ast.parse(path.read_text())

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        length = child.end_lineno - child.lineno + 1
                        if length > limit:
                            found.append((length, f"{module}:{name}"))
                    walk(child, name + ".")

        walk(tree, "")
    return sorted(found, reverse=True)


def main() -> int:
    graph = import_graph()
    found = circles(graph)
    print(f"{len(graph)} modules, {sum(len(t) for t in graph.values())} imports, {len(found)} circles")
    for component in found:
        print(f"  circle of {len(component)}: " + " <-> ".join(component))
    long = longest_functions()
    print(f"{len(long)} functions over 80 lines")
    for length, name in long:
        print(f"  {length:4d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
