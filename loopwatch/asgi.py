"""ASGI entry point: HTTP through Django, WebSocket through Channels."""

from __future__ import annotations

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402 - needs the apps loaded
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from dashboards.routing import websocket_urlpatterns as page_routes  # noqa: E402
from ingest.routing import websocket_urlpatterns as api_routes  # noqa: E402

# Everything loaded so far lives as long as the process: keep it out of the garbage collector's
# full passes, which otherwise took a fifth of the CPU of a busy ingest worker.
gc.freeze()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AuthMiddlewareStack(URLRouter(api_routes + page_routes)),
    }
)
