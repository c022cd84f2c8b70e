"""WebSocket routes of the API."""

from __future__ import annotations

from django.urls import path

from ingest.consumers import EventsConsumer
from loopwatch.security import WebsocketOriginCheck

# Authenticated by an API key only (a header, or the first message): no session middleware, so a
# signed-in user's cookie authenticates nothing here. Agent runtimes send no Origin and are let
# in; a browser page of another origin is refused as on every socket.
websocket_urlpatterns = [
    path("ws/v1/events", WebsocketOriginCheck(EventsConsumer.as_asgi(), missing_allowed=True)),
]
