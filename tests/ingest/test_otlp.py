"""POST /v1/traces: OTLP/HTTP exports from the real OpenTelemetry SDK and exporter, as trace events."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult

from ingest.models import Detection, Event, ModelRound, Operation, Run, ToolCall, ToolConfig
from ingest.otlp.mapping import run_id_sources
from tests.ingest.otlp_spans import (
    Agent,
    genai_agent,
    genai_chat,
    genai_tool,
    provider,
    recorded,
    request_bytes,
)

URL = "/v1/traces"
PROTOBUF = "application/x-protobuf"


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant)


def shop_run(agent: Agent, *, orders: int = 2) -> None:
    """invoke_agent → chat → search_orders → chat → get_order x orders (one parallel round) → chat."""
    with agent.span("invoke_agent shop", genai_agent()):
        agent.leaf("chat gpt-4o", genai_chat())
        agent.leaf(
            "execute_tool search_orders",
            genai_tool(
                "search_orders",
                '{"customer": "42"}',
                '{"orders": ["o1", "o2"]}',
                **{"gen_ai.tool.call.id": "call_a"},
            ),
        )
        agent.leaf("chat gpt-4o", genai_chat(1500, 60))
        for n in range(1, orders + 1):
            agent.leaf(
                "execute_tool get_order", genai_tool("get_order", f'{{"id": "o{n}"}}', f'{{"id": "o{n}"}}')
            )
        agent.leaf("chat gpt-4o", genai_chat(2000, 80))


def only_run(tenant) -> Run:
    return Run.objects.get(tenant=tenant)


# --- the real exporter against a live server ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip, Compression.Deflate])
def test_the_sdk_exporter_stores_a_genai_agent_run(live_server, tenant, make_key, compression):
    ToolConfig.objects.create(name="get_order", kind="write")  # shared; the tenant's row replaces it
    ToolConfig.objects.create(tenant=tenant, name="get_order", kind="read")
    agent, memory = recorded()
    shop_run(agent)
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/v1/traces",
        headers={"Authorization": f"Bearer {make_key(tenant)}"},
        compression=compression,
    )
    assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS

    run = only_run(tenant)
    assert run.run_id == memory.get_finished_spans()[0].context.trace_id.to_bytes(16, "big").hex()
    assert (run.agent, run.backend, run.model, run.task_type) == ("shop", "openai", "gpt-4o", "default")
    assert run.labels == {"source": "otlp", "service.name": "shop-agent"}
    assert (run.rounds, run.tool_calls, run.tool_errors) == (3, 3, 0)
    assert (run.input_tokens, run.output_tokens) == (900 + 1500 + 2000, 40 + 60 + 80)
    assert run.status == "succeeded" and run.finished_at is not None  # the root span ended the run
    types = list(Event.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types == [
        "run_started",
        *("model_round", "tool_call", "tool_result", "model_round"),
        *("tool_call", "tool_result") * 2,
        *("model_round", "run_finished"),
    ]
    calls = list(ToolCall.objects.filter(run=run).order_by("seq"))
    assert [(c.tool, c.round, c.kind, c.args, c.result_status) for c in calls] == [
        ("search_orders", 1, "other", {"customer": "42"}, "ok"),
        ("get_order", 2, "read", {"id": "o1"}, "ok"),
        ("get_order", 2, "read", {"id": "o2"}, "ok"),
    ]
    assert calls[0].result == {"orders": ["o1", "o2"]} and calls[0].latency_ms == pytest.approx(1.0)
    first = Event.objects.get(run=run, type="tool_call", body__tool="search_orders").body
    assert first["tool_call_id"] == "call_a" and first["call_id"] == calls[0].call_id
    assert list(ModelRound.objects.filter(run=run).order_by("seq").values_list("round", flat=True)) == [
        1,
        2,
        3,
    ]


@pytest.mark.django_db(transaction=True)
def test_span_by_span_exports_make_one_run_with_rounds_in_order(live_server, tenant, make_key, monkeypatch):
    """SimpleSpanProcessor sends each span as it ends: children first, the agent span last. The
    exporter is configured the way an instrumented agent is, from the environment."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", live_server.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{make_key(tenant)}")
    agent = Agent(provider(OTLPSpanExporter()).get_tracer("tests"))
    with agent.span(
        "invoke_agent shop", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop"}
    ):
        agent.leaf("execute_tool whoami", genai_tool("whoami"))  # before any model round: round 1
        agent.leaf("chat gpt-4o", genai_chat())
        agent.leaf("execute_tool search_orders", genai_tool("search_orders", '{"customer": "42"}', "[]"))
        agent.leaf("chat gpt-4o", genai_chat())
        agent.leaf("execute_tool search_orders", genai_tool("search_orders", '{"customer": "43"}', "[]"))

    run = only_run(tenant)
    # 5 spans (3 tools x 2 events, 2 rounds), run_started, run_finished, and two run_started naming
    # what the run lacked: backend and model (the first chat span), the agent (the agent span, last).
    assert run.events_count == 3 * 2 + 2 + 1 + 1 + 2
    calls = list(ToolCall.objects.filter(run=run).order_by("seq").values_list("tool", "round"))
    assert calls == [("whoami", 1), ("search_orders", 1), ("search_orders", 2)]
    # The first export (a tool span) did not know the model; the chat span's export and then the
    # agent span's (last) filled in what was missing.
    assert (run.agent, run.backend, run.model) == ("shop", "openai", "gpt-4o")
    assert Event.objects.filter(run=run, type="run_started").count() == 3
    assert run.status == "succeeded" and run.rounds == 2


