"""WebSocket routes of the pages (session-authenticated, tenant-scoped groups)."""

from __future__ import annotations

websocket_urlpatterns: list = []
