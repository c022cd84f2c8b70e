"""Rollout modes per kind: shadow records what it would have done, correct-only never escalates."""

from __future__ import annotations

import pytest

from ingest.detection import Config, Thresholds, replay_run
from ingest.detection.config import MODES
from ingest.detection.policy import KINDS
from tests.ingest.detection.runs import RunBuilder, interventions


def _looping() -> RunBuilder:
    run = RunBuilder()
    for _ in range(8):
        run.call("search_orders", {"customer": "42"}, {"orders": []})
    return run


def test_full_escalates_correct_only_stops_at_correct_shadow_never_intervenes():
    run = _looping()
    full = [(d.kind, d.action) for d in interventions(run.detect())]
    assert full[:3] == [
        ("exact_repeat", "correct"),
        ("exact_repeat", "handoff"),
        ("exact_repeat", "terminate"),
    ]
    capped = interventions(run.detect(mode_exact_repeat="correct-only"))
    assert {d.action for d in capped} == {"correct"} and len(capped) == 3
    assert [d.evidence.get("capped") for d in capped] == [None, "handoff", "terminate"]
    state, found = replay_run(run.events, Config(thresholds=Thresholds(mode_exact_repeat="shadow")))
    assert interventions(found) == [] and not state.terminated_by and state.max_action == 1
    shadowed = [d for d in found if "shadow" in d.evidence]
    # Stored as observe, saying what full would have done, with the hint it would have given.
    assert [d.evidence["shadow"] for d in shadowed] == ["correct", "handoff", "terminate"]
    assert all(d.action == "observe" and d.hint for d in shadowed)


def test_every_kind_has_a_mode_and_a_kind_without_one_is_in_shadow():
    t = Thresholds()
    assert all(t.mode(kind) in MODES for kind in KINDS)
    assert t.mode("a_kind_added_later") == "shadow"


@pytest.mark.parametrize("value", ["off", 1, True, None])
def test_a_mode_must_be_one_of_the_modes(value):
    with pytest.raises(ValueError, match="mode_clarification: must be one of shadow, correct-only, full"):
        Thresholds().merged({"mode_clarification": value})
