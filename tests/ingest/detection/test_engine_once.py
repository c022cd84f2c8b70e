"""One event fires a problem once (the pipeline stores one detection per event, kind and signature)."""

from __future__ import annotations

from ingest.detection.engine import _strongest_each
from ingest.detection.policy import Detection


def _d(kind: str, action: str, signature: str = "") -> Detection:
    return Detection(kind=kind, action=action, at_call=0, at_round=4, count=2, signature=signature)


def test_two_findings_of_one_problem_at_one_event_are_the_stronger_in_the_first_ones_place():
    found = [_d("clarification", "correct"), _d("budget", "observe"), _d("clarification", "handoff")]
    assert [(d.kind, d.action) for d in _strongest_each(found)] == [
        ("clarification", "handoff"),
        ("budget", "observe"),
    ]


def test_findings_of_other_signatures_or_kinds_are_all_kept():
    found = [
        _d("exact_repeat", "correct", "a"),
        _d("exact_repeat", "correct", "b"),
        _d("monologue", "correct"),
    ]
    assert len(_strongest_each(found)) == 3
