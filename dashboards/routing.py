"""WebSocket routes of the pages (session-authenticated, tenant-scoped groups)."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from django.urls import path

from dashboards.alerts.consumers import AlertsConsumer
from loopwatch.security import WebsocketOriginCheck

# The session cookie authenticates these sockets, and a browser sends it from any page that opens
# one: only pages of this origin may (cross-site WebSocket hijacking).
websocket_urlpatterns: list = [
    path("ws/alerts", WebsocketOriginCheck(AuthMiddlewareStack(AlertsConsumer.as_asgi()))),
]
