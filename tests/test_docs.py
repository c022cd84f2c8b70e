"""The documentation belongs to the repository: every link in it resolves to a file (and heading)
of the repository, and nothing a user gets points outside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("bench/*.md")]
)
SHIPPED = (
    "README.md",
    "CHANGELOG.md",
    "docs",
    "ingest",
    "dashboards",
    "demo",
    "loopwatch",
    "loopwatch_client",
    "templates",
    "examples",
)

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def _links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_stays_in_the_repository_and_resolves(doc):
    broken = []
    for target in _links(doc):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if ROOT not in (path, *path.parents):
            broken.append(f"{target}: outside the repository")
        elif not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert broken == []


def test_the_docs_link_checker_sees_links():
    # Guards the test above against a pattern that silently matches nothing.
    assert "docs/trace-events.md" in _links(ROOT / "README.md")
    assert _slug(" How a run is processed") == "how-a-run-is-processed"


def test_nothing_shipped_names_the_shared_folder_beside_the_project():
    hits = []
    for top in SHIPPED:
        base = ROOT / top
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix not in {".md", ".py", ".html", ".json", ".txt", ".js", ".css"}:
                continue
            text = path.read_text(errors="replace")
            if "../shared" in text or "/work/shared" in text:
                hits.append(str(path.relative_to(ROOT)))
    assert hits == []
