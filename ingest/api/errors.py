"""Every API error has one shape: {"error": code, "detail": message[, "field": path]}."""

from __future__ import annotations

import logging
import sys

from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.html import escape
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class ApiError(exceptions.APIException):
    """A 4xx with a code, a message and optionally the field it is about."""

    def __init__(self, status_code: int, code: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.error_code = code
        self.field = field


class RateLimited(ApiError):
    """429: over a rate limit or quota (ingest.quotas). The body names the limit and the seconds to
    wait (also in Retry-After): {"error": "rate_limited", "detail": …, "limit": "tenant.events_per_s",
    "retry_after_s": 2}."""

    def __init__(self, over) -> None:
        super().__init__(429, "rate_limited", str(over))
        self.limit = over.limit.name
        self.retry_after_s = over.retry_after_s

    def body(self) -> dict:
        return {
            "error": self.error_code,
            "detail": str(self.detail),
            "limit": self.limit,
            "retry_after_s": self.retry_after_s,
        }


def _flatten(detail, prefix: str = "") -> tuple[str | None, str]:
    """First (field, message) of a DRF ValidationError detail."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            field, message = _flatten(value, f"{prefix}.{name}" if prefix and name else (name or prefix))
            return field, message
    if isinstance(detail, list) and detail:
        return _flatten(detail[0], prefix)
    return (prefix or None), str(detail)


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, RateLimited):
        body = exc.body()
        response["Retry-After"] = str(exc.retry_after_s)
    elif isinstance(exc, ApiError):
        body = {"error": exc.error_code, "detail": str(exc.detail)}
        if exc.field:
            body["field"] = exc.field
    elif isinstance(exc, exceptions.ValidationError):
        field, message = _flatten(exc.detail)
        body = {"error": "invalid", "detail": f"{field}: {message}" if field else message}
        if field:
            body["field"] = field
    else:
        code = getattr(exc, "default_code", "error")
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        body = {"error": code, "detail": str(detail)}
    response.data = body
    return response


def json_error(status_code: int, code: str, detail: str, field: str | None = None) -> JsonResponse:
    body = {"error": code, "detail": detail}
    if field:
        body["field"] = field
    return JsonResponse(body, status=status_code)


# Machine paths answer JSON; everything else is a page a person opened in a browser.
API_PREFIXES = ("/api/", "/v1/", "/metrics", "/ws/")


def _wants_json(request) -> bool:
    return request.path.startswith(API_PREFIXES) or "application/json" in request.headers.get("Accept", "")


def _page(request, status_code: int, title: str, detail: str, *, plain: bool = False) -> HttpResponse:
    if plain:  # a server error renders nothing that could fail again (no database, no context)
        body = f"<!doctype html><title>{title}</title><h1>{title}</h1><p>{escape(detail)}</p>"
        return HttpResponse(body, status=status_code)
    return render(request, "error.html", {"title": title, "detail": detail}, status=status_code)


def not_found(request, exception=None):
    if _wants_json(request):
        return json_error(status.HTTP_404_NOT_FOUND, "not_found", f"{request.path}: no such resource")
    return _page(request, 404, "Not found", f"{request.path}: nothing here, or not in your tenants.")


def server_error(request):
    exc = sys.exc_info()[1]  # Django calls this handler inside its except block
    if database_failure(exc):
        return database_unavailable(request, exc)
    if _wants_json(request):
        return json_error(
            status.HTTP_500_INTERNAL_SERVER_ERROR, "server_error", "internal error; it was logged"
        )
    return _page(request, 500, "Server error", "Something failed on our side; it was logged.", plain=True)


# The database pool tries the server again at least every half second (loopwatch.db.pool): a client
# that comes back after this finds the service within a second or two of the database's return.
RETRY_AFTER_S = 2

logger = logging.getLogger(__name__)


def database_unavailable(request, exc: BaseException | None) -> HttpResponse:
    """503 with Retry-After: the database is down, frozen or out of connections, and the request
    can be sent again as it is (nothing was stored, or a retried batch comes back `duplicate`)."""
    logger.warning("%s %s: database unavailable: %s", request.method, request.path, exc)
    if _wants_json(request):
        detail = f"the database is unavailable; retry after {RETRY_AFTER_S} s"
        response: HttpResponse = json_error(status.HTTP_503_SERVICE_UNAVAILABLE, "unavailable", detail)
    else:
        detail = f"The database is unavailable; this page reloads in {RETRY_AFTER_S} s."
        response = _page(request, 503, "Unavailable", detail, plain=True)
        response["Refresh"] = str(RETRY_AFTER_S)
    response["Retry-After"] = str(RETRY_AFTER_S)
    # Logged by the warning above: Django's log_response skips it (a private flag the stubs omit).
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def database_failure(exc: BaseException | None) -> bool:
    # Django's wrappers (a query, a commit, a checkout from the pool), and psycopg's own raised
    # outside them (psycopg_pool.PoolTimeout is an OperationalError).
    from psycopg import InterfaceError as PgInterfaceError
    from psycopg import OperationalError as PgOperationalError

    return isinstance(exc, OperationalError | InterfaceError | PgOperationalError | PgInterfaceError)


class DatabaseUnavailableMiddleware:
    """A view that failed on the database answers 503 (database_unavailable), DRF's API views
    included (DRF re-raises what its exception handler does not take). What fails outside a view
    (a middleware) reaches server_error, which answers the same."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        return database_unavailable(request, exception) if database_failure(exception) else None


class NotFoundPageMiddleware:
    """A view's Http404 (an unknown tenant, run or operation in a URL, or another tenant's) answers the
    app's own 404 page (not_found), with DEBUG on too: Django's debug 404 page lists the URL patterns
    and settings to anyone who types a wrong slug."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        return not_found(request, exception) if isinstance(exception, Http404) else None


def bad_request(request, exception=None):
    if _wants_json(request):
        return json_error(status.HTTP_400_BAD_REQUEST, "bad_request", str(exception) or "bad request")
    return _page(request, 400, "Bad request", str(exception) or "bad request")


__all__ = [
    "ApiError",
    "DatabaseUnavailableMiddleware",
    "NotFoundPageMiddleware",
    "RateLimited",
    "Response",
    "bad_request",
    "database_unavailable",
    "exception_handler",
    "not_found",
    "server_error",
]
