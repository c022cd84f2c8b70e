"""POST /api/v1/events: a batch of trace events (JSON array or JSON Lines)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.views import APIView

from ingest import metrics
from ingest.api.errors import ApiError, RateLimited
from ingest.auth import HasIngestScope
from ingest.models import ApiKey
from ingest.quotas import OverLimit, quota_take
from ingest.services import EventTooLarge, IngestResult, events_ingest

JSON_TYPES = ("application/json", "")
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines", "application/ndjson")


def parse_batch(body: bytes, content_type: str) -> list[Any]:
    """The events of a request body, or ApiError(400/413/415) naming what is wrong."""
    media = content_type.split(";")[0].strip().lower()
    if media in NDJSON_TYPES:
        return _parse_lines(body)
    if media not in JSON_TYPES:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type: {media!r} is not accepted; send application/json or application/x-ndjson",
            field="Content-Type",
        )
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"body: not valid JSON ({exc})", field="body") from None
    if isinstance(data, dict):
        return [data]
    if not isinstance(data, list):
        raise ApiError(400, "invalid_batch", "body: must be a JSON array of trace events", field="body")
    return data


class _BadLine:
    """An NDJSON line that is not JSON; validation turns it into a rejected verdict."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _parse_lines(body: bytes) -> list[Any]:
    events: list[Any] = []
    for line in body.split(b"\n"):
        if not line.strip():
            continue
        try:
            events.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            events.append(_BadLine(f"not valid JSON ({exc})"))
    return events


def check_batch_size(events: list[Any]) -> None:
    if not events:
        raise ApiError(400, "empty_batch", "body: the batch holds no event", field="body")
    limit = settings.LOOPWATCH_MAX_BATCH_EVENTS
    if len(events) > limit:
        raise ApiError(
            413,
            "too_many_events",
            f"body: {len(events)} events in one batch, the limit is {limit} (LOOPWATCH_MAX_BATCH_EVENTS)",
            field="body",
        )


def events_quota_take(key: ApiKey, count: int) -> None:
    """Count `count` events against the key's and its tenant's limits, or RateLimited (429)."""
    try:
        quota_take(key=key, what="events", cost=count)
    except OverLimit as over:
        metrics.events_refused(tenant=key.tenant, count=count, reason="rate_limited")
        raise RateLimited(over) from None


def ingest_batch(*, key: ApiKey, events: list[Any], transport: str) -> IngestResult:
    """Take the batch from the key's limits, validate and store; NDJSON lines that were not JSON
    come back as rejected verdicts. Counted in the metrics by verdict, and timed."""
    events_quota_take(key, len(events))
    started = time.perf_counter()
    result = _ingest_batch(tenant=key.tenant, events=events, ledger_scope=ApiKey.Scope.LEDGER in key.scopes)
    metrics.ingest_batch_timed(transport, time.perf_counter() - started)
    metrics.events_counted(tenant=key.tenant, verdicts=result.verdicts)
    return result


def _ingest_batch(*, tenant, events: list[Any], ledger_scope: bool) -> IngestResult:
    """ledger_scope: whether the sending key also has the `ledger` scope (see events_ingest)."""
    bad = {i: e.reason for i, e in enumerate(events) if isinstance(e, _BadLine)}
    if bad:
        events = [None if isinstance(e, _BadLine) else e for e in events]
    try:
        result = events_ingest(
            tenant=tenant,
            events=events,
            max_event_bytes=settings.LOOPWATCH_MAX_EVENT_BYTES,
            ledger_scope=ledger_scope,
        )
    except EventTooLarge as exc:
        metrics.events_refused(tenant=tenant, count=len(events), reason="too_large")
        raise ApiError(
            413, "event_too_large", f"{exc} (LOOPWATCH_MAX_EVENT_BYTES)", field=f"[{exc.index}]"
        ) from None
    for verdict in result.verdicts:
        reason = bad.get(verdict["index"])
        if reason is not None:
            path = f"[{verdict['index']}]"
            verdict["field"], verdict["reason"], verdict["error"] = path, reason, f"{path}: {reason}"
    return result


class VerdictSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["accepted", "duplicate", "rejected"])
    field = serializers.CharField(required=False, help_text="Path of the wrong field, like [3].args")
    reason = serializers.CharField(required=False)
    error = serializers.CharField(required=False, help_text="field: reason")


class IngestOutputSerializer(serializers.Serializer):
    accepted = serializers.IntegerField()
    duplicate = serializers.IntegerField()
    rejected = serializers.IntegerField()
    results = VerdictSerializer(many=True)


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField()
    detail = serializers.CharField()
    field = serializers.CharField(required=False)


class RateLimitedSerializer(ErrorSerializer):
    limit = serializers.CharField(help_text="The limit the request was over, e.g. tenant.events_per_s.")
    retry_after_s = serializers.IntegerField(help_text="Seconds to wait, as Retry-After says.")


class EventsIngestApi(APIView):
    """Store a batch of trace events v1; answer a verdict per event.

    200: every event accepted or duplicate; 207: some rejected, the rest stored;
    422: every event rejected. 400 a body that is not JSON, 413 over a limit,
    415 another content type, 401/403 a missing, unknown or under-scoped key,
    429 over a rate limit or quota of the key or its tenant (Retry-After; the body names the limit).
    """

    permission_classes = [HasIngestScope]
    parser_classes: list = []

    @extend_schema(
        operation_id="events_ingest",
        request=None,  # the TraceEvent array is put in by ingest.openapi.add_trace_event_schema
        responses={
            200: IngestOutputSerializer,
            207: IngestOutputSerializer,
            422: IngestOutputSerializer,
            400: ErrorSerializer,
            401: ErrorSerializer,
            403: ErrorSerializer,
            413: ErrorSerializer,
            415: ErrorSerializer,
            429: RateLimitedSerializer,
        },
    )
    def post(self, request):
        length = request.META.get("CONTENT_LENGTH") or "0"
        limit = settings.LOOPWATCH_MAX_BODY_BYTES
        if not length.isdigit():
            raise ApiError(400, "bad_request", "Content-Length: must be a number", field="Content-Length")
        if int(length) > limit:
            raise ApiError(
                413,
                "body_too_large",
                f"body: {length} bytes, the limit is {limit} bytes (LOOPWATCH_MAX_BODY_BYTES)",
                field="body",
            )
        body = request.body
        if len(body) > limit:
            raise ApiError(413, "body_too_large", f"body: over the limit of {limit} bytes", field="body")
        events = parse_batch(body, request.META.get("CONTENT_TYPE", ""))
        check_batch_size(events)
        result = ingest_batch(key=request.auth, events=events, transport="rest")
        payload = result.as_dict()
        code: int = status.HTTP_200_OK
        if payload["rejected"]:
            code = 422 if payload["rejected"] == len(events) else 207
        return HttpResponse(orjson.dumps(payload), status=code, content_type="application/json")
