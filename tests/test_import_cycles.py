"""No import cycle anywhere in the project, counting imports made inside
functions: a cycle hidden in a function body still ties two modules into one
unit that can be read, changed and tested only together."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Installed package name -> source folder (pyproject's package-dir mapping).
PACKAGE_DIRS = {"flightcheck.spec": "spec", "flightcheck.reference": "reference",
                "flightcheck.runtime": "runtime", "flightcheck.verification": "verification",
                "flightcheck": "flightcheck"}


def module_files() -> dict[str, Path]:
    """Every project module's dotted name -> its file (a package is its __init__)."""
    out: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            out.setdefault(name, path)
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, at any depth of its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from package import submodule` depends on the submodule (the
            # package's __init__ runs first, as for any submodule: no edge);
            # `from module import name` depends on the module.
            submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
            names = [a.name for a in node.names if f"{module}.{a.name}" not in known]
            targets = submodules + ([module] if names else [])
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = module_files()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    # verification.suite imports the Z3 rows only inside a function.
    assert "flightcheck.verification.z3.suite" in graph["flightcheck.verification.suite"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_import_cycle_between_modules():
    bad = cycles(import_graph())
    assert not bad, "import cycles: " + "; ".join(" <-> ".join(c) for c in bad)
