"""ASGI entry point: HTTP through Django, WebSocket through Channels."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing

import django
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import close_old_connections
from django.http import FileResponse
from django.http.response import HttpResponseBase
from django.urls import Resolver404, resolve, set_script_prefix, set_urlconf
from django.utils.log import log_response

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")

# Threads that run requests, reused from request to request; each holds at most one database
# connection while it runs one (the pool's default size is 8 as well).
HTTP_THREADS = 8
# The garbage collector's young generation in a web process: a collection every this many
# allocations (net of the objects freed), not Python's 700. A batch of 1,000 events holds
# ~5,000 dicts and lists while it is stored, then frees them by reference counting; at 700 the
# collector ran ~7 times a batch, rescanning the batch's live objects each time: 2.4 ms of a
# batch's ~35 ms of CPU, in pauses of up to 3.4 ms, and a guard check paid the same way. At
# 10,000 a batch never reaches it (none in 240 batches of either shape), a young collection
# scans at most that many objects (1-2 ms), and bench/guard.py at 300/s went from p50 5.1-5.3
# / p99 20-21 ms to 3.6-3.7 / 16-17 ms (alternating runs). Not Celery's (50,000, 20, 20): in a
# web process those rarer, longer collections stretched the guard's tail (loopwatch/celery.py).
WEB_GC_THRESHOLD = 10_000

logger = logging.getLogger("django.request")


class BodyRefused(Exception):
    """A request body refused while it was read: too large (413) or too slow (408)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with a request served by one synchronous call on a reused thread.

    Django's own handler, for every request, starts a thread of its own (ThreadSensitiveContext),
    runs each hook of the middleware that can do both in async mode, crossing between the event
    loop and that thread a dozen times, sends the request signals from the event loop and watches
    for a disconnect with two more tasks: on this 2-core machine, more CPU than a small API view
    itself. Here the event loop only reads the body and writes the answer; the request signals,
    the middleware chain and the view run as one call on a thread of a fixed pool, where the
    database connection is taken from the pool and given back (request_started/request_finished).
    Every view here is synchronous (DRF and the pages), so a client that goes away cannot cancel
    one anyway; WebSockets are Channels' and never come here.

    The body is read here with limits (docs/security.md), before anything else runs:
    1. A request with a body to a view that needs an API key (ingest.auth.key_required) and
       without a valid one is handed to Django with an empty body: the view answers its 401 in its
       own format, and the body the client is still sending is never read (the connection closes).
    2. A Content-Length over LOOPWATCH_MAX_BODY_BYTES is answered 413 before a byte is read; a
       chunked body is answered 413 as soon as what came is over it.
    3. A body that has not all come within LOOPWATCH_BODY_TIMEOUT_S is answered 408.
    uvicorn stops reading the socket while a body waits for the application, so nothing unread
    piles up in memory either.
    """

    def __init__(self) -> None:
        super().__init__()
        self._executor = ThreadPoolExecutor(max_workers=HTTP_THREADS, thread_name_prefix="http")

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send):
        # No ThreadSensitiveContext (a new thread per request): the work runs on the executor.
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send):
        loop = asyncio.get_running_loop()
        close = False
        view = _view_of(scope) if _has_body(scope) else None
        if key_required(view) and not await self._key_valid(scope):
            body_file, close = tempfile.SpooledTemporaryFile(), True  # (1) the view answers 401
        else:
            try:
                body_file = await self._body_read(scope, receive)
            except RequestAborted:
                return
            except BodyRefused as refused:
                await self._refuse(scope, send, view, refused)
                return
        response, start, body = await loop.run_in_executor(self._executor, self._respond, scope, body_file)
        if close:
            start["headers"].append((b"connection", b"close"))
        if body is not None:  # closed already, in the request's thread
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        try:  # a streaming response (a file, say): chunk by chunk, then closed in a request thread
            await send(start)
            if response.is_async:
                async with aclosing(aiter(response.streaming_content)) as content:
                    async for part in content:
                        await self._send_chunks(send, part)
            else:  # a file or a generator: read in the pool's threads, never on the event loop
                content = iter(response.streaming_content)
                while (part := await loop.run_in_executor(self._executor, next, content, None)) is not None:
                    await self._send_chunks(send, part)
            await send({"type": "http.response.body"})
        finally:
            await loop.run_in_executor(self._executor, response.close)

    async def _key_valid(self, scope) -> bool:
        raw = bearer_token(_header(scope, b"authorization"))
        if not raw:
            return False
        if api_key_cached(raw):  # the usual case: no thread, no database
            return True
        return await asyncio.get_running_loop().run_in_executor(self._executor, _key_lookup, raw)

    async def _body_read(self, scope, receive) -> tempfile.SpooledTemporaryFile:
        """The body, in memory up to FILE_UPLOAD_MAX_MEMORY_SIZE then in a temp file, or
        BodyRefused (2, 3)."""
        limit = settings.LOOPWATCH_MAX_BODY_BYTES
        length = _header(scope, b"content-length")
        if length.isdigit() and int(length) > limit:
            raise BodyRefused(
                413,
                "body_too_large",
                f"body: {length} bytes, the limit is {limit} bytes (LOOPWATCH_MAX_BODY_BYTES)",
            )
        body_file = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")
        size = 0
        timeout = settings.LOOPWATCH_BODY_TIMEOUT_S
        try:
            async with asyncio.timeout(timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise RequestAborted()
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise BodyRefused(
                            413,
                            "body_too_large",
                            f"body: over the limit of {limit} bytes (LOOPWATCH_MAX_BODY_BYTES)",
                        )
                    body_file.write(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            body_file.close()
            raise BodyRefused(
                408, "body_timeout", f"body: not received within {timeout} s (LOOPWATCH_BODY_TIMEOUT_S)"
            ) from None
        except BaseException:
            body_file.close()
            raise
        body_file.seek(0)
        return body_file

    async def _refuse(self, scope, send, view, refused: BodyRefused) -> None:
        """The refusal in the view's format (its `refusal`, else the API's JSON error); the
        connection is closed after it, as the rest of the body is not read."""
        content_type = _header(scope, b"content-type")
        make = getattr(view, "refusal", None)
        response = (
            make(content_type, refused.status, refused.code, refused.detail)
            if make
            else json_error(refused.status, refused.code, refused.detail, field="body")
        )
        logger.warning("%s: %s (%s)", response.reason_phrase, scope["path"], refused.detail)
        response["Content-Length"] = str(len(response.content))
        headers = [*_headers(response), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": response.content})

    async def _send_chunks(self, send, part: bytes) -> None:
        for chunk, _ in self.chunk_bytes(part):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

    def _respond(self, scope, body_file) -> tuple[HttpResponseBase, dict, bytes | None]:
        """The request, start to end, in a thread of the pool: the response, its start message, and
        its body when it is not streamed (the response is then closed: request_finished has run)."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)  # takes no connection yet
        request, response = self.create_request(scope, body_file)
        if request is not None:
            set_urlconf(settings.ROOT_URLCONF)
            response = self._middleware_chain(request)
            response._resource_closers.append(request.close)
            if response.status_code >= 400:
                log_response(
                    "%s: %s", response.reason_phrase, request.path, response=response, request=request
                )
        response._handler_class = self.__class__
        response._resource_closers.append(body_file.close)
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        start = {"type": "http.response.start", "status": response.status_code, "headers": _headers(response)}
        if response.streaming:
            return response, start, None
        body = response.content
        response.close()  # request_finished: the connection goes back to the pool, from this thread
        return response, start, body


