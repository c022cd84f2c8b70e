"""ASGI entry point: HTTP through Django, WebSocket through Channels."""

from __future__ import annotations

import gc
import os

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with middleware and view run as one synchronous chain, in one thread hop.

    Django's own handler runs every middleware that can do both in async mode, so each of their
    hooks (and the sync-only WhiteNoise between them) crosses between the event loop and a worker
    thread: a dozen hops, most of the ~8 ms of CPU a request cost. Every view here is synchronous
    (DRF and the pages); WebSockets are Channels' and never come here.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)


django.setup(set_prefix=False)
django_asgi_app = SyncChainASGIHandler()

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
