"""Hostile input at every way in (issue 11, items 1 and 5): numbers past their caps, a `ts` offset of
+20:00 or a year 0001, objects nested 256 to 1023 levels deep. Each gets a clear 4xx (or a rejected
verdict) naming the field; never a 500, never a dropped socket. The limits are docs/limits.md's."""

from __future__ import annotations

import orjson
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from ingest.models import Event, Operation, Run
from loopwatch.asgi import application
from tests.ingest.events import model_round, run_started, tool_call, tool_result
from tests.ingest.otlp_spans import genai_agent, genai_tool, recorded, request_bytes


def nested_text(depth: int) -> str:
    """JSON text of objects `depth` levels deep, as a hostile client writes it (orjson cannot write
    past 255 levels)."""
    return '{"a":' * (depth - 1) + '{"leaf":1}' + "}" * (depth - 1)


def with_raw(event: dict, **fields: str) -> str:
    """The event as JSON text, these fields written as the raw JSON text given."""
    text = orjson.dumps({**event, **{name: f"@{name}@" for name in fields}}).decode()
    for name, raw in fields.items():
        text = text.replace(f'"@{name}@"', raw)
    return text


def as_batch(texts: list[str]) -> str:
    return "[" + ",".join(texts) + "]"


# What the audit sent, one event each; the field each verdict must name.
HOSTILE = [
    (with_raw(model_round("r1", n=1), cost_usd="1e308"), "[{i}].cost_usd", "must be at most 1000000"),
    (with_raw(model_round("r1", n=1), ts='"2026-11-29T10:00:00+20:00"'), "[{i}].ts", "within ±14:00"),
    (with_raw(model_round("r1", n=1), ts='"0001-01-01T00:00:00+01:00"'), "[{i}].ts", "between 2000 and 2100"),
    (with_raw(model_round("r1", n=1), ts='"9999-12-31T23:00:00-05:00"'), "[{i}].ts", "between 2000 and 2100"),
    (with_raw(run_started("r1"), ts='"1900-01-01T00:00:00Z"'), "[{i}].ts", "between 2000 and 2100"),
    (with_raw(tool_call("r1"), args=nested_text(256)), "[{i}].args", "must not nest deeper than 64 levels"),
    # 1000: with the batch's array and the event's object, within what orjson reads (1024).
    (with_raw(tool_call("r1"), args=nested_text(1000)), "[{i}].args", "must not nest deeper than 64 levels"),
    (with_raw(tool_result("r1"), result=nested_text(300)), "[{i}].result", "must not nest deeper than 64"),
    (with_raw(tool_result("r1"), latency_ms="1e300"), "[{i}].latency_ms", "must be at most"),
    (
        with_raw(run_started("r1"), budgets='{"max_cost_usd": 1e308}'),
        "[{i}].budgets.max_cost_usd",
        "must be at most 1000000000",
    ),
]


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant, ["ingest", "ledger", "read"])


@pytest.mark.django_db
def test_a_batch_of_hostile_events_is_a_207_naming_each_field(api, tenant, key):
    good = orjson.dumps(run_started("r1")).decode()
    response = api.post("/api/v1/events", as_batch([good, *(text for text, _, _ in HOSTILE)]), key)
    assert response.status_code == 207, response.content
    body = response.json()
    assert body["accepted"] == 1 and body["rejected"] == len(HOSTILE)
    for i, (_, field, reason) in enumerate(HOSTILE, start=1):
        verdict = body["results"][i]
        assert verdict["status"] == "rejected"
        assert verdict["field"] == field.format(i=i), verdict
        assert reason in verdict["reason"], verdict
    assert Event.objects.filter(run__tenant=tenant).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("depth", [256, 1023, 1500, 5000])
