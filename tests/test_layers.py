"""Dependencies point one way: dashboards may import ingest, the demo may import both, and nothing
imports upwards (ingest never imports dashboards or the demo; dashboards never the demo)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "ingest": ("dashboards", "demo"),
    "dashboards": ("demo",),
    "loopwatch_client": ("ingest", "dashboards", "demo"),
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_imports_upwards(package):
    upward = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in FORBIDDEN[package]:
                upward.append(f"{path.relative_to(ROOT)}: {name}")
    assert upward == []
