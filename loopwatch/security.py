"""What keeps secrets and sessions safe at the edges of the web process (docs/security.md).

- SafeExceptionReporterFilter: a 500's report (the debug page, a logged or mailed report) shows no
  connection URL, key or token;
- ContentSecurityPolicyMiddleware: the Content-Security-Policy header of every answer;
- WebsocketOriginCheck: a WebSocket opened by a browser page of another origin is refused;
- login_locked_out: the page django-axes answers a locked-out sign-in with.
"""

from __future__ import annotations

import logging
import math
import re
from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpResponse
from django.http.request import split_domain_port, validate_host
from django.shortcuts import render
from django.utils.http import is_same_domain
from django.views.debug import SafeExceptionReporterFilter as DjangoFilter

logger = logging.getLogger(__name__)


class SafeExceptionReporterFilter(DjangoFilter):
    """Django's filter hides settings whose names say KEY, TOKEN, PASS...; ours also hides the ones
    that carry a password inside a URL or a structure (DATABASE_URL, REDIS_URL, the broker, the
    channel layer's hosts) and the reconcilers' headers."""

    hidden_settings = re.compile(
        DjangoFilter.hidden_settings.pattern + "|_URL$|BROKER|CHANNEL_LAYERS|HEADERS|DSN",
        flags=re.IGNORECASE,
    )


class ContentSecurityPolicyMiddleware:
    """Content-Security-Policy from LOOPWATCH_CSP on every answer that does not set its own.

    Django 5.2 has no CSP of its own. The pages run no inline script (data goes through
    json_script, code through static files), so the default allows scripts of this origin only;
    styles may be inline because Plotly sets them on the charts it draws."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.policy = settings.LOOPWATCH_CSP

    def __call__(self, request):
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response


class WebsocketOriginCheck:
    """ASGI middleware for WebSocket routes: the handshake's Origin must be this server's origin
    (scheme, host and port, as the Host header and TLS say) or one of CSRF_TRUSTED_ORIGINS, and the
    Host one of ALLOWED_HOSTS; otherwise the handshake is refused (HTTP 403).

    Django's CSRF check, applied to sockets: a browser sends the session cookie with a socket that
    any page opens, even from another origin of the same site (another port), and that page then
    reads what the socket says. Channels' AllowedHostsOriginValidator compares host names only,
    so another port of the same host passes it. Browsers always send Origin on a WebSocket; a
    client that sends none is not a browser page, and is let through only where `missing_allowed`
    (sockets authenticated by an API key, not by a cookie)."""

    def __init__(self, app, *, missing_allowed: bool = False) -> None:
        self.app = app
        self.missing_allowed = missing_allowed

    async def __call__(self, scope, receive, send):
        problem = websocket_origin_problem(scope, missing_allowed=self.missing_allowed)
        if problem is None:
            return await self.app(scope, receive, send)
        logger.info("websocket %s refused: %s", scope.get("path"), problem)
        message = await receive()
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403


def websocket_origin_problem(scope, *, missing_allowed: bool) -> str | None:
    """Why this socket's handshake must be refused, or None when it may open."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope.get("headers") or []:
        headers[name.lower()] = value
    host = _host(headers)
    if host is None:
        return "Host: missing or not in ALLOWED_HOSTS"
    origin = headers.get(b"origin")
    if origin is None:
        return None if missing_allowed else "Origin: missing (browser pages always send it)"
    origin_text = origin.decode("latin-1")
    if origin_text == f"{'https' if _is_secure(scope, headers) else 'http'}://{host}":
        return None
    if _trusted(origin_text):
        return None
    return f"Origin: {origin_text!r} is neither this server's origin nor in CSRF_TRUSTED_ORIGINS"


def _host(headers: dict[bytes, bytes]) -> str | None:
    """The host as HttpRequest.get_host() finds it, or None when it is not allowed."""
    raw = None
    if settings.USE_X_FORWARDED_HOST:
        raw = headers.get(b"x-forwarded-host")
    raw = raw or headers.get(b"host")
    if not raw:
        return None
    host = raw.decode("latin-1").split(",")[0].strip()
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _ = split_domain_port(host)
    return host if domain and validate_host(domain, allowed) else None


def _is_secure(scope, headers: dict[bytes, bytes]) -> bool:
    """As HttpRequest.is_secure(): TLS here, or a proxy that says so in SECURE_PROXY_SSL_HEADER."""
    if scope.get("scheme") in ("wss", "https"):
        return True
    if settings.SECURE_PROXY_SSL_HEADER:
        meta_name, expected = settings.SECURE_PROXY_SSL_HEADER
        name = meta_name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin-1")
        value = headers.get(name, b"").decode("latin-1").split(",")[0].strip()
        return value == expected
    return False


def _trusted(origin: str) -> bool:
    """As Django's CSRF check: an exact trusted origin, or a subdomain of a `scheme://*.domain` one."""
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return any(
        is_same_domain(parts.netloc, trusted.split("://", 1)[1][1:])
        for trusted in settings.CSRF_TRUSTED_ORIGINS
        if trusted.startswith(f"{parts.scheme}://*")
    )


def login_locked_out(request, original_response=None, credentials=None) -> HttpResponse:
    """django-axes' answer to a sign-in of a locked-out user and address (AXES_LOCKOUT_CALLABLE)."""
    minutes = math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60)
    return render(
        request,
        "registration/locked_out.html",
        {"minutes": minutes, "failure_limit": settings.AXES_FAILURE_LIMIT},
        status=settings.AXES_HTTP_RESPONSE_CODE,
    )
