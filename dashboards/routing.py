"""WebSocket routes of the pages (session-authenticated, tenant-scoped groups)."""

from __future__ import annotations

from django.urls import path

from dashboards.alerts.consumers import AlertsConsumer

websocket_urlpatterns: list = [
    path("ws/alerts", AlertsConsumer.as_asgi()),
]
