"""The span-to-event mapping and the OTLP envelope as bare functions: no database, no server."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ingest.otlp import mapping
from ingest.otlp.mapping import (
    AGENT,
    LLM,
    TOOL,
    KnownRun,
    SpanIn,
    SpanPlan,
    _failure,
    events_build,
    run_id_sources,
    span_role,
    spans_plan,
    tool_args,
    ts_text,
)
from ingest.otlp.wire import OtlpError, decompress, status_encode
from ingest.schema import find_nul, validate_event

ROOT = Path(__file__).resolve().parents[2]


def span(attrs: dict, **fields) -> SpanIn:
    values = {
        "path": "resourceSpans[0].scopeSpans[0].spans[0]",
        "trace_id": "ab" * 16,
        "span_id": "cd" * 8,
        "parent_id": "ef" * 8,
        "name": "s",
        "start_ns": 1_795_950_000 * 10**9,
        "end_ns": 1_795_950_001 * 10**9,
        "attrs": attrs,
        "resource": {},
        "status_code": 0,
        "status_message": "",
        "exceptions": [],
    }
    return SpanIn(**{**values, **fields})


@pytest.mark.parametrize(
    ("raw", "sources"),
    [
        ("trace_id", ("trace_id",)),
        (
            "conversation",
            (
                "gen_ai.conversation.id",
                "session.id",
                "traceloop.association.properties.session_id",
                "trace_id",
            ),
        ),
        ("app.run_id", ("app.run_id", "trace_id")),
        (" app.run_id , session.id,trace_id ", ("app.run_id", "session.id", "trace_id")),
    ],
)
def test_run_id_sources_always_end_with_the_trace_id(raw, sources):
    assert run_id_sources(raw) == sources


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "must not be empty"),
        ("session.id,,trace_id", "holds an empty item"),
        ("trace_id,session.id", "trace_id must come last"),
        ("run id", "'run id' is not an attribute name"),
    ],
)
def test_run_id_sources_refuse_what_cannot_work(raw, reason):
    with pytest.raises(ValueError, match=reason):
        run_id_sources(raw)


def test_a_bad_run_id_setting_stops_start_up_naming_the_variable():
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "loopwatch.settings",
            "LOOPWATCH_OTLP_RUN_ID": "trace_id,session.id",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert (
        "ImproperlyConfigured: LOOPWATCH_OTLP_RUN_ID='trace_id,session.id': trace_id must come last"
        in done.stderr
    )


@pytest.mark.parametrize(
    ("attrs", "role"),
    [
        ({"gen_ai.operation.name": "execute_tool"}, TOOL),
        ({"gen_ai.operation.name": "chat"}, LLM),
        ({"gen_ai.operation.name": "invoke_agent"}, AGENT),
        ({"gen_ai.operation.name": "embeddings", "gen_ai.usage.input_tokens": 5}, None),
        ({"openinference.span.kind": "TOOL"}, TOOL),
        ({"openinference.span.kind": "llm"}, LLM),
        ({"openinference.span.kind": "CHAIN"}, AGENT),
        ({"openinference.span.kind": "RETRIEVER"}, None),
        ({"traceloop.span.kind": "tool"}, TOOL),
        ({"traceloop.span.kind": "task"}, None),
        ({"llm.request.type": "chat", "gen_ai.system": "openai"}, LLM),
        ({"gen_ai.system": "openai", "gen_ai.usage.prompt_tokens": 3}, LLM),
        ({"http.request.method": "GET"}, None),
    ],
)
def test_span_roles_across_the_three_dialects(attrs, role):
    assert span_role(span(attrs)) == role


@pytest.mark.parametrize(
    ("attrs", "args"),
    [
        ({"gen_ai.tool.call.arguments": '{"a": 1}'}, {"a": 1}),
        ({"gen_ai.tool.call.arguments": "not json"}, {"input": "not json"}),
        ({"gen_ai.tool.call.arguments": "[1, 2]"}, {"input": [1, 2]}),
        (
            {"tool.parameters": '{"type": "object", "properties": {}}', "input.value": '{"q": "x"}'},
            {"q": "x"},
        ),
        ({"tool.parameters": '{"type": "object", "properties": {}}'}, None),
        (
            {"traceloop.span.kind": "tool", "traceloop.entity.input": '{"args": [1], "kwargs": {"k": 2}}'},
            {"k": 2, "args": [1]},
        ),
        ({}, None),
    ],
)
def test_tool_arguments(attrs, args):
    assert tool_args(span(attrs))[0] == args


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"status_code": 1, "exceptions": [{"exception.type": "ValueError"}]}, None),
        ({"status_code": 2, "status_message": "boom"}, ("error", "other", "boom")),
        (
            {"exceptions": [{"exception.type": "TimeoutError", "exception.message": "30 s"}]},
            ("timeout", "other", "TimeoutError: 30 s"),
        ),
        ({"attrs": {"error.type": "timeout"}}, ("timeout", "other", "timeout")),
        (
            {"status_code": 2, "exceptions": [{"exception.type": "openai.RateLimitError"}]},
            ("error", "rate_limited", "openai.RateLimitError"),
        ),
        (
            {"status_code": 2, "exceptions": [{"exception.type": "PermissionError"}]},
            ("error", "permission", "PermissionError"),
        ),
        (
            {"status_code": 2, "exceptions": [{"exception.type": "FileNotFoundError"}]},
            ("error", "not_found", "FileNotFoundError"),
        ),
        (
            {"status_code": 2, "exceptions": [{"exception.type": "json.JSONDecodeError"}]},
            ("error", "parse_error", "json.JSONDecodeError"),
        ),
        (
            {"status_code": 2, "exceptions": [{"exception.type": "ValueError"}]},
            ("error", "invalid_argument", "ValueError"),
        ),
        (
            {"status_code": 2, "exceptions": [{"exception.type": "ConnectionResetError"}]},
            ("error", "transient", "ConnectionResetError"),
        ),
        ({"status_code": 2, "attrs": {"error.type": "500"}}, ("error", "transient", "500")),
        (
            {"status_code": 2, "attrs": {"loopwatch.error_class": "empty_result"}},
            ("error", "empty_result", "error"),
        ),
    ],
)
def test_span_failures_become_status_and_error_class(fields, expected):
    assert _failure(span(fields.pop("attrs", {}), **fields)) == expected


def test_timestamps_keep_microseconds_in_utc():
    assert ts_text(1_795_950_000_123_456_789) == "2026-11-29T11:00:00.123456Z"


def test_tool_calls_take_the_round_of_the_last_llm_span_started_before_them():
    def plan(index: int, role: str, start: int, end: int, **attrs) -> SpanPlan:
        item = span(attrs, span_id=f"{index + 1:016x}", start_ns=start * 10**6, end_ns=end * 10**6)
        return SpanPlan(span=item, index=index, role=role, run_id="r", tool="t" if role == TOOL else "")

    plans = [
        plan(0, TOOL, 5, 6),  # before any round of this export: the run's last stored round
        plan(1, LLM, 10, 20),
        plan(2, TOOL, 21, 25),
        plan(3, TOOL, 22, 24),  # parallel with the one before: same round
        plan(4, LLM, 30, 40),
        plan(5, TOOL, 41, 42),
    ]
    built = events_build(
        plans,
        runs={"r": KnownRun("a", "openai", "m", rounds=4)},
        tool_kinds={"t": "read"},
        max_event_bytes=10**6,
    )
    rounds = [(e["type"], e.get("round")) for e in built.events if e["type"] in ("model_round", "tool_call")]
    assert rounds == [
        ("tool_call", 4),
        ("model_round", 5),
        ("tool_call", 5),
        ("tool_call", 5),
        ("model_round", 6),
        ("tool_call", 6),
    ]
    assert all(e["kind"] == "read" for e in built.events if e["type"] == "tool_call")
    assert not any(e["type"] == "run_started" for e in built.events)  # a known run, fully described


def test_decompression_is_bounded():
    assert decompress(gzip.compress(b"x" * 1000), "gzip", 1000) == b"x" * 1000
    assert decompress(zlib.compress(b"y" * 10), "deflate", 100) == b"y" * 10
    with pytest.raises(OtlpError) as refused:
        decompress(gzip.compress(b"x" * 1001), "gzip", 1000)
    assert refused.value.status == 413


def test_the_status_message_is_a_google_rpc_status():
    from google.rpc.status_pb2 import Status

    message = "body: " + "é" * 200
    status = Status.FromString(status_encode("protobuf", 400, message))
    assert (status.code, status.message) == (3, message)


def test_a_conversation_id_on_one_span_names_the_run_of_the_whole_trace():
    root = span({"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-1"}, parent_id="")
    tool = span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}, span_id="12" * 8)
    other = span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}, trace_id="99" * 16)
    plans = spans_plan([tool, root, other], run_id_sources("conversation"))
    assert [(p.run_id, p.run_from_trace) for p in plans] == [
        ("conv-1", False),
        ("conv-1", False),
        ("99" * 16, True),
    ]
    built = events_build(plans, runs={}, tool_kinds={}, max_event_bytes=10**6)
    # A conversation goes on after a turn: its root span does not finish the run.
    assert not any(e["type"] == "run_finished" for e in built.events)


def test_a_trace_without_agent_semantics_makes_no_run_but_ends_a_known_one():
    http_root = span({"http.request.method": "POST"}, parent_id="")
    plans = spans_plan([http_root], run_id_sources("trace_id"))
    built = events_build(plans, runs={}, tool_kinds={}, max_event_bytes=10**6)
    # No run yet: the root span waits for the export that starts it (it may end an agent's run).
    assert built.events == [] and built.waiting == [0]
    started = 1_795_949_000 * 10**6  # before the root span started: no run_started for it
    known = {"ab" * 16: KnownRun("a", "openai", "m", rounds=2, started_us=started)}
    failed = span({}, parent_id="", status_code=2, status_message="agent crashed")
    built = events_build(
        spans_plan([failed], run_id_sources("trace_id")), runs=known, tool_kinds={}, max_event_bytes=10**6
    )
    assert [(e["type"], e["status"], e["terminated_by"], e["reason"]) for e in built.events] == [
        ("run_finished", "failed", "error", "agent crashed")
    ]


def test_a_run_id_attribute_too_long_refuses_the_trace_naming_it():
    plans = spans_plan(
        [span({"session.id": "s" * 201, "openinference.span.kind": "TOOL"})], ("session.id", "trace_id")
    )
    assert str(plans[0].problem) == "session.id: must be at most 200 characters to be a run id (got 201)"


def test_a_failed_model_call_without_usage_is_no_round():
    plans = spans_plan(
        [
            span({"gen_ai.operation.name": "chat"}, status_code=2, span_id="01" * 8),
            span(
                {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 9},
                status_code=2,
                span_id="02" * 8,
            ),
            span({"gen_ai.operation.name": "chat"}, span_id="03" * 8),
        ],
        ("trace_id",),
    )
    built = events_build(plans, runs={}, tool_kinds={}, max_event_bytes=10**6)
    assert [(e["round"], e["otel_span_id"]) for e in built.events if e["type"] == "model_round"] == [
        (1, "02" * 8),
        (2, "03" * 8),
    ]


# Every attribute the mapping reads, with values of any shape an exporter can send.
_KEYS = sorted(
    {
        *mapping.TOOL_NAME,
        *mapping.TOOL_ARGS,
        *mapping.TOOL_RESULT,
        *mapping.TOOL_CALL_ID,
        *mapping.PROVIDER,
        *mapping.MODEL,
        *mapping.INPUT_TOKENS,
        *mapping.OUTPUT_TOKENS,
        *mapping.AGENT_NAME,
        *mapping.CONVERSATION_ATTRIBUTES,
        "gen_ai.operation.name",
        "openinference.span.kind",
        "traceloop.span.kind",
        "traceloop.entity.name",
        "traceloop.entity.input",
        "traceloop.entity.output",
        "llm.request.type",
        "llm.output_messages.0.message.content",
        "gen_ai.output.messages",
        "gen_ai.tool.type",
        "error.type",
        "http.response.status_code",
        *("loopwatch.task_type", "loopwatch.tool.kind", "loopwatch.error_class"),
        *("loopwatch.operation_key", "loopwatch.step_id"),
    }
)
_SCALARS = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "execute_tool",
            "chat",
            "invoke_agent",
            "TOOL",
            "LLM",
            "tool",
            "workflow",
            "{}",
            '{"a": "\\u0000"}',
            '[{"parts": 5}]',
            '[{"parts": [{"type": "text", "content": 1}]}]',
            '{"args": 1, "kwargs": 2}',
            "-1",
            "12",
        ]
    ),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True),
    st.booleans(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@given(
    spans=st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=8),
            st.integers(0, 2),
            st.booleans(),
            st.lists(
                st.dictionaries(st.sampled_from(["exception.type", "exception.message"]), _VALUES), max_size=2
            ),
        ),
        min_size=1,
        max_size=6,
    ),
    sources=st.sampled_from(["trace_id", "conversation"]),
)
@hsettings(max_examples=150, deadline=None)
def test_any_attribute_values_give_valid_events_or_a_named_refusal(spans, sources):
    items = [
        span(
            attrs,
            span_id=f"{i + 1:016x}",
            parent_id="" if root else "ef" * 8,
            status_code=code,
            exceptions=exc,
        )
        for i, (attrs, code, root, exc) in enumerate(spans)
    ]
    plans = spans_plan(items, run_id_sources(sources))
    built = events_build(plans, runs={}, tool_kinds={}, max_event_bytes=256 * 1024)
    for event in built.events:
        validate_event(event)
        assert find_nul(event) is None
    for refusal in built.refused.values():
        assert refusal.field and refusal.reason


def _plans(*items: SpanIn) -> list[SpanPlan]:
    return spans_plan(list(items), run_id_sources("trace_id"))


CHAT = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10}


def test_a_refused_model_span_takes_no_round_number():
    plans = _plans(
        span(CHAT, span_id="01" * 8, start_ns=1_795_950_000 * 10**9),
        span(
            {**CHAT, "gen_ai.usage.input_tokens": -1}, span_id="02" * 8, start_ns=1_795_950_000 * 10**9 + 1000
        ),
        span(CHAT, span_id="03" * 8, start_ns=1_795_950_000 * 10**9 + 2000),
    )
    built = events_build(plans, runs={}, tool_kinds={}, max_event_bytes=10**6)
    assert list(built.refused) == [1]
    rounds = [(e["round"], e["otel_span_id"]) for e in built.events if e["type"] == "model_round"]
    assert rounds == [(1, "01" * 8), (2, "03" * 8)]  # no gap: `rounds` counts what is stored


def test_model_spans_stored_before_take_no_new_number_and_a_span_twice_is_once():
    first, second = (
        span(CHAT, span_id="01" * 8),
        span(CHAT, span_id="02" * 8, start_ns=1_795_950_000 * 10**9 + 5),
    )
    known = {
        "ab" * 16: KnownRun("a", "openai", "m", rounds=3, started_us=0, stored_rounds=frozenset({"01" * 8}))
    }
    built = events_build(_plans(first, second, second), runs=known, tool_kinds={}, max_event_bytes=10**6)
    assert built.repeated == [2]
    by_span = {e["otel_span_id"]: e["round"] for e in built.events if e["type"] == "model_round"}
    assert by_span["02" * 8] == 4  # after the 3 stored rounds, one of which is the first span


def test_the_run_is_described_once_per_span_and_its_root_names_it():
    root = span(
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop"},
        span_id="0a" * 8,
        parent_id="",
        start_ns=1_795_949_999 * 10**9,
    )
    chat = span(
        {**CHAT, "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o"}, span_id="0b" * 8
    )
    # Started from a tool span's export: named after its service, backend and model unknown.
    known = {
        "ab" * 16: KnownRun("svc", "unknown", "", rounds=0, service="svc", started_us=1_795_950_000 * 10**6)
    }
    built = events_build(_plans(chat, root), runs=known, tool_kinds={}, max_event_bytes=10**6)
    described = {e["event_id"]: e for e in built.events if e["type"] == "run_started"}
    assert described == {
        f"otel:{'ab' * 16}:{'0a' * 8}:described": {
            "type": "run_started",
            "run_id": "ab" * 16,
            "ts": ts_text(1_795_949_999 * 10**9),
            "event_id": f"otel:{'ab' * 16}:{'0a' * 8}:described",
            "agent": "shop",
        },
        f"otel:{'ab' * 16}:{'0b' * 8}:described": {
            "type": "run_started",
            "run_id": "ab" * 16,
            "ts": ts_text(1_795_950_000 * 10**9),
            "event_id": f"otel:{'ab' * 16}:{'0b' * 8}:described",
            "backend": "openai",
            "model": "gpt-4o",
        },
    }
    # Once the run says what the root span does, the root span sent again describes nothing.
    known = {"ab" * 16: KnownRun("shop", "openai", "gpt-4o", rounds=1, started_us=1_795_949_999 * 10**6)}
    built = events_build(_plans(root), runs=known, tool_kinds={}, max_event_bytes=10**6)
    assert [e["type"] for e in built.events] == ["run_finished"]


def test_a_root_span_names_the_run_over_a_sub_agent_whatever_came_first():
    sub = span({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"}, span_id="0c" * 8)
    root = span(
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop"}, span_id="0a" * 8, parent_id=""
    )
    known = {"ab" * 16: KnownRun("helper", "openai", "m", rounds=1, started_us=1_795_950_000 * 10**6)}
    built = events_build(_plans(root), runs=known, tool_kinds={}, max_event_bytes=10**6)
    assert [e.get("agent") for e in built.events if e["type"] == "run_started"] == ["shop"]
    known = {"ab" * 16: KnownRun("shop", "openai", "m", rounds=1, started_us=1_795_950_000 * 10**6)}
    built = events_build(_plans(sub), runs=known, tool_kinds={}, max_event_bytes=10**6)
    assert built.events == []  # a sub-agent renames only a run without a name


def test_a_waiting_span_is_kept_whole_as_json():
    import orjson

    item = span(
        {"gen_ai.agent.name": "shop", "n": 3, "list": [1, "a"], "kv": {"k": True}},
        resource={"service.name": "svc"},
        exceptions=[{"exception.type": "E"}],
        status_code=2,
        status_message="boom",
        wire_size=120,
    )
    assert mapping.span_load(orjson.loads(orjson.dumps(mapping.span_dump(item)))) == item
