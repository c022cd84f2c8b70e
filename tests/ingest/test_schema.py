"""Every validation branch of trace events v1, and agreement with the spec's JSON Schema."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import jsonschema
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.schema import TS_PATTERN, EventError, validate_event

SPEC_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "spec"
PACKAGED = Path(__file__).resolve().parents[2] / "ingest" / "spec" / "trace-events.schema.json"

TS = "2026-11-29T10:00:00Z"
GOOD = {
    "run_started": {
        "type": "run_started",
        "run_id": "r1",
        "ts": TS,
        "tenant": "acme",
        "agent": "shop",
        "task_type": "order_lookup",
        "backend": "openai",
        "model": "gpt-4o",
        "budgets": {"max_rounds": 10, "max_same_tool_retries": 0, "max_cost_usd": 0.5},
        "labels": {"env": "prod"},
    },
    "user_message": {"type": "user_message", "run_id": "r1", "ts": TS, "text": "where is my order?"},
    "model_round": {
        "type": "model_round",
        "run_id": "r1",
        "ts": TS,
        "round": 1,
        "input_tokens": 900,
        "output_tokens": 40,
        "cost_usd": 0.01,
        "text": "Let me look.",
    },
    "tool_call": {
        "type": "tool_call",
        "run_id": "r1",
        "ts": TS,
        "round": 1,
        "call_id": "c1",
        "tool": "search_orders",
        "kind": "read",
        "args": {"customer": "42"},
        "step_id": "s1",
        "operation_key": "acme:order:42:cancel:v1",
    },
    "tool_result": {
        "type": "tool_result",
        "run_id": "r1",
        "ts": TS,
        "call_id": "c1",
        "status": "ok",
        "result": {"orders": []},
        "result_truncated": False,
        "result_sha256": "a" * 64,
        "error_class": "empty_result",
        "latency_ms": 12.5,
        "external_request_id": "req-1",
    },
    "run_finished": {
        "type": "run_finished",
        "run_id": "r1",
        "ts": TS,
        "status": "truncated",
        "terminated_by": "budget",
        "budget_type": "max_tool_calls",
        "reason": "50 calls",
    },
}


def schema() -> dict:
    return orjson.loads(PACKAGED.read_bytes())


def _without_limits(value, key: str = ""):
    """The schema without what the packaged one adds to the spec's: the limits of docs/limits.md
    that JSON Schema can say (each number's maximum, the ts pattern) and the description."""
    if isinstance(value, dict):
        return {
            k: _without_limits(v, k)
            for k, v in value.items()
            if k != "maximum"
            and not (key == "ts" and k == "pattern")
            and not (key == "" and k == "description")
        }
    if isinstance(value, list):
        return [_without_limits(v) for v in value]
    return value


def test_packaged_schema_is_the_spec_with_the_limits():
    shared = SPEC_DIR / "trace-events.schema.json"
    if not shared.exists():
        pytest.skip("../shared/spec is not beside the project")
    spec = orjson.loads(shared.read_bytes())
    assert _without_limits(spec) == {k: v for k, v in spec.items() if k != "description"}, (
        "the spec grew limits of its own: compare them with ours"
    )
    assert _without_limits(schema()) == _without_limits(spec)
    assert schema()["properties"]["ts"]["pattern"] == TS_PATTERN


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_it_accepts_a_full_event_of_each_type(kind):
    event = copy.deepcopy(GOOD[kind])
    assert validate_event(event).year == 2026
    jsonschema.validate(event, schema())


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_it_keeps_unknown_fields(kind):
    event = {**copy.deepcopy(GOOD[kind]), "x_custom": {"a": 1}}
    validate_event(event)
    assert event["x_custom"] == {"a": 1}


def _error(event) -> tuple[str, str]:
    with pytest.raises(EventError) as info:
        validate_event(event)
    return info.value.field, info.value.reason


def _with(event_type: str, /, **changes) -> dict:
    event = copy.deepcopy(GOOD[event_type])
    for key, value in changes.items():
        if value is ...:
            event.pop(key)
        else:
            event[key] = value
    return event


def _nested(depth: int, *, key: str = "a", leaf=None) -> dict | list:
    """A value `depth` levels of objects (or arrays when key is "") deep."""
    value = leaf
    for _ in range(depth):
        value = {key: value} if key else [value]
    return value


BAD = [
    # envelope
    ([], "", "must be an object (an event), not an array"),
    (_with("user_message", type=...), "type", "is required"),
    (_with("user_message", type="tool_called"), "type", "must be one of"),
    (_with("user_message", type=3), "type", "must be one of"),
    (_with("user_message", run_id=...), "run_id", "is required"),
    (_with("user_message", run_id=""), "run_id", "must not be empty"),
    (_with("user_message", run_id="x" * 201), "run_id", "at most 200"),
    (_with("user_message", run_id=7), "run_id", "must be a string, not a number"),
    (_with("user_message", ts=...), "ts", "is required"),
    (_with("user_message", ts="yesterday"), "ts", "RFC 3339"),
    (_with("user_message", ts="2026-11-29T10:00:00"), "ts", "RFC 3339"),
    (_with("user_message", ts="2026-02-30T10:00:00Z"), "ts", "RFC 3339"),
    (_with("user_message", ts=1700000000), "ts", "RFC 3339"),
    (_with("user_message", event_id=""), "event_id", "must not be empty"),
    (_with("user_message", event_id="e" * 201), "event_id", "at most 200"),
    # run_started
    (_with("run_started", tenant=""), "tenant", "must not be empty"),
    (_with("run_started", agent=["a"]), "agent", "must be a string, not an array"),
    (_with("run_started", task_type=""), "task_type", "must not be empty"),
    (_with("run_started", backend="b" * 101), "backend", "at most 100"),
    (_with("run_started", model=None), "model", "must be a string, not null"),
    (_with("run_started", budgets=[]), "budgets", "must be an object"),
    (_with("run_started", budgets={"max_loops": 3}), "budgets.max_loops", "is not a budget"),
    (_with("run_started", budgets={"max_rounds": 0}), "budgets.max_rounds", "at least 1"),
    (_with("run_started", budgets={"max_tool_calls": 2.5}), "budgets.max_tool_calls", "must be an integer"),
    (_with("run_started", budgets={"max_tokens": True}), "budgets.max_tokens", "must be an integer"),
    (
        _with("run_started", budgets={"max_same_tool_retries": -1}),
        "budgets.max_same_tool_retries",
        "at least 0",
    ),
    (_with("run_started", budgets={"max_cost_usd": 0}), "budgets.max_cost_usd", "greater than 0"),
    (_with("run_started", budgets={"max_wall_s": "60"}), "budgets.max_wall_s", "must be a number"),
    (_with("run_started", labels=["a"]), "labels", "must be an object"),
    (_with("run_started", labels={"v": 2}), "labels.v", "must be a string"),
    # user_message
    (_with("user_message", text=...), "text", "is required"),
    (_with("user_message", text={"t": 1}), "text", "must be a string"),
    # model_round
    (_with("model_round", round=...), "round", "is required"),
    (_with("model_round", round=0), "round", "at least 1"),
    (_with("model_round", round="1"), "round", "must be an integer, not a string"),
    (_with("model_round", round=2**31), "round", "at most"),
    (_with("model_round", input_tokens=-1), "input_tokens", "at least 0"),
    (_with("model_round", output_tokens=1.5), "output_tokens", "must be an integer"),
    (_with("model_round", cost_usd=-0.1), "cost_usd", "at least 0"),
    (_with("model_round", cost_usd="0.1"), "cost_usd", "must be a number"),
    (_with("model_round", text=5), "text", "must be a string"),
    # tool_call
    (_with("tool_call", round=...), "round", "is required"),
    (_with("tool_call", call_id=...), "call_id", "is required"),
    (_with("tool_call", call_id=""), "call_id", "must not be empty"),
    (_with("tool_call", tool=...), "tool", "is required"),
    (_with("tool_call", tool="t" * 201), "tool", "at most 200"),
    (_with("tool_call", kind="delete"), "kind", "must be one of read, write, poll, other"),
    (_with("tool_call", args=...), "args", "is required"),
    (_with("tool_call", args=[1]), "args", "must be an object, not an array"),
    (_with("tool_call", args="{}"), "args", "must be an object, not a string"),
    (_with("tool_call", step_id=""), "step_id", "must not be empty"),
    (_with("tool_call", operation_key="k" * 501), "operation_key", "at most 500"),
    # tool_result
    (_with("tool_result", call_id=...), "call_id", "is required"),
    (_with("tool_result", status=...), "status", "is required"),
    (_with("tool_result", status="failed"), "status", "must be one of ok, error, timeout"),
    (_with("tool_result", result_truncated="yes"), "result_truncated", "must be a boolean"),
    (_with("tool_result", result_sha256="ABC"), "result_sha256", "64 lowercase hex"),
    (_with("tool_result", error_class="boom"), "error_class", "must be one of"),
    (_with("tool_result", latency_ms=-3), "latency_ms", "at least 0"),
    (_with("tool_result", external_request_id="r" * 501), "external_request_id", "at most 500"),
    # run_finished
    (_with("run_finished", status=...), "status", "is required"),
    (
        _with("run_finished", status="done"),
        "status",
        "must be one of succeeded, failed, truncated, abandoned",
    ),
    (
        _with("run_finished", terminated_by="timeout"),
        "terminated_by",
        "must be one of budget, loop, user, error",
    ),
    (_with("run_finished", budget_type=["x"]), "budget_type", "must be a string"),
    (_with("run_finished", reason=1), "reason", "must be a string"),
]
# The limits of docs/limits.md: numbers finite and capped, ts offsets and years, nesting.
LIMIT_BAD = [
    (_with("model_round", cost_usd=1e308), "cost_usd", "at most 1000000"),
    (_with("model_round", cost_usd=math.inf), "cost_usd", "must be a finite number"),
    (_with("model_round", cost_usd=math.nan), "cost_usd", "must be a finite number"),
    (_with("tool_result", latency_ms=1e300), "latency_ms", "at most 10000000000"),
    (_with("tool_result", latency_ms=math.inf), "latency_ms", "must be a finite number"),
    (_with("run_started", budgets={"max_cost_usd": 1e308}), "budgets.max_cost_usd", "at most 1000000000"),
    (_with("run_started", budgets={"max_wall_s": math.inf}), "budgets.max_wall_s", "must be a finite number"),
    (
        _with("user_message", ts="2026-11-29T10:00:00+20:00"),
        "ts",
        "offset must be within ±14:00 (got +20:00)",
    ),
    (
        _with("user_message", ts="2026-11-29T10:00:00-14:01"),
        "ts",
        "offset must be within ±14:00 (got -14:01)",
    ),
    (_with("user_message", ts="0001-01-01T00:00:00+01:00"), "ts", "between 2000 and 2100 (got 0001)"),
    (_with("user_message", ts="9999-12-31T23:00:00-05:00"), "ts", "between 2000 and 2100 (got 9999)"),
    (_with("user_message", ts="1900-01-01T00:00:00Z"), "ts", "between 2000 and 2100"),
    (_with("user_message", ts="1999-12-31T23:59:59Z"), "ts", "between 2000 and 2100"),
    (_with("user_message", ts="2101-01-01T00:00:00Z"), "ts", "between 2000 and 2100"),
    (_with("tool_call", args=_nested(65)), "args", "must not nest deeper than 64 levels"),
    (_with("tool_call", args=_nested(300)), "args", "must not nest deeper than 64 levels"),
    (_with("tool_call", args=_nested(1023, leaf=1)), "args", "must not nest deeper than 64 levels"),
    (_with("tool_result", result=_nested(65, key="")), "result", "must not nest deeper than 64"),
    (_with("tool_result", x_extra=_nested(65)), "x_extra", "must not nest deeper than 64 levels"),
]
BAD += LIMIT_BAD


@pytest.mark.parametrize(
    ("event", "field", "reason"), BAD, ids=[f"{b[1] or 'event'}-{i}" for i, b in enumerate(BAD)]
)
def test_it_names_the_field_and_the_reason(event, field, reason):
    got_field, got_reason = _error(event)
    assert got_field == field
    assert reason in got_reason


def test_integral_floats_count_as_integers_as_in_json_schema():
    event = _with("model_round", round=2.0, input_tokens=10.0)
    validate_event(event)
    assert event["round"] == 2 and isinstance(event["round"], int)


def test_the_result_may_be_any_json():
    for result in ("plain text", 3, None, [1, 2], {"a": {"b": []}}, _nested(64), _nested(64, key="")):
        validate_event(_with("tool_result", result=result))


@pytest.mark.parametrize(
    ("event", "field"),
    # JSON has no infinity or NaN (the schema never sees one), and JSON Schema cannot say a depth.
    [(b[0], b[1]) for b in LIMIT_BAD if "finite" not in b[2] and "nest deeper" not in b[2]],
)
def test_the_json_schema_says_the_same_limits(event, field):
    errors = list(jsonschema.Draft202012Validator(schema()).iter_errors(event))
    assert errors, f"{field} passes the JSON Schema"


def test_the_limits_themselves_are_accepted():
    """The edges of docs/limits.md are inside: a cap is a maximum, not an exclusive bound."""
    validate_event(_with("model_round", cost_usd=1_000_000))
    validate_event(_with("tool_result", latency_ms=1e10))
    validate_event(_with("run_started", budgets={"max_cost_usd": 1e9, "max_wall_s": 1e9}))
    validate_event(_with("tool_call", args=_nested(64)))
    validate_event(_with("tool_call", args={"n": 1e308, "m": -1e308}))  # free-form values: any finite number
    for ts in ("2000-01-01T00:00:00Z", "2100-12-31T23:59:59.999999Z", "2026-11-29T10:00:00+14:00"):
        assert validate_event(_with("user_message", ts=ts)).tzinfo is not None
    assert validate_event(_with("user_message", ts="2026-11-29T10:00:00-14:00")).utcoffset().days == -1


# --- agreement with the JSON Schema on generated events ---------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**31 - 1),
    st.floats(-5, 1e6, allow_nan=False),
    st.text(max_size=5),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def mutated_events(draw):
    kind = draw(st.sampled_from(sorted(GOOD)))
    event = copy.deepcopy(GOOD[kind])
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from([*sorted(event), "round", "args", "status", "budgets", "labels", "type"]))
        if draw(st.booleans()) and key in event:
            event.pop(key)
        else:
            event[key] = draw(json_values)
    return event