@pytest.mark.django_db(transaction=True)
def test_a_looping_agent_is_detected(live_server, tenant, make_key):
    agent, memory = recorded()
    with agent.span("invoke_agent support", genai_agent("support")):
        for _ in range(5):
            agent.leaf("chat gpt-4o", genai_chat())
            agent.leaf(
                "execute_tool get_ticket",
                genai_tool("get_ticket", '{"ticket": "T-9"}', '{"status": "open", "notes": []}'),
            )
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/v1/traces", headers={"Authorization": f"Bearer {make_key(tenant)}"}
    )
    assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    run = only_run(tenant)
    assert run.loop_flagged
    kinds = set(Detection.objects.filter(run=run).exclude(action="observe").values_list("kind", flat=True))
    assert "exact_repeat" in kinds


@pytest.mark.django_db(transaction=True)
def test_a_redelivered_export_is_counted_once(live_server, tenant, make_key):
    agent, memory = recorded()
    shop_run(agent)
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/v1/traces", headers={"Authorization": f"Bearer {make_key(tenant)}"}
    )
    spans = memory.get_finished_spans()
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    before = only_run(tenant)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    after = only_run(tenant)
    assert after.events_count == before.events_count == Event.objects.count()
    assert (after.rounds, after.tool_calls, after.input_tokens) == (
        before.rounds,
        before.tool_calls,
        before.input_tokens,
    )
    assert ToolCall.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_the_exporter_is_refused_without_a_valid_key(live_server, tenant, make_key):
    agent, memory = recorded()
    shop_run(agent)
    for headers in (
        {},
        {"Authorization": "Bearer lw_not-a-key"},
        {"Authorization": f"Bearer {make_key(tenant, ['read'])}"},
    ):
        exporter = OTLPSpanExporter(endpoint=f"{live_server.url}/v1/traces", headers=headers)
        assert exporter.export(memory.get_finished_spans()) == SpanExportResult.FAILURE
    assert not Run.objects.exists()


# --- encodings and the answer -------------------------------------------------------------------


def decode_response(response) -> ExportTraceServiceResponse:
    answer = ExportTraceServiceResponse()
    if response["Content-Type"] == "application/json":
        json_format.Parse(response.content, answer)
    else:
        answer.ParseFromString(response.content)
    return answer


