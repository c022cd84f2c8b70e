"""The live alerts socket of the pages: /ws/alerts?after=<id>[&observe=1&kind=&backend=&action=].

Session-authenticated (AuthMiddlewareStack). It joins the alerts group of each of the user's
tenants, then sends, oldest first, every stored alert after `after` (Channels delivers group
messages at most once: a page that reconnects catches up from the last id it saw), then the live
ones. Messages, all JSON:

    {"type": "catch_up", "alerts": [...], "more": false}   once, first (more: older ones were left out)
    {"type": "alert", "alert": {...}}                       each new intervention (and observation)
    {"type": "feedback", "feedback": {...}}                 someone marked an alert
    {"type": "error", "field": "after", "detail": "..."}    then the socket closes with 4400

The pipeline publishes interventions only; with observe=1 the observations are read from the
database every OBSERVE_POLL_S seconds. A socket without a signed-in user is closed with 4401.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import parse_qsl

import orjson
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from dashboards.alerts.selectors import (
    AlertFilterError,
    AlertFilters,
    alerts_after,
    user_tenant_ids,
)
from ingest.events import alerts_group
from ingest.models import Detection

logger = logging.getLogger(__name__)

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
OBSERVE_POLL_S = 2.0  # observations are not published live; how stale they may be on the page


class AlertsConsumer(AsyncWebsocketConsumer):
    groups_joined: list[str]
    tenant_ids: list[int]

    async def connect(self) -> None:
        self.groups_joined = []
        self._poller: asyncio.Task | None = None
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
        self.tenant_ids = await database_sync_to_async(user_tenant_ids)(user=user)
        # Join before reading the catch-up: an alert published in between comes twice (the page
        # keeps one per id), never not at all.
        for tenant_id in self.tenant_ids:
            group = alerts_group(tenant_id)
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        cursor = after or 0
        if after is not None:
            alerts, more = await database_sync_to_async(alerts_after)(
                tenant_ids=self.tenant_ids, filters=self.filters, after=after
            )
            await self._send({"type": "catch_up", "alerts": alerts, "more": more})
            if alerts:
                cursor = max(cursor, alerts[-1]["id"])
        if self.filters.observe and self.tenant_ids:
            self._poller = asyncio.ensure_future(self._poll_observations(cursor))

    async def disconnect(self, code: int) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Pages send nothing but keep-alive pings."""
        if text_data == "ping":
            await self.send(text_data="pong")

    # --- group messages -----------------------------------------------------------------------

    async def alert_detection(self, message: dict) -> None:
        alert = message["alert"]
        if self.filters.matches(alert):
            await self._send({"type": "alert", "alert": alert})

    async def alert_feedback(self, message: dict) -> None:
        await self._send({"type": "feedback", "feedback": message["feedback"]})

    # --- helpers ------------------------------------------------------------------------------

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


def _after(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise AlertFilterError("after", "must be a detection id (a whole number ≥ 0)")
    return int(raw)