@settings(max_examples=400, deadline=None)
@given(mutated_events())
def test_it_agrees_with_the_json_schema(event):
    """Accepted by us <=> valid per the schema (ts format checked separately, ints capped at 2**31-1)."""
    schema_ok = jsonschema.Draft202012Validator(schema()).is_valid(event)
    try:
        validate_event(copy.deepcopy(event))
        ours_ok = True
    except EventError:
        ours_ok = False
    ts_ok = isinstance(event.get("ts"), str) and event.get("ts") == TS
    if not ts_ok:
        # The JSON Schema leaves `format` unchecked by default; we always check it.
        assert not ours_ok or schema_ok
        return
    assert ours_ok == schema_ok, event


# --- one source of the limits: the fast path, the full check and the schema at the schema's edges ----


def _edge_values(prop: dict) -> list:
    """Values at and just past each limit the schema states for one property, and of other types."""
    values: list = [None, True, [], {}, "x", 7, 2.5]
    if "enum" in prop:
        values += [*prop["enum"], "not-one-of-them"]
    kind = prop.get("type")
    if kind == "string":
        low, high = prop.get("minLength", 0), prop.get("maxLength")
        values += ["a" * low, "a" * max(low - 1, 0)]
        if high is not None:
            values += ["a" * high, "a" * (high + 1)]
        if "pattern" in prop:  # result_sha256 (ts is left out above)
            values += ["0" * 64, "a" * 64, "A" * 64, "a" * 63]
    if kind in ("integer", "number"):
        for bound in ("minimum", "exclusiveMinimum", "maximum"):
            if bound in prop:
                edge = prop[bound]
                values += [edge, edge - 1, edge + 1, float(edge), edge - 0.5, edge + 0.5]
    if kind == "boolean":
        values += [False, 0, 1]
    return values


