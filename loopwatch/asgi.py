"""ASGI entry point: HTTP through Django, WebSocket through Channels."""

from __future__ import annotations

import gc
import os
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections
from django.urls import set_urlconf
from django.utils.log import log_response

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")

# Threads that run requests, reused from request to request; each holds at most one database
# connection while it runs one (the pool's default size is 8 as well).
HTTP_THREADS = 8


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with middleware and view run as one synchronous call on a reused thread.

    Django's own handler, for every request, starts a thread of its own (ThreadSensitiveContext)
    and runs each hook of the middleware that can do both in async mode, crossing between the event
    loop and that thread a dozen times: on this 2-core machine, 4 of the 6.6 ms of CPU a bare 404
    cost. Here the whole chain is one call on a thread of a fixed pool, which also closes what
    request_started and request_finished would close, in the thread that used it. Every view here
    is synchronous (DRF and the pages); WebSockets are Channels' and never come here.
    """

    def __init__(self) -> None:
        super().__init__()
        self._executor = ThreadPoolExecutor(max_workers=HTTP_THREADS, thread_name_prefix="http")

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        chain = self._middleware_chain

        def run(request):
            close_old_connections()  # as request_started does, in this thread
            try:
                return chain(request)
            finally:
                close_old_connections()  # back to the pool: as request_finished does, in this thread

        self._run_chain = run

    async def get_response_async(self, request):
        # BaseHandler.get_response_async, with the chain on the executor.
        set_urlconf(settings.ROOT_URLCONF)
        response = await sync_to_async(self._run_chain, thread_sensitive=False, executor=self._executor)(
            request
        )
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
        return response

    async def __call__(self, scope, receive, send):
        # No ThreadSensitiveContext (a new thread per request): the work runs on the executor.
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)


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
