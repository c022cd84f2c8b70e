"""The engine keeps its counts and sums bounded, whatever a stored event holds (issue 11, item 1).

The door refuses these values now (docs/limits.md), but events stored before it did, and callers
that skip it (replay of a file, the simulator), still reach the engine: its state must stay
serialisable and its detections storable (integer columns of 2**31-1, orjson's 64-bit integers).
"""

from __future__ import annotations

import math

import orjson
import pytest

from ingest.detection import Detection, Engine, RunState, replay_run
from ingest.detection.normalize import canonical, digest

MAX_COUNT = 2**31 - 1


def _event(kind: str, ts: str = "2026-11-29T10:00:00Z", **fields) -> dict:
    return {"type": kind, "run_id": "r1", "ts": ts, **fields}


def _storable(state: RunState, found: list[Detection]) -> None:
    """What the pipeline writes of them: the state as JSON, each detection in integer columns."""
    orjson.dumps(state.to_dict())
    for detection in found:
        orjson.dumps(detection.as_dict())
        for value in (detection.count, detection.at_call, detection.at_round):
            assert isinstance(value, int) and 0 <= value <= MAX_COUNT, detection


@pytest.mark.parametrize("cost", [1e308, math.inf, math.nan, -1e308, "12"])
def test_a_cost_past_every_cap_keeps_the_sums_finite(cost):
    events = [_event("run_started", budgets={"max_cost_usd": 5})]
    events += [_event("model_round", round=n, cost_usd=cost) for n in (1, 2, 3)]
    state, found = replay_run(events)
    assert math.isfinite(state.cost_usd) and state.cost_usd >= 0
    _storable(state, found)


def test_a_huge_cost_still_exhausts_the_cost_budget():
    events = [
        _event("run_started", budgets={"max_cost_usd": 5}),
        _event("model_round", round=1, cost_usd=1e308),
    ]
    state, found = replay_run(events)
    budget = [d for d in found if d.kind == "budget"]
    assert budget and budget[0].evidence["budget_type"] == "max_cost_usd" and budget[0].count >= 5
    assert state.terminated_by == "budget"
    _storable(state, found)


def test_a_start_in_1900_and_a_call_now_counts_the_wall_clock_within_an_integer_column():
    """The audit's trigger: ~4e9 seconds of wall clock overflowed Detection.count."""
    events = [
        _event("run_started", ts="1900-01-01T00:00:00Z"),
        _event("tool_call", ts="2026-11-29T10:00:00Z", round=1, call_id="c1", tool="t", args={}),
    ]
    state, found = replay_run(events)
    wall = [d for d in found if d.evidence.get("budget_type") == "max_wall_s"]
    assert wall and wall[0].count == MAX_COUNT
    _storable(state, found)


@pytest.mark.parametrize("ts", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:00:00-05:00"])
def test_years_at_the_ends_of_the_calendar_do_not_break_the_engine(ts):
    events = [_event("run_started"), _event("model_round", ts=ts, round=1), _event("user_message", text="hi")]
    state, found = replay_run(events)
    _storable(state, found)


def test_tokens_and_rounds_past_the_integer_columns_are_clamped():
    events = [
        _event("run_started", budgets={"max_tokens": 10}),
        _event("model_round", round=1e308, input_tokens=1e300, output_tokens=10**30),
        _event("tool_call", round=10**40, call_id="c1", tool="t", args={}),
    ]
    state, found = replay_run(events)
    assert found and 0 <= state.tokens <= 2**53
    _storable(state, found)


@pytest.mark.parametrize("value", [1e300, -1e300, 1.8e19, 2.0**64, 1e308])
def test_huge_integral_floats_in_arguments_have_a_digest(value):
    """canonical() wrote 1e300 as an int of 301 digits, which orjson refuses: every signature broke."""
    clean = canonical({"n": value, "nested": [value]})
    assert digest(clean) == digest(canonical({"n": value, "nested": [value]}))
    assert canonical({"n": 3.0}) == {"n": 3}  # small integral floats are still the same argument as ints
    engine, state = Engine(), RunState()
    for n in (1, 2, 3):
        engine.feed(state, _event("tool_call", round=n, call_id=f"c{n}", tool="t", args={"n": value}))
        found = engine.feed(state, _event("tool_result", call_id=f"c{n}", status="ok", result={"n": value}))
    _storable(state, found)


def test_detections_made_by_hand_are_clamped_too():
    detection = Detection(kind="budget", action="terminate", at_call=-3, at_round=2**40, count=float("inf"))
    assert (detection.at_call, detection.at_round, detection.count) == (0, MAX_COUNT, MAX_COUNT)
