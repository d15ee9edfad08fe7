"""The package's layers point down: no import cycle among `nmt` modules, and the core packages
(data, models, decode) import nothing from training. Read from the source with `ast`, so an
import inside a function counts as much as one at the top of a file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nmt"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The `nmt` modules that module `name` imports anywhere in its source (packages as their `__init__`)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import: from the package, `level - 1` packages up
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_graph_sees_the_imports_it_should() -> None:
    # guards the walk itself: these edges are in the source (two of them inside functions)
    assert "nmt.checkpoint" in GRAPH["nmt.export"]
    assert "nmt.train.loop" in GRAPH["nmt.cli"]
    assert "nmt.data.tokenizer" in GRAPH["nmt.train.data"]
    assert len(GRAPH) > 40


def test_no_import_cycle_among_nmt_modules() -> None:
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> None:
        if name in path:
            cycle = path[path.index(name):] + [name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        path.append(name)
        for child in sorted(GRAPH[name]):
            visit(child)
        path.pop()
        done.add(name)

    for name in sorted(GRAPH):
        visit(name)


@pytest.mark.parametrize("package", ["nmt.data", "nmt.models", "nmt.decode"])
def test_core_packages_import_nothing_from_training(package: str) -> None:
    inside = {name for name in GRAPH if name == package or name.startswith(package + ".")}
    reached, todo = set(), list(inside)
    while todo:  # everything the package imports, directly or through other modules
        for child in GRAPH[todo.pop()] - reached:
            reached.add(child)
            todo.append(child)
    assert not {m for m in reached if m == "nmt.train" or m.startswith("nmt.train.")}, sorted(reached)
