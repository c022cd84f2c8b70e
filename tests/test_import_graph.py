"""The modules of ingest/ and dashboards/ import each other without a cycle.

Read from the source with ast, not by importing: an edge is an import a module runs when it is
loaded (not one inside a function, nor under `if TYPE_CHECKING:`). `from a.b import c` is an edge
to the module a.b.c when there is one, else to a.b; importing a.b.c loads the packages a and a.b
too, so those are edges as well, unless the importer lies inside them (they are loading already).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ingest", "dashboards")


def modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, whether it is a package's __init__)}."""
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, *, nested: bool):
    """The Import and ImportFrom nodes run at load time (with nested: those in functions too)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and not nested:
                continue
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            stack.append(child)


def import_graph(packages: tuple[str, ...] = PACKAGES, *, nested: bool = False) -> dict[str, set[str]]:
    known = modules(packages)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, (path, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text()), nested=nested):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in known:  # `import a.b.c` of a name inside a module
                    target = target.rpartition(".")[0]
                if not target:
                    continue
                loading = set(_ancestors(name))
                for module in [*_ancestors(target), target]:
                    if module in known and module != name and module not in loading:
                        graph[name].add(module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_ingest_and_dashboards_import_without_cycles():
    assert cycles(import_graph()) == []


def test_the_check_finds_a_cycle(tmp_path, monkeypatch):
    package = tmp_path / "loop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from loop.b import f\n")
    (package / "b.py").write_text("def f():\n    from loop import a\n")
    (package / "c.py").write_text("from loop import d\n")
    (package / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from loop import c\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert cycles(import_graph(("loop",))) == []  # in a function, or for the type checker only
    assert cycles(import_graph(("loop",), nested=True)) == [["loop.a", "loop.b"]]
    (package / "d.py").write_text("import loop.c\n")
    assert cycles(import_graph(("loop",))) == [["loop.c", "loop.d"]]