def _schema_edges() -> list[tuple[str, str, object]]:
    """(event type, field path, value) for every property of every event type in the schema."""
    spec = schema()
    by_type = {clause["if"]["properties"]["type"]["const"]: clause["then"] for clause in spec["allOf"]}
    cases = []
    for kind in GOOD:
        props = {**spec["properties"], **by_type[kind].get("properties", {})}
        for name, prop in props.items():
            if name in ("type", "ts"):
                continue  # the type picks the checks; ts has tests of its own above
            cases += [(kind, name, value) for value in _edge_values(prop)]
            for inner, inner_prop in prop.get("properties", {}).items():  # budgets
                cases += [(kind, f"{name}.{inner}", value) for value in _edge_values(inner_prop)]
    return cases


def _set(event: dict, path: str, value) -> dict:
    event = copy.deepcopy(event)
    target = event
    *parents, last = path.split(".")
    for name in parents:
        target = target.setdefault(name, {})
    target[last] = copy.deepcopy(value)
    return event


def test_the_fast_path_and_the_full_check_agree_with_the_schema_at_its_edges():
    """The limits live in three places on purpose (the schema for clients, the full check for the
    messages, the fast path for speed): every edge the shipped schema states is tried on all three.
    The fast path may decline an event (the full check then decides) but never accept a wrong one."""
    from ingest.schema import _fast_path, _validate_event

    validator = jsonschema.Draft202012Validator(schema())
    disagreements = []
    fast_took = 0
    cases = _schema_edges()
    for kind, path, value in cases:
        event = _set(GOOD[kind], path, value)
        schema_ok = validator.is_valid(event)
        try:
            _validate_event(copy.deepcopy(event))
            full_ok = True
        except EventError:
            full_ok = False
        try:
            validate_event(copy.deepcopy(event))
            ours_ok = True
        except EventError:
            ours_ok = False
        fast_ok = _fast_path(copy.deepcopy(event)) is not None
        fast_took += fast_ok
        if not (schema_ok == full_ok == ours_ok) or (fast_ok and not full_ok):
            disagreements.append((kind, path, value, schema_ok, full_ok, fast_ok))
    assert not disagreements
    assert len(cases) > 300 and fast_took > 50  # the edges were generated, and the fast path was tried
