"""WebSocket ingest at /ws/v1/events through Channels' communicator."""

from __future__ import annotations

import orjson
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from ingest.models import Event, Run
from loopwatch.asgi import application
from tests.ingest.events import model_round, run_started, tool_call, with_ids

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def _connect(key: str | None = None) -> WebsocketCommunicator:
    # As an agent runtime connects: a Host, no Origin (not a browser).
    headers = [(b"host", b"127.0.0.1:8000")]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    return WebsocketCommunicator(application, "/ws/v1/events", headers=headers)


async def _send(ws: WebsocketCommunicator, payload) -> dict:
    await ws.send_to(text_data=payload if isinstance(payload, str) else orjson.dumps(payload).decode())
    return orjson.loads(await ws.receive_from(timeout=5))


async def test_it_ingests_with_a_header_key_and_acks_each_message(tenant, make_key):
    key = await database_sync_to_async(make_key)(tenant)
    ws = _connect(key)
    connected, _ = await ws.connect()
    assert connected
    ack = await _send(ws, with_ids([run_started(), model_round()]))
    assert ack["ack"] == 1 and ack["accepted"] == 2
    ack = await _send(ws, tool_call(args="nope"))
    assert ack["ack"] == 2 and ack["results"][0]["error"] == "[0].args: must be an object, not a string"
    await ws.disconnect()
    run = await database_sync_to_async(Run.objects.get)(tenant=tenant, run_id="r1")
    assert run.events_count == 2 and run.rounds == 1


async def test_bad_messages_are_answered_and_the_socket_survives(tenant, make_key, settings):
    key = await database_sync_to_async(make_key)(tenant)
    ws = _connect(key)
    await ws.connect()
    assert (await _send(ws, "{not json"))["error"] == "invalid_json"
    assert (await _send(ws, []))["error"] == "empty_batch"
    settings.LOOPWATCH_MAX_BATCH_EVENTS = 2
    too_many = await _send(ws, [model_round(n=i) for i in range(1, 4)])
    assert too_many["error"] == "too_many_events" and too_many["ack"] == 3
    settings.LOOPWATCH_MAX_BATCH_EVENTS = 100
    ack = await _send(ws, [run_started(), model_round()])
    assert ack["ack"] == 4 and ack["accepted"] == 2
    await ws.disconnect()


async def test_it_takes_the_key_in_a_first_message(tenant, make_key):
    key = await database_sync_to_async(make_key)(tenant)
    ws = _connect()
    await ws.connect()
    hello = await _send(ws, {"auth": key})
    assert hello == {"auth": "ok", "tenant": "acme"}
    ack = await _send(ws, [run_started()])
    assert ack["accepted"] == 1
    await ws.disconnect()


async def test_an_unauthenticated_socket_is_closed_with_a_clear_code(tenant, make_key):
    ws = _connect("lw_wrong")
    connected, code = await ws.connect()
    assert not connected and code == 4401

    ws = _connect()
    await ws.connect()
    await ws.send_to(text_data=orjson.dumps([run_started()]).decode())
    closed = await ws.receive_output(timeout=5)
    assert closed["type"] == "websocket.close" and closed["code"] == 4401
    assert "auth" in closed.get("reason", "")

    read_only = await database_sync_to_async(make_key)(tenant, ["read"])
    ws = _connect(read_only)
    connected, code = await ws.connect()
    assert not connected and code == 4403
    assert not await database_sync_to_async(Event.objects.exists)()
