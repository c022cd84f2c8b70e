"""WebSocket ingest at /ws/v1/events.

Authenticate with `Authorization: Bearer <key>` on the handshake, or with a first
message {"auth": "<key>"}. Then each message is one event or an array of events
and gets an ack: {"ack": n, "accepted": .., "duplicate": .., "rejected": .., "results": [...]}.
A bad message gets {"ack": n, "error": code, "detail": ...} and the socket stays open.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from ingest.api.errors import ApiError
from ingest.api.events import check_batch_size, ingest_batch
from ingest.auth import bearer_token
from ingest.models import ApiKey
from ingest.services.keys import api_key_lookup

logger = logging.getLogger(__name__)

# Close codes in the 4000 range (private use), mirroring the HTTP statuses.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
AUTH_TIMEOUT_S = 10  # a socket that never authenticates is not kept open


class EventsConsumer(AsyncWebsocketConsumer):
    key: ApiKey | None = None

    async def connect(self) -> None:
        self.acks = 0
        header = dict(self.scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        if header:
            raw = bearer_token(header)
            key = await database_sync_to_async(api_key_lookup)(raw) if raw else None
            if key is None:
                await self.close(
                    code=CLOSE_UNAUTHENTICATED, reason="Authorization: unknown or revoked API key"
                )
                return
            if not await self._authorize(key):
                return
            await self.accept()
            return
        await self.accept()
        self._auth_timer = asyncio.get_running_loop().call_later(AUTH_TIMEOUT_S, self._auth_expired)

    def _auth_expired(self) -> None:
        if self.key is None:
            self._closing = asyncio.ensure_future(
                self.close(code=CLOSE_UNAUTHENTICATED, reason=f"no auth message within {AUTH_TIMEOUT_S}s")
            )

    async def _authorize(self, key: ApiKey) -> bool:
        if ApiKey.Scope.INGEST not in key.scopes:
            await self.close(
                code=CLOSE_FORBIDDEN, reason="Authorization: this API key lacks the 'ingest' scope"
            )
            return False
        self.key = key
        return True

    async def disconnect(self, code: int) -> None:
        timer = getattr(self, "_auth_timer", None)
        if timer is not None:
            timer.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        raw = bytes_data if bytes_data is not None else (text_data or "").encode()
        if self.key is None:
            await self._receive_auth(raw)
            return
        self.acks += 1
        ack = self.acks
        if len(raw) > settings.LOOPWATCH_MAX_BODY_BYTES:
            await self._send(
                {
                    "ack": ack,
                    "error": "body_too_large",
                    "detail": f"message: over {settings.LOOPWATCH_MAX_BODY_BYTES} bytes",
                }
            )
            return
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            await self._send(
                {"ack": ack, "error": "invalid_json", "detail": f"message: not valid JSON ({exc})"}
            )
            return
        events: list[Any] = data if isinstance(data, list) else [data]
        try:
            check_batch_size(events)
            result = await database_sync_to_async(ingest_batch)(
                tenant=self.key.tenant,
                events=events,
                ledger_scope=ApiKey.Scope.LEDGER in self.key.scopes,
            )
        except ApiError as exc:
            await self._send({"ack": ack, "error": exc.error_code, "detail": str(exc.detail)})
            return
        except Exception:
            # As the REST API's 500, but the socket (and the client's next messages) stays up.
            logger.exception("ingest socket: message %d of tenant %s failed", ack, self.key.tenant_id)
            await self._send({"ack": ack, "error": "server_error", "detail": "internal error; it was logged"})
            return
        await self._send({"ack": ack, **result.as_dict()})

    async def _receive_auth(self, raw: bytes) -> None:
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            message = None
        token = message.get("auth") if isinstance(message, dict) else None
        if not isinstance(token, str):
            await self.close(code=CLOSE_UNAUTHENTICATED, reason='first message must be {"auth": "<api key>"}')
            return
        key = await database_sync_to_async(api_key_lookup)(token)
        if key is None:
            await self.close(code=CLOSE_UNAUTHENTICATED, reason="auth: unknown or revoked API key")
            return
        if await self._authorize(key):
            await self._send({"auth": "ok", "tenant": key.tenant.slug})

    async def _send(self, payload: dict) -> None:
        await self.send(text_data=orjson.dumps(payload).decode())
