"""Every WebSocket route checks the Origin a browser sends (cross-site WebSocket hijacking).

The alerts socket is authenticated by the session cookie, which a browser also sends from a page
of another origin (another port of the same host is the same site): only a page of this origin,
or of CSRF_TRUSTED_ORIGINS, may open it. The ingest socket is authenticated by an API key that
non-browser clients send without any Origin; a browser page of another origin is refused there
too, and no session ever reaches it.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import Client

from dashboards.models import Membership
from loopwatch.asgi import application

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

HOST = b"127.0.0.1:8000"


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    yield
    connections.close_all()


def _session_cookie(tenant) -> bytes:
    user = get_user_model().objects.create_user("ana", password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.OPERATOR)
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def _opens(path: str, headers: list[tuple[bytes, bytes]], wait: float = 5) -> tuple[bool, dict | None]:
    """Whether the socket was accepted, and its first message (None when nothing came)."""
    ws = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await ws.connect(timeout=10)
    first = None
    if connected:
        if not await ws.receive_nothing(timeout=wait, interval=0.05):
            first = await ws.receive_output(timeout=1)
        await ws.disconnect()
    await asyncio.sleep(0)
    return connected, first


@pytest.mark.parametrize(
    ("origin", "opens"),
    [
        (b"http://127.0.0.1:8000", True),  # the app's own pages
        (b"http://127.0.0.1:9999", False),  # another port of the same host: same site, other origin
        (b"https://127.0.0.1:8000", False),  # another scheme
        (b"http://evil.example", False),
        (b"null", False),  # a sandboxed frame or a file:// page
        (None, False),  # no Origin: not a browser page of ours
    ],
)
async def test_the_alerts_socket_opens_only_for_a_page_of_this_origin(tenant, origin, opens):
    cookie = await database_sync_to_async(_session_cookie)(tenant)
    headers = [(b"host", HOST), (b"cookie", cookie)] + ([(b"origin", origin)] if origin else [])
    connected, first = await _opens("/ws/alerts?after=0", headers)
    assert connected is opens
    if opens:  # and the session made it the user's socket
        assert first["type"] == "websocket.send" and '"catch_up"' in first["text"]


async def test_a_trusted_origin_and_a_proxy_that_says_https(tenant, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.example.com"]
    settings.ALLOWED_HOSTS = ["loopwatch.example.com"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    cookie = await database_sync_to_async(_session_cookie)(tenant)
    base = [(b"cookie", cookie), (b"host", b"loopwatch.example.com")]
    assert (await _opens("/ws/alerts", [*base, (b"origin", b"https://ops.example.com")]))[0]
    assert not (await _opens("/ws/alerts", [*base, (b"origin", b"https://ops.example.org")]))[0]
    # TLS ends at the proxy: the socket itself is ws://, the page was https://
    settings.CSRF_TRUSTED_ORIGINS = []
    https_page = [*base, (b"origin", b"https://loopwatch.example.com")]
    assert (await _opens("/ws/alerts", [*https_page, (b"x-forwarded-proto", b"https")]))[0]
    assert not (await _opens("/ws/alerts", https_page))[0]
    # a host the server does not serve is refused whatever the Origin says
    evil_host = [(b"cookie", cookie), (b"host", b"evil.example"), (b"origin", b"http://evil.example")]
    assert not (await _opens("/ws/alerts", evil_host))[0]


async def test_the_ingest_socket_takes_keys_without_origin_but_no_foreign_page(tenant, make_key):
    key = await database_sync_to_async(make_key)(tenant)
    bearer = [(b"host", HOST), (b"authorization", f"Bearer {key}".encode())]
    assert (await _opens("/ws/v1/events", bearer, wait=0.2))[0]  # an agent runtime: no Origin
    assert (await _opens("/ws/v1/events", [*bearer, (b"origin", b"http://127.0.0.1:8000")], wait=0.2))[0]
    assert not (await _opens("/ws/v1/events", [*bearer, (b"origin", b"http://127.0.0.1:9999")]))[0]


async def test_the_ingest_socket_never_sees_the_session(tenant, make_key, monkeypatch):
    """A signed-in user's cookie authenticates nothing on the ingest socket: the key does."""
    from ingest import consumers

    seen: list[dict] = []
    original = consumers.EventsConsumer.connect

    async def spy(self):
        seen.append(dict(self.scope))
        await original(self)

    monkeypatch.setattr(consumers.EventsConsumer, "connect", spy)
    cookie = await database_sync_to_async(_session_cookie)(tenant)
    connected, first = await _opens("/ws/v1/events", [(b"host", HOST), (b"cookie", cookie)], wait=0.5)
    assert connected and first is None  # waiting for a key in the first message
    assert "session" not in seen[0] and "user" not in seen[0]