def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _has_body(scope) -> bool:
    length = _header(scope, b"content-length")
    return (length != "" and length != "0") or _header(scope, b"transfer-encoding") != ""


def _view_of(scope) -> type | None:
    """The class of the view the request goes to, or None (no such route, or a function)."""
    path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
    try:
        match = resolve(path)
    except Resolver404:
        return None
    return getattr(match.func, "view_class", None)


def _key_lookup(raw: str) -> bool:
    """Whether the key is valid; with the database away, as if it were: the view then answers 503
    (ingest.api.errors), which tells the client to come back, where a 401 would tell it to give up."""
    try:
        return api_key_lookup(raw) is not None
    except Exception as exc:
        if not database_failure(exc):
            raise
        return True
    finally:
        close_old_connections()  # as at the end of a request: the connection goes back to the pool


def _headers(response: HttpResponseBase) -> list[tuple[bytes, bytes]]:
    # As ASGIHandler.send_response: header case kept (some clients need Content-Type), then cookies.
    headers = [
        (
            header.encode("ascii") if isinstance(header, str) else bytes(header),
            value.encode("latin1") if isinstance(value, str) else bytes(value),
        )
        for header, value in response.items()
    ]
    headers += [
        (b"Set-Cookie", c.output(header="").encode("ascii").strip()) for c in response.cookies.values()
    ]
    return headers


django.setup(set_prefix=False)
django_asgi_app = SyncChainASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402 - needs the apps loaded

from dashboards.routing import websocket_urlpatterns as page_routes  # noqa: E402
from ingest.api.errors import database_failure, json_error  # noqa: E402
from ingest.auth import bearer_token, key_required  # noqa: E402
from ingest.routing import websocket_urlpatterns as api_routes  # noqa: E402
from ingest.services.keys import api_key_cached, api_key_lookup  # noqa: E402


def _warm() -> None:
    """Load now what the first request that stores events would load: the Celery app's task
    registry (finalised on first use) and redis-py with the request path's client (no connection
    yet). Each worker's first batch spent 0.6 s on it, in a request an agent waits for."""
    from celery import current_app

    from ingest.pending import redis_client

    current_app.tasks  # noqa: B018 - finalises the app
    if settings.REDIS_URL:
        redis_client(fast=True)


_warm()

# Everything loaded so far lives as long as the process: keep it out of the garbage collector's
# full passes, which otherwise took a fifth of the CPU of a busy ingest worker.
gc.freeze()
gc.set_threshold(WEB_GC_THRESHOLD, *gc.get_threshold()[1:])

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Each route brings its own checks: the Origin on all, the session on the pages' only.
        "websocket": URLRouter(api_routes + page_routes),
    }
)
