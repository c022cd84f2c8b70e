"""Alert sockets per user are limited (LOOPWATCH_ALERT_SOCKETS_PER_USER): the one over the limit is
closed with 4429 and says why; the count is kept in Redis when there is one (every web process
sees the same), in the process otherwise (the embedded mode has one)."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import Client

from dashboards.alerts import sockets
from dashboards.models import Membership
from loopwatch.asgi import application

LIMIT = 3
PAGE = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000")]


@pytest.fixture(params=["redis", "embedded"])
def where(request, settings):
    """The count in Redis (REDIS_URL) or in the process (none)."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.LOOPWATCH_ALERT_SOCKETS_PER_USER = LIMIT
    if request.param == "redis":
        request.getfixturevalue("needs_redis")
    else:
        settings.REDIS_URL = ""
    yield request.param
    connections.close_all()


def _signed_in(tenant, name: str) -> tuple[int, bytes]:
    """The user's id and the cookie of a session of theirs."""
    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.VIEWER)
    client = Client()
    client.force_login(user)
    return user.pk, f"sessionid={client.cookies['sessionid'].value}".encode()


async def _open(cookie: bytes) -> tuple[WebsocketCommunicator, dict]:
    ws = WebsocketCommunicator(application, "/ws/alerts?after=0", headers=[*PAGE, (b"cookie", cookie)])
    assert (await ws.connect(timeout=10))[0]
    return ws, await ws.receive_output(timeout=5)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_socket_over_the_limit_is_closed_and_says_why(tenant, where):
    ana_id, ana = await database_sync_to_async(_signed_in)(tenant, "ana")
    _, bob = await database_sync_to_async(_signed_in)(tenant, "bob")
    open_ = []
    for _ in range(LIMIT):
        ws, first = await _open(ana)
        assert '"catch_up"' in first["text"]
        open_.append(ws)

    extra, said = await _open(ana)
    assert orjson.loads(said["text"]) == {
        "type": "error",
        "field": None,
        "detail": f"too many alert sockets open for this user (LOOPWATCH_ALERT_SOCKETS_PER_USER={LIMIT}); "
        "close another alerts page",
    }
    closed = await extra.receive_output(timeout=5)
    assert (closed["type"], closed["code"]) == ("websocket.close", 4429)

    other, first = await _open(bob)  # per user: bob is not counted with ana
    assert '"catch_up"' in first["text"]

    await open_.pop().disconnect()  # a closed page gives its place back
    again, first = await _open(ana)
    assert '"catch_up"' in first["text"]
    for ws in [*open_, other, again]:
        await ws.disconnect()
    await asyncio.sleep(0)
    assert sockets.alert_sockets_open(user_id=ana_id) == 0


@pytest.mark.django_db(transaction=True)
def test_a_socket_its_process_lost_stops_counting_after_a_while(where):
    """A web process that died never released its sockets: their claims expire."""
    user_id = 7 << 32
    for n in range(LIMIT):
        assert sockets.alert_socket_claim(user_id=user_id, channel=f"c{n}", now=1000.0)
    assert not sockets.alert_socket_claim(user_id=user_id, channel="late", now=1000.0)
    # The live ones renew their claim; c0's process is gone.
    for n in range(1, LIMIT):
        sockets.alert_socket_renew(user_id=user_id, channel=f"c{n}", now=1000.0 + sockets.CLAIM_TTL_S - 1)
    assert not sockets.alert_socket_claim(
        user_id=user_id, channel="late", now=1000.0 + sockets.CLAIM_TTL_S - 1
    )
    assert sockets.alert_socket_claim(user_id=user_id, channel="late", now=1000.0 + sockets.CLAIM_TTL_S + 1)
    for name in ["late", *(f"c{n}" for n in range(LIMIT))]:
        sockets.alert_socket_release(user_id=user_id, channel=name)
    assert sockets.alert_sockets_open(user_id=user_id) == 0
