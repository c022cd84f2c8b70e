"""The live alerts socket of the pages: /ws/alerts?after=<id>[&observe=1&kind=&backend=&action=].

Session-authenticated (AuthMiddlewareStack). It joins the alerts group of each of the user's
tenants, then sends, oldest first, every stored alert after `after` (Channels delivers group
messages at most once: a page that reconnects catches up from the last id it saw), then the live
ones. Messages, all JSON:

    {"type": "catch_up", "alerts": [...], "more": false}   once, first (more: older ones were left out)
    {"type": "alert", "alert": {...}}                       each new intervention (and observation),
                                                            with its incident as it is now ("incident")
    {"type": "feedback", "feedback": {...}}                 someone marked an alert
    {"type": "verdict", "verdict": {...}}                   someone gave an incident its verdict
    {"type": "error", "field": "after", "detail": "..."}    then the socket closes with 4400

The pipeline publishes interventions only; with observe=1 the observations are read from the
database every OBSERVE_POLL_S seconds. A socket without a signed-in user is closed with 4401, and
so is one whose session ended (sign-out) while it was open; every ACCESS_CHECK_S seconds the
socket follows the user's memberships (a tenant taken away stops its alerts). A user has at most
LOOPWATCH_ALERT_SOCKETS_PER_USER sockets open (every one joins groups and polls): the one over
it says why in an error message and is closed with 4429.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from importlib import import_module
from urllib.parse import parse_qsl

import orjson
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import SESSION_KEY

from dashboards.alerts.selectors import (
    AlertFilterError,
    AlertFilters,
    alerts_after,
    user_tenant_ids,
)
from dashboards.alerts.sockets import alert_socket_claim, alert_socket_release, alert_socket_renew
from ingest.events import alerts_group
from ingest.models import Detection

logger = logging.getLogger(__name__)

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_TOO_MANY = 4429
OBSERVE_POLL_S = 2.0  # observations are not published live; how stale they may be on the page
ACCESS_CHECK_S = 30.0  # how long a revoked membership or an ended session may still receive alerts


class AlertsConsumer(AsyncWebsocketConsumer):
    groups_joined: list[str]
    tenant_ids: list[int]

    async def connect(self) -> None:
        self.groups_joined = []
        self.tenant_ids = []
        self._tasks: list[asyncio.Task] = []
        self._claimed_for: int | None = None  # the user whose socket count this one is in
        # Accept first, then close: a close before the handshake reaches a browser as a bare
        # failure without the code, and the page must tell "signed out" from "server away".
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED, reason="sign in first")
            return
        params = dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))
        try:
            self.filters = AlertFilters.parse(params)
            after = _after(params.get("after"))
        except AlertFilterError as exc:
            await self._send({"type": "error", "field": exc.field, "detail": str(exc)})
            await self.close(code=CLOSE_BAD_REQUEST, reason=str(exc)[:120])
            return
        claim = sync_to_async(alert_socket_claim, thread_sensitive=False)
        if not await claim(user_id=user.pk, channel=self.channel_name, now=time.time()):
            limit = settings.LOOPWATCH_ALERT_SOCKETS_PER_USER
            detail = (
                f"too many alert sockets open for this user (LOOPWATCH_ALERT_SOCKETS_PER_USER={limit}); "
                "close another alerts page"
            )
            await self._send({"type": "error", "field": None, "detail": detail})
            await self.close(code=CLOSE_TOO_MANY, reason="too many alert sockets for this user")
            return
        self._claimed_for = user.pk
        self.tenant_ids = await database_sync_to_async(user_tenant_ids)(user=user)
        # Join before reading the catch-up: an alert published in between comes twice (the page
        # keeps one per id), never not at all.
        for tenant_id in self.tenant_ids:
            await self._join(tenant_id)
        cursor = after or 0
        if after is not None:
            alerts, more = await database_sync_to_async(alerts_after)(
                tenant_ids=self.tenant_ids, filters=self.filters, after=after
            )
            await self._send({"type": "catch_up", "alerts": alerts, "more": more})
            if alerts:
                cursor = max(cursor, alerts[-1]["id"])
        if self.filters.observe:
            self._tasks.append(asyncio.ensure_future(self._poll_observations(cursor)))
        self._tasks.append(asyncio.ensure_future(self._follow_access()))

    async def disconnect(self, code: int) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for group in list(self.groups_joined):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []
        if self._claimed_for is not None:
            release = sync_to_async(alert_socket_release, thread_sensitive=False)
            with contextlib.suppress(Exception):  # unreleased, the claim runs out by itself
                await release(user_id=self._claimed_for, channel=self.channel_name)
            self._claimed_for = None

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Pages send nothing but keep-alive pings."""
        if text_data == "ping":
            await self.send(text_data="pong")

    # --- group messages -----------------------------------------------------------------------

    async def alert_detection(self, message: dict) -> None:
        alert = message["alert"]
        # The groups say the same; this holds between a membership's end and the next check too.
        if alert.get("tenant_id") in self.tenant_ids and self.filters.matches(alert):
            await self._send({"type": "alert", "alert": alert})

    async def alert_feedback(self, message: dict) -> None:
        await self._send({"type": "feedback", "feedback": message["feedback"]})

    async def incident_verdict(self, message: dict) -> None:
        await self._send({"type": "verdict", "verdict": message["verdict"]})

    # --- helpers ------------------------------------------------------------------------------

    async def _join(self, tenant_id: int) -> None:
        group = alerts_group(tenant_id)
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.append(group)

    async def _follow_access(self) -> None:
        """Close when the session ended; leave and join groups as the user's memberships change."""
        user = self.scope["user"]
        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None)
        while True:
            await asyncio.sleep(ACCESS_CHECK_S)
            try:
                renew = sync_to_async(alert_socket_renew, thread_sensitive=False)
                await renew(user_id=user.pk, channel=self.channel_name, now=time.time())
                tenant_ids = await database_sync_to_async(_access_now)(user=user, session_key=session_key)
            except Exception:  # a database or Redis hiccup: check again next time
                logger.exception("checking the alerts socket's access failed")
                continue
            if tenant_ids is None:
                await self.close(code=CLOSE_UNAUTHENTICATED, reason="signed out")
                return
            for gone in set(self.tenant_ids) - set(tenant_ids):
                group = alerts_group(gone)
                await self.channel_layer.group_discard(group, self.channel_name)
                self.groups_joined.remove(group)
            for new in set(tenant_ids) - set(self.tenant_ids):
                await self._join(new)
            self.tenant_ids = tenant_ids

    async def _poll_observations(self, cursor: int) -> None:
        observations = AlertFilters(
            kind=self.filters.kind,
            backend=self.filters.backend,
            action=Detection.Action.OBSERVE,
            observe=True,
        )
        while True:
            await asyncio.sleep(OBSERVE_POLL_S)
            try:
                alerts, _ = await database_sync_to_async(alerts_after)(
                    tenant_ids=self.tenant_ids, filters=observations, after=cursor
                )
            except Exception:  # a database hiccup must not end the live stream
                logger.exception("reading observations for the alerts socket failed")
                continue
            for alert in alerts:
                await self._send({"type": "alert", "alert": alert})
                cursor = max(cursor, alert["id"])

    async def _send(self, payload: dict) -> None:
        await self.send(text_data=orjson.dumps(payload).decode())


def _access_now(*, user, session_key: str | None) -> list[int] | None:
    """The user's tenant ids now, or None when the session is over or the user was deactivated.

    Without a session (a socket authenticated otherwise, as in tests) only the user is checked."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    # Loaded, not just looked up: an expired session loads empty (exists() still finds its row),
    # and a session now signed in as someone else is not this user's.
    if session_key is not None and str(store(session_key=session_key).get(SESSION_KEY)) != str(user.pk):
        return None
    if not type(user).objects.filter(pk=user.pk, is_active=True).exists():
        return None
    return user_tenant_ids(user=user)


def _after(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise AlertFilterError("after", "must be a detection id (a whole number ≥ 0)")
    return int(raw)