def test_deep_json_text_is_a_clear_4xx(api, key, depth):
    """Nesting written as text: parsed (orjson reads any depth it can) then refused by the limit, or
    refused as not JSON; never the 500 orjson's writer raised past 255 levels."""
    response = api.post("/api/v1/events", as_batch([with_raw(tool_call("r1"), args=nested_text(depth))]), key)
    assert 400 <= response.status_code < 500, response.content
    body = response.json()
    if response.status_code == 422:
        assert body["results"][0]["field"] == "[0].args"
    else:
        assert body["field"] == "body"


@pytest.mark.django_db
def test_ndjson_lines_get_the_same_verdicts(api, key):
    lines = "\n".join(text for text, _, _ in HOSTILE[:3])
    response = api.post("/api/v1/events", lines, key, content_type="application/x-ndjson")
    assert response.status_code == 422
    assert [r["field"] for r in response.json()["results"]] == ["[0].cost_usd", "[1].ts", "[2].ts"]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_ingest_socket_answers_hostile_events_and_stays_open(tenant, make_key):
    key = await database_sync_to_async(make_key)(tenant)
    ws = WebsocketCommunicator(
        application,
        "/ws/v1/events",
        headers=[(b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {key}".encode())],
    )
    connected, _ = await ws.connect()
    assert connected
    for n, (text, field, reason) in enumerate(HOSTILE, start=1):
        await ws.send_to(text_data=text)
        ack = orjson.loads(await ws.receive_from(timeout=10))
        assert ack["ack"] == n and ack["rejected"] == 1, ack
        assert ack["results"][0]["field"] == field.format(i=0)
        assert reason in ack["results"][0]["reason"]
    await ws.send_to(text_data=with_raw(tool_call("r1"), args=nested_text(1022)))
    ack = orjson.loads(await ws.receive_from(timeout=10))
    assert ack["ack"] == len(HOSTILE) + 1 and ack["rejected"] == 1, ack
    await ws.send_to(text_data=as_batch([with_raw(tool_call("r1"), args=nested_text(5000))]))
    ack = orjson.loads(await ws.receive_from(timeout=10))
    assert ack["ack"] == len(HOSTILE) + 2 and ack["error"] == "invalid_json", ack
    await ws.send_to(text_data=orjson.dumps(run_started("r1")).decode())
    ack = orjson.loads(await ws.receive_from(timeout=10))
    assert ack["accepted"] == 1, "the socket still works after the hostile messages"
    await ws.disconnect()
    assert await database_sync_to_async(Run.objects.filter(tenant=tenant).count)() == 1


CLAIM = "/api/v1/operations/claim"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("depth", [65, 256, 1023])
def test_a_claim_with_deep_args_is_a_400_naming_args(api, key, depth):
    body = with_raw({"operation_key": "k1", "tool": "refund", "worker_id": "w1"}, args=nested_text(depth))
    response = api.post(CLAIM, body, key)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "args"
    assert "must not nest deeper than 64 levels" in response.json()["detail"]
    assert not Operation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_completion_with_a_deep_result_is_a_400_naming_result(api, key):
    claimed = api.post(CLAIM, {"operation_key": "k1", "tool": "refund", "args": {}, "worker_id": "w1"}, key)
    assert claimed.json()["decision"] == "execute"
    body = with_raw({"worker_id": "w1", "outcome": "succeeded"}, result=nested_text(300))
    response = api.post("/api/v1/operations/k1/complete", body, key)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "result"
    assert Operation.objects.get().status == "RUNNING"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (with_raw({"tool": "t"}, args=nested_text(256)), "args", "must not nest deeper than 64 levels"),
        (with_raw({"tool": "t"}, args=nested_text(1023)), "args", "must not nest deeper than 64 levels"),
        ({"tool": "t", "args": {}, "ts": "2026-11-29T10:00:00+20:00"}, "ts", "within ±14:00"),
        ({"tool": "t", "args": {}, "ts": "0001-01-01T00:00:00+01:00"}, "ts", "between 2000 and 2100"),
        ({"tool": "t", "args": {"n": 1}, "round": 1e308}, "round", "must be at most 2147483647 (got 1e+308)"),
    ],
)
def test_a_guard_check_with_hostile_values_is_a_400_naming_the_field(api, key, body, field, reason):
    response = api.post("/api/v1/runs/r1/check", body, key)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert reason in response.json()["detail"]