@pytest.mark.django_db
@pytest.mark.parametrize("gzipped", [False, True])
def test_json_of_the_same_request_stores_the_same_events(api, tenant, key, gzipped):
    agent, memory = recorded()
    shop_run(agent)
    spans = memory.get_finished_spans()
    body = json_format.MessageToJson(
        encode_spans(spans)
    ).encode()  # ids in base64, as protobuf's JSON has them
    extra = {"HTTP_CONTENT_ENCODING": "gzip"} if gzipped else {}
    response = api.post(URL, gzip.compress(body) if gzipped else body, key, **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json" and response.json() == {}
    assert response["X-Loopwatch-Spans"] == "spans=7 accepted=7 duplicate=0 waiting=0 ignored=0 rejected=0"
    json_events = list(Event.objects.order_by("seq").values_list("type", "event_id", "body"))
    Run.objects.all().delete()

    response = api.post(URL, request_bytes(spans), key, content_type=PROTOBUF)
    assert response.status_code == 200 and response["Content-Type"] == PROTOBUF and response.content == b""
    assert list(Event.objects.order_by("seq").values_list("type", "event_id", "body")) == json_events


HAND_WRITTEN = {
    "resourceSpans": [
        {
            "resource": {
                "attributes": [
                    {"key": "service.name", "value": {"stringValue": "weather-bot"}},
                    {"key": "loopwatch.task_type", "value": {"stringValue": "forecast"}},
                ]
            },
            "scopeSpans": [
                {
                    "scope": {"name": "manual", "version": "1.0"},
                    "spans": [
                        {
                            "traceId": "5B8EFFF798038103D269B633813FC60C",
                            "spanId": "eee19b7ec3c1b174",
                            "parentSpanId": "",
                            "name": "invoke_agent forecaster",
                            "kind": 1,
                            "startTimeUnixNano": "1795950000000000000",
                            "endTimeUnixNano": "1795950009000000000",
                            "attributes": [
                                {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                                {"key": "gen_ai.agent.name", "value": {"stringValue": "forecaster"}},
                            ],
                            "status": {},
                        },
                        {
                            "traceId": "5B8EFFF798038103D269B633813FC60C",
                            "spanId": "eee19b7ec3c1b175",
                            "parentSpanId": "eee19b7ec3c1b174",
                            "name": "chat claude-sonnet-4",
                            "kind": 3,
                            "startTimeUnixNano": "1795950001000000000",
                            "endTimeUnixNano": "1795950002000000000",
                            "attributes": [
                                {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                                {"key": "gen_ai.system", "value": {"stringValue": "anthropic"}},
                                {"key": "gen_ai.request.model", "value": {"stringValue": "claude-sonnet-4"}},
                                {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "1200"}},
                                {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": 35}},
                            ],
                        },
                        {
                            "traceId": "5B8EFFF798038103D269B633813FC60C",
                            "spanId": "eee19b7ec3c1b176",
                            "parentSpanId": "eee19b7ec3c1b174",
                            "name": "execute_tool get_weather",
                            "kind": 1,
                            "startTimeUnixNano": "1795950003000000000",
                            "endTimeUnixNano": "1795950003250000000",
                            "attributes": [
                                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                                {"key": "gen_ai.tool.name", "value": {"stringValue": "get_weather"}},
                                {"key": "gen_ai.tool.call.id", "value": {"stringValue": "toolu_01"}},
                                {
                                    "key": "gen_ai.tool.call.arguments",
                                    "value": {
                                        "kvlistValue": {
                                            "values": [
                                                {"key": "city", "value": {"stringValue": "Paris"}},
                                                {"key": "days", "value": {"intValue": "3"}},
                                            ]
                                        }
                                    },
                                },
                            ],
                            "events": [
                                {
                                    "timeUnixNano": "1795950003200000000",
                                    "name": "exception",
                                    "attributes": [
                                        {
                                            "key": "exception.type",
                                            "value": {"stringValue": "ServiceUnavailable"},
                                        },
                                        {
                                            "key": "exception.message",
                                            "value": {"stringValue": "503 from upstream"},
                                        },
                                    ],
                                }
                            ],
                            "status": {"code": 2, "message": "upstream failed"},
                        },
                        {
                            "traceId": "5B8EFFF798038103D269B633813FC60C",
                            "spanId": "eee19b7ec3c1b177",
                            "parentSpanId": "eee19b7ec3c1b174",
                            "name": "GET /healthz",
                            "kind": 3,
                            "startTimeUnixNano": "1795950004000000000",
                            "endTimeUnixNano": "1795950004100000000",
                            "attributes": [{"key": "http.request.method", "value": {"stringValue": "GET"}}],
                            "someFutureField": True,
                        },
                    ],
                }
            ],
        }
    ]
}


@pytest.mark.django_db
def test_a_hand_written_otlp_json_export_follows_the_spec_encoding(api, tenant, key):
    response = api.post(URL, json.dumps(HAND_WRITTEN), key)
    assert response.status_code == 200, response.content
    assert response["X-Loopwatch-Spans"] == "spans=4 accepted=3 duplicate=0 waiting=0 ignored=1 rejected=0"
    run = Run.objects.get(tenant=tenant, run_id="5b8efff798038103d269b633813fc60c")
    assert (run.agent, run.backend, run.model, run.task_type) == (
        "forecaster",
        "anthropic",
        "claude-sonnet-4",
        "forecast",
    )
    assert (run.input_tokens, run.output_tokens, run.rounds) == (1200, 35, 1)
    assert run.started_at.isoformat() == "2026-11-29T11:00:00+00:00"
    call = ToolCall.objects.get(run=run)
    assert (call.tool, call.args, call.result_status, call.error_class) == (
        "get_weather",
        {"city": "Paris", "days": 3},
        "error",
        "transient",
    )
    assert call.result == "ServiceUnavailable: 503 from upstream" and call.latency_ms == 250


# --- the dialects -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_openinference_spans_grouped_by_session(api, tenant, key, settings):
    settings.LOOPWATCH_OTLP_RUN_ID = run_id_sources("conversation")
    for turn, city in enumerate(["Paris", "Lyon"]):
        agent, memory = recorded({"service.name": "travel"})
        agent.clock = iter(range((1_795_950_000 + 60 * turn) * 10**9, 10**20, 10**6))
        session = {"session.id": "sess-7"}
        with agent.span("agent", {"openinference.span.kind": "AGENT", "agent.name": "travel", **session}):
            agent.leaf(
                "ChatCompletion",
                {
                    "openinference.span.kind": "LLM",
                    "llm.model_name": "gpt-4o-mini",
                    "llm.provider": "openai",
                    "llm.token_count.prompt": 300,
                    "llm.token_count.completion": 20,
                    "llm.output_messages.0.message.content": "Let me look that up.",
                    **session,
                },
            )
            agent.leaf(
                "weather",
                {
                    "openinference.span.kind": "TOOL",
                    "tool.name": "weather",
                    "tool.parameters": '{"type": "object", "properties": {"city": {"type": "string"}}}',
                    "input.value": json.dumps({"city": city}),
                    "input.mime_type": "application/json",
                    "output.value": "sunny",
                    **session,
                },
            )
        response = api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
        assert response.status_code == 200, response.content

    run = Run.objects.get(tenant=tenant)
    assert run.run_id == "sess-7" and run.status == "running"  # a conversation is not ended by a turn
    assert (run.agent, run.backend, run.model, run.rounds) == ("travel", "openai", "gpt-4o-mini", 2)
    assert list(ToolCall.objects.filter(run=run).order_by("seq").values_list("round", "args", "result")) == [
        (1, {"city": "Paris"}, "sunny"),
        (2, {"city": "Lyon"}, "sunny"),
    ]
    assert ModelRound.objects.filter(run=run).first().text == "Let me look that up."


@pytest.mark.django_db
def test_openllmetry_spans(api, tenant, key):
    agent, memory = recorded({"service.name": "research"})
    with agent.span(
        "research.workflow", {"traceloop.span.kind": "workflow", "traceloop.entity.name": "research"}
    ):
        agent.leaf(
            "openai.chat",
            {
                "llm.request.type": "chat",
                "gen_ai.system": "OpenAI",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.prompt_tokens": 700,
                "gen_ai.usage.completion_tokens": 30,
                "llm.usage.total_tokens": 730,
                "traceloop.workflow.name": "research",
            },
        )
        agent.leaf(
            "fetch_page.tool",
            {
                "traceloop.span.kind": "tool",
                "traceloop.entity.name": "fetch_page",
                "traceloop.entity.input": json.dumps({"args": [], "kwargs": {"url": "https://example.com"}}),
                "traceloop.entity.output": json.dumps({"status": 200, "title": "Example"}),
                "traceloop.workflow.name": "research",
            },
        )
    response = api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
    assert response.status_code == 200, response.content
    run = only_run(tenant)
    assert (run.agent, run.backend, run.model) == ("research", "openai", "gpt-4.1")
    assert (run.input_tokens, run.output_tokens, run.status) == (700, 30, "succeeded")
    call = ToolCall.objects.get(run=run)
    assert (call.tool, call.args, call.result) == (
        "fetch_page",
        {"url": "https://example.com"},
        {"status": 200, "title": "Example"},
    )


@pytest.mark.django_db
def test_calls_without_captured_arguments_still_count_by_name(api, tenant, key):
    """Arguments and results are opt-in in the GenAI conventions: such calls are marked, counted
    for budgets, and compared by name (an A→B→A→B… oscillation is still seen)."""
    agent, memory = recorded()
    with agent.span("invoke_agent shop", genai_agent()):
        for _ in range(4):
            agent.leaf("chat gpt-4o", genai_chat())
            agent.leaf("execute_tool open_cart", genai_tool("open_cart"))
            agent.leaf("chat gpt-4o", genai_chat())
            agent.leaf("execute_tool close_cart", genai_tool("close_cart"))
    response = api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
    assert response.status_code == 200, response.content
    run = only_run(tenant)
    assert run.tool_calls == 8
    bodies = [e.body for e in Event.objects.filter(run=run, type__in=["tool_call", "tool_result"])]
    assert all(b["args_captured"] is False and b["args"] == {} for b in bodies if b["type"] == "tool_call")
    assert all(b["result_captured"] is False for b in bodies if b["type"] == "tool_result")
    assert Detection.objects.filter(run=run, kind="oscillation").exists()


@pytest.mark.django_db
def test_a_write_that_times_out_is_unknown_in_the_ledger(api, tenant, key):
    ToolConfig.objects.create(tenant=tenant, name="refund_payment", kind="write")
    agent, memory = recorded()
    with agent.span("invoke_agent shop", genai_agent()):
        agent.leaf("chat gpt-4o", genai_chat())
        agent.leaf(
            "execute_tool refund_payment",
            genai_tool(
                "refund_payment",
                '{"payment": "p1", "amount": 10}',
                **{"loopwatch.operation_key": "order-42:refund"},
            ),
            error=TimeoutError("payments did not answer in 30 s"),
        )
    response = api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
    assert response.status_code == 200, response.content
    call = ToolCall.objects.get()
    assert (call.kind, call.operation_key, call.result_status) == ("write", "order-42:refund", "timeout")
    assert Operation.objects.get(tenant=tenant, operation_key="order-42:refund").status == "UNKNOWN"


# --- refusals ---------------------------------------------------------------------------------------


def status_of(response) -> tuple[int, str]:
    """(google.rpc.Code, message) of an error answer, decoded as an exporter would."""
    if response["Content-Type"] == "application/json":
        body = response.json()
        return body["code"], body["message"]
    status = Status()
    status.ParseFromString(response.content)
    return status.code, status.message


@pytest.mark.django_db
def test_some_spans_refused_is_a_partial_success_naming_each(api, tenant, key):
    agent, memory = recorded()
    with agent.span("invoke_agent shop", genai_agent()):
        agent.leaf("chat gpt-4o", genai_chat(**{"gen_ai.usage.input_tokens": -5}))
        agent.leaf("execute_tool x", genai_tool("x" * 300))
        agent.leaf("execute_tool ok", genai_tool("ok", "{}", "1"))
    response = api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
    assert response.status_code == 200
    answer = decode_response(response).partial_success
    assert answer.rejected_spans == 2
    assert "gen_ai.usage.input_tokens: must be between 0 and 2147483647 (got -5)" in answer.error_message
    assert "gen_ai.tool.name: must be at most 200 characters (got 300)" in answer.error_message
    assert answer.error_message.startswith("2 of 4 spans rejected: resourceSpans[0].scopeSpans[0].spans[")
    run = only_run(tenant)
    assert list(ToolCall.objects.filter(run=run).values_list("tool", flat=True)) == ["ok"]
    assert run.rounds == 0 and run.status == "succeeded"


@pytest.mark.django_db
def test_every_span_refused_is_a_400(api, tenant, key):
    agent, memory = recorded()
    agent.leaf("execute_tool bad", genai_tool("bad", **{"loopwatch.tool.kind": "delete"}))
    response = api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
    assert response.status_code == 400 and response["Content-Type"] == PROTOBUF
    code, message = status_of(response)
    assert code == 3 and "loopwatch.tool.kind: must be one of read, write, poll, other" in message
    assert not Run.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "content_type", "extra", "status", "named"),
    [
        (b"\xff\xff\xff", PROTOBUF, {}, 400, "body: not an ExportTraceServiceRequest"),
        (b"{not json", "application/json", {}, 400, "body: not valid JSON"),
        (b"[]", "application/json", {}, 400, "body: must be a JSON object"),
        (b'{"resourceSpans": {}}', "application/json", {}, 400, "resourceSpans: must be an array"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}',
            "application/json",
            {},
            400,
            "resourceSpans[0].scopeSpans[0].spans[0].traceId: must be 32 hex digits",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
            "application/json",
            {},
            400,
            "startTimeUnixNano",
        ),
        (b"{}", "text/plain", {}, 415, "Content-Type: 'text/plain' is not accepted"),
        (
            b"{}",
            "application/json",
            {"HTTP_CONTENT_ENCODING": "br"},
            415,
            "Content-Encoding: 'br' is not accepted",
        ),
        (
            b"not gzip",
            "application/json",
            {"HTTP_CONTENT_ENCODING": "gzip"},
            400,
            "body: not valid gzip data",
        ),
        (gzip.compress(b"{}")[:-6], "application/json", {"HTTP_CONTENT_ENCODING": "gzip"}, 400, "cut short"),
    ],
)
def test_undecodable_exports_are_refused_whole(api, key, body, content_type, extra, status, named):
    response = api.post(URL, body, key, content_type=content_type, **extra)
    assert response.status_code == status, response.content
    code, message = status_of(response)
    assert named in message and code == 3
    expected = "application/json" if content_type != PROTOBUF else PROTOBUF
    assert response["Content-Type"] == expected
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_oversized_exports_are_413(api, key, settings):
    settings.LOOPWATCH_MAX_BODY_BYTES = 4096
    agent, memory = recorded()
    shop_run(agent)
    body = request_bytes(memory.get_finished_spans())
    response = api.post(URL, body + b"\x00" * 4096, key, content_type=PROTOBUF)
    assert response.status_code == 413 and "LOOPWATCH_MAX_BODY_BYTES" in status_of(response)[1]
    bomb = gzip.compress(b" " * 100_000)  # 100 kB of JSON whitespace in ~130 bytes
    response = api.post(URL, bomb, key, content_type="application/json", HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413 and "once decompressed" in status_of(response)[1]

    settings.LOOPWATCH_MAX_BODY_BYTES = 16 * 1024 * 1024
    settings.LOOPWATCH_MAX_BATCH_EVENTS = 5
    response = api.post(URL, body, key, content_type=PROTOBUF)
    assert response.status_code == 413
    assert status_of(response) == (
        8,
        "body: 7 spans in one export, the limit is 5 (LOOPWATCH_MAX_BATCH_EVENTS)",
    )
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_huge_tool_result_is_cut_with_its_digest_and_huge_arguments_refuse_the_span(
    api, tenant, key, settings
):
    settings.LOOPWATCH_MAX_EVENT_BYTES = 64 * 1024
    page = "<p>" + "x" * 100_000 + "</p>"
    agent, memory = recorded()
    with agent.span("invoke_agent shop", genai_agent()):
        agent.leaf("execute_tool fetch", genai_tool("fetch", '{"url": "https://a"}', page))
        agent.leaf("execute_tool fetch", genai_tool("fetch", json.dumps({"body": page}), "ok"))
    response = api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
    assert response.status_code == 200
    assert (
        "gen_ai.tool.call.arguments: the event is" in decode_response(response).partial_success.error_message
    )
    call = ToolCall.objects.get()
    assert call.result_truncated and len(call.result) == 32 * 1024
    assert call.result_sha256 == hashlib.sha256(json.dumps(page).encode()).hexdigest()


@pytest.mark.django_db
def test_keys_are_checked_before_the_body_is_read(api, tenant, make_key):
    for key, status, code in ((None, 401, 16), ("lw_unknown", 401, 16), (make_key(tenant, ["read"]), 403, 7)):
        response = api.post(URL, b"\xff garbage", key, content_type=PROTOBUF)
        assert response.status_code == status and status_of(response)[0] == code
        assert "Authorization" in status_of(response)[1]
    assert response["Content-Type"] == PROTOBUF


@pytest.mark.django_db
def test_another_tenants_runs_are_never_touched(api, tenant, other_tenant, key, make_key):
    agent, memory = recorded()
    shop_run(agent)
    body = request_bytes(memory.get_finished_spans())
    assert api.post(URL, body, key, content_type=PROTOBUF).status_code == 200
    mine = only_run(tenant)

    # The same trace from another tenant's key is another tenant's run.
    assert api.post(URL, body, make_key(other_tenant), content_type=PROTOBUF).status_code == 200
    theirs = Run.objects.get(tenant=other_tenant)
    assert theirs.run_id == mine.run_id and theirs.pk != mine.pk
    assert only_run(tenant).events_count == mine.events_count

    # A resource naming another tenant is refused whole.
    agent, memory = recorded({"service.name": "shop", "loopwatch.tenant": "globex"})
    shop_run(agent)
    response = api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
    assert response.status_code == 403
    assert status_of(response) == (
        7,
        "resourceSpans[0].resource.attributes['loopwatch.tenant']: names tenant 'globex', "
        "but the API key is tenant 'acme''s",
    )
    assert Run.objects.filter(tenant=tenant).count() == 1


@pytest.mark.django_db
def test_other_methods_are_405(api, key, client):
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 405 and "POST" in response["Allow"]


@pytest.mark.django_db
def test_spans_continue_a_run_its_runtime_started_over_rest(api, tenant, key):
    agent, memory = recorded()
    shop_run(agent, orders=1)
    spans = memory.get_finished_spans()
    run_id = spans[0].context.trace_id.to_bytes(16, "big").hex()
    started = {
        "type": "run_started",
        "run_id": run_id,
        "ts": "2026-11-29T10:59:00Z",
        "budgets": {"max_tool_calls": 2},
    }
    assert api.post("/api/v1/events", [started], key).status_code == 200

    response = api.post(URL, request_bytes(spans), key, content_type=PROTOBUF)
    assert response.status_code == 200
    run = only_run(tenant)
    # No run_started of the bridge's: the runtime's own stands, with its budgets (now exhausted).
    assert list(Event.objects.filter(run=run, type="run_started").values_list("event_id", flat=True)) == [
        None
    ]
    assert run.budgets == {"max_tool_calls": 2} and run.agent == "" and run.tool_calls == 2
    assert Detection.objects.filter(run=run, kind="budget").exists()
