"""docs/detection.md's table of thresholds says what `Thresholds` says: every name, every default."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from ingest.detection import Thresholds

DOC = Path(__file__).resolve().parents[3] / "docs" / "detection.md"


def _table() -> dict[str, str]:
    text = DOC.read_text()
    body = text.split("<!-- thresholds:start -->")[1].split("<!-- thresholds:end -->")[0]
    rows = {}
    for line in body.strip().splitlines()[2:]:  # past the header and its rule
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1]
    return rows


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def test_the_docs_table_lists_every_threshold_with_its_default():
    table = _table()
    defaults = Thresholds()
    names = [f.name for f in fields(defaults)]
    assert list(table) == names, "the table's rows, in the dataclass's order"
    wrong = {name: (table[name], _shown(getattr(defaults, name))) for name in names}
    assert {n: v for n, v in wrong.items() if v[0] != v[1]} == {}