@pytest.mark.django_db
def test_otlp_spans_with_deep_values_are_named_in_partial_success(api, tenant, key):
    agent, memory = recorded()
    with agent.span("invoke_agent shop", genai_agent()):
        agent.leaf("execute_tool deep_args", genai_tool("deep_args", nested_text(300), '"ok"'))
        agent.leaf("execute_tool deep_result", genai_tool("deep_result", "{}", nested_text(1023)))
        agent.leaf("execute_tool fine", genai_tool("fine", '{"q": 1}', '"ok"'))
    response = api.post(
        "/v1/traces", request_bytes(memory.get_finished_spans()), key, content_type="application/x-protobuf"
    )
    assert response.status_code == 200, response.content
    answer = ExportTraceServiceResponse()
    answer.ParseFromString(response.content)
    message = answer.partial_success.error_message
    assert answer.partial_success.rejected_spans == 2, message
    assert "gen_ai.tool.call.arguments: must not nest deeper than 64 levels" in message
    assert "gen_ai.tool.call.result: must not nest deeper than 64 levels" in message
    assert "execute_tool deep_args" in message and "execute_tool deep_result" in message
    assert sorted(Run.objects.get(tenant=tenant).calls.values_list("tool", flat=True)) == ["fine"]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_unexpected_failure_is_acked_as_a_server_error_and_the_socket_stays_open(
    tenant, make_key, monkeypatch
):
    """Whatever a message breaks that the limits did not foresee, the client gets an ack saying so
    and its socket (with the messages behind it) survives."""
    import ingest.consumers

    real = ingest.consumers.ingest_batch

    def fails_once(**kwargs):
        monkeypatch.setattr(ingest.consumers, "ingest_batch", real)
        raise RuntimeError("something nobody foresaw")

    monkeypatch.setattr(ingest.consumers, "ingest_batch", fails_once)
    key = await database_sync_to_async(make_key)(tenant)
    ws = WebsocketCommunicator(
        application,
        "/ws/v1/events",
        headers=[(b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {key}".encode())],
    )
    assert (await ws.connect())[0]
    await ws.send_to(text_data=orjson.dumps(run_started("r1")).decode())
    ack = orjson.loads(await ws.receive_from(timeout=10))
    assert ack == {"ack": 1, "error": "server_error", "detail": "internal error; it was logged"}
    await ws.send_to(text_data=orjson.dumps(run_started("r1")).decode())
    ack = orjson.loads(await ws.receive_from(timeout=10))
    assert ack["ack"] == 2 and ack["accepted"] == 1
    await ws.disconnect()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/v1/runs?agent=a%00b", 400),
        ("GET", "/api/v1/runs?status=a%00b", 400),
        ("GET", f"/api/v1/runs?model={'m' * 201}", 400),
        ("GET", "/api/v1/runs/a%00b", 404),
        ("GET", "/api/v1/runs/a%00b/events", 404),
        ("POST", "/api/v1/runs/a%00b/check", 404),
        ("POST", "/api/v1/runs/a%00b/handoff", 404),
        ("GET", "/api/v1/operations/a%00b", 404),
        ("POST", "/api/v1/operations/a%00b/complete", 404),
    ],
)
def test_a_nul_in_a_path_or_a_filter_is_a_4xx(client, tenant, make_key, method, path, status):
    """Found by schemathesis: PostgreSQL's text cannot hold U+0000, and looking one up raised."""
    key = make_key(tenant, ["ingest", "read", "ledger", "operate"])
    body = {
        "tool": "t",
        "args": {},
        "answer": "stop",
        "note": "n",
        "by": "b",
        "worker_id": "w",
        "outcome": "failed",
    }
    response = client.generic(
        method, path, orjson.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code == status, response.content
    if status == 400:
        assert response.json()["field"] in ("agent", "status", "model")
