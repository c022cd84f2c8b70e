"""The engine keeps its counts and sums bounded, whatever a stored event holds (issue 11, item 1).

The door refuses these values now (docs/limits.md), but events stored before it did, and callers
that skip it (replay of a file, the simulator), still reach the engine: its state must stay
serialisable and its detections storable (integer columns of 2**31-1, orjson's 64-bit integers).
"""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

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


# --- bounded work per event: fuzzy matching sees a bounded view of long values ---------------------


def _long_text(seed: int, chars: int = 240 * 1024) -> str:
    import random

    rng = random.Random(seed)
    words = [f"w{rng.randrange(5000)}" for _ in range(chars // 5)]
    return " ".join(words)[:chars]


def test_fuzzy_view_is_bounded_and_short_texts_are_themselves():
    from ingest.detection.normalize import FUZZY_CHARS, fuzzy_view

    assert fuzzy_view("find order 42") == "find order 42"
    text = _long_text(1)
    view = fuzzy_view(text)
    assert len(view) <= FUZZY_CHARS + 18
    assert view.startswith(text[:200]) and view.endswith(text[-200:])
    assert fuzzy_view(text[:-1] + "!") != view  # the hash sees the whole


def test_long_arguments_are_compared_on_their_view():
    from ingest.detection.calls import _value_similarity, similar

    body = _long_text(2)
    assert _value_similarity(body, body) == 1.0
    nudged = _value_similarity(f"a {body} a", f"b {body} b")
    assert 0.9 < nudged < 1.0  # alike at both ends, not the same
    assert _value_similarity(body, _long_text(3)) < 0.8
    assert similar({"query": f"a {body}"}, {"query": f"b {body}"}, 0.85)


def test_long_texts_are_alike_on_their_view_and_the_state_keeps_the_view():
    from ingest.detection.text import TEXT_PREFIX, alike

    body = _long_text(4)
    assert alike(f"{body} order?", f"{body} order number?", 0.85)
    assert not alike(body, _long_text(5), 0.85)
    state, _ = replay_run([_event("run_started"), _event("model_round", round=1, text=f"{body}?")])
    assert state.questions and all(len(question[0]) <= TEXT_PREFIX for question in state.questions)
    assert len(orjson.dumps(state.to_dict())) < 8 * 1024


@given(
    st.text(
        alphabet=st.sampled_from(" \t\n\r\x0b\x0c\x1c\x1d\x85\xa0\u1680\u2000\u2028\u3000ab?."), max_size=40
    )
)
def test_whitespace_is_collapsed_as_the_regular_expression_did(text):
    import re

    assert canonical(text) == re.sub(r"\s+", " ", text.strip())


@given(st.text(alphabet=st.sampled_from(" \t\n\x85\xa0\u3000aBé?.,!-_'"), max_size=40))
def test_text_keys_are_what_the_regular_expressions_made(text):
    import re

    from ingest.detection.normalize import text_key

    assert text_key(text) == re.sub(r"\s+", " ", re.sub(r"[^\w\s?]", " ", text.casefold())).strip()
