"""POST /v1/traces: OTLP/HTTP trace exports (protobuf or JSON, gzip or not) as trace events."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.views import APIView

from ingest import metrics
from ingest.auth import HasIngestScope
from ingest.models import ApiKey
from ingest.otlp.service import otlp_traces_ingest
from ingest.otlp.wire import (
    CONTENT_TYPES,
    JSON,
    OtlpError,
    decompress,
    encoding_of,
    request_decode,
    response_encode,
    status_encode,
)
from ingest.quotas import OverLimit, quota_take

logger = logging.getLogger(__name__)

# How many spans the export held, and what became of them: for people reading a proxy's log or
# curl's output (the OTLP answer itself only counts the rejected ones).
SPANS_HEADER = "X-Loopwatch-Spans"


class _AnswerInRequestEncoding(BaseContentNegotiation):
    """The answer's encoding follows the request's Content-Type, whatever Accept says (exporters
    send */*, or nothing): DRF's negotiation would refuse an Accept of application/x-protobuf."""

    def select_parser(self, request, parsers):
        return None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class OtlpTracesIngestApi(APIView):
    """Store an OTLP/HTTP trace export (ExportTraceServiceRequest) as trace events v1.

    200 with an ExportTraceServiceResponse (partial_success names the refused spans and why);
    400 an undecodable body, or every span refused; 401/403 a missing, unknown or under-scoped
    key (or a resource naming another tenant); 413 over a limit; 415 another content type or
    encoding; 429 over a rate limit or quota, spans counting as events (Retry-After; the message
    names the limit: exporters retry after it). Errors are a google.rpc.Status; everything is in the request's encoding.
    """

    permission_classes = [HasIngestScope]
    parser_classes: list = []
    content_negotiation_class = _AnswerInRequestEncoding

    @extend_schema(
        operation_id="otlp_traces_ingest",
        request={"application/x-protobuf": bytes, "application/json": dict},
        responses={
            200: OpenApiResponse(description="ExportTraceServiceResponse"),
            400: OpenApiResponse(description="google.rpc.Status"),
            401: OpenApiResponse(description="google.rpc.Status"),
            403: OpenApiResponse(description="google.rpc.Status"),
            413: OpenApiResponse(description="google.rpc.Status"),
            415: OpenApiResponse(description="google.rpc.Status"),
            429: OpenApiResponse(description="google.rpc.Status"),
        },
    )
    def post(self, request):
        encoding = encoding_of(request.META.get("CONTENT_TYPE", ""))
        limit = settings.LOOPWATCH_MAX_BODY_BYTES
        length = request.META.get("CONTENT_LENGTH") or "0"
        if not length.isdigit():
            raise OtlpError(400, "bad_request", "Content-Length", "must be a number")
        if int(length) > limit:
            raise OtlpError(
                413,
                "body_too_large",
                "body",
                f"{length} bytes, the limit is {limit} bytes (LOOPWATCH_MAX_BODY_BYTES)",
            )
        raw = request.body
        if len(raw) > limit:  # a chunked body says no Content-Length
            raise OtlpError(
                413, "body_too_large", "body", f"over the limit of {limit} bytes (LOOPWATCH_MAX_BODY_BYTES)"
            )
        body = decompress(raw, request.META.get("HTTP_CONTENT_ENCODING", ""), limit)
        export = request_decode(body, encoding)
        spans = sum(len(scope.spans) for resource in export.resource_spans for scope in resource.scope_spans)
        if spans > settings.LOOPWATCH_MAX_BATCH_EVENTS:
            raise OtlpError(
                413,
                "too_many_spans",
                "body",
                f"{spans} spans in one export, the limit is {settings.LOOPWATCH_MAX_BATCH_EVENTS} "
                "(LOOPWATCH_MAX_BATCH_EVENTS)",
            )
        tenant = request.user.tenant
        try:
            quota_take(key=request.auth, what="events", cost=spans)
        except OverLimit:
            metrics.events_refused(tenant=tenant, count=spans, reason="rate_limited")
            raise
        started = time.perf_counter()
        result = otlp_traces_ingest(
            tenant=tenant,
            request=export,
            run_id_sources=settings.LOOPWATCH_OTLP_RUN_ID,
            max_event_bytes=settings.LOOPWATCH_MAX_EVENT_BYTES,
            ledger_scope=ApiKey.Scope.LEDGER in request.auth.scopes,
        )
        metrics.ingest_batch_timed("otlp", time.perf_counter() - started)
        metrics.events_counted_otlp(
            tenant=tenant, accepted=result.accepted, duplicate=result.duplicate, rejected=result.rejected
        )
        if result.rejected:
            logger.info("otlp export for %s: %s", request.user.tenant.slug, result.message())
        if result.rejected and result.rejected == result.spans:
            # Nothing of the export could be used: a failed request, not a partial success.
            raise OtlpError(400, "all_spans_rejected", "body", result.message())
        response = HttpResponse(
            response_encode(encoding, result.rejected, result.message()), content_type=CONTENT_TYPES[encoding]
        )
        response[SPANS_HEADER] = (
            f"spans={result.spans} accepted={result.accepted} duplicate={result.duplicate} waiting={result.waiting} "
            f"ignored={result.ignored} rejected={result.rejected}"
        )
        return response

    def handle_exception(self, exc):
        """Every refusal as a google.rpc.Status in the request's encoding (JSON when it has none)."""
        try:
            encoding = encoding_of(self.request.META.get("CONTENT_TYPE", ""))
        except OtlpError:
            encoding = JSON
        headers: dict[str, str] = {}
        if isinstance(exc, OtlpError):
            status, message = exc.status, str(exc)
        elif isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            status, message = 401, str(exc.detail)
            headers["WWW-Authenticate"] = 'Bearer realm="loopwatch"'
        elif isinstance(exc, exceptions.PermissionDenied):
            status, message = 403, str(exc.detail)
        elif isinstance(exc, exceptions.MethodNotAllowed):
            status, message = 405, f"method: {exc.detail}; send POST"
            headers["Allow"] = "POST"
        elif isinstance(exc, OverLimit):
            status, message = 429, str(exc)
            headers["Retry-After"] = str(exc.retry_after_s)
        else:
            return super().handle_exception(exc)
        response = status_response(encoding, status, message)
        for name, value in headers.items():
            response[name] = value
        return response

    @staticmethod
    def refusal(content_type: str, status: int, code: str, detail: str) -> HttpResponse:
        """A body refused before the view ran (loopwatch/asgi.py: too large, too slow)."""
        try:
            encoding = encoding_of(content_type)
        except OtlpError:
            encoding = JSON
        return status_response(encoding, status, detail)


def status_response(encoding: str, status: int, message: str) -> HttpResponse:
    return HttpResponse(
        status_encode(encoding, status, message), status=status, content_type=CONTENT_TYPES[encoding]
    )
