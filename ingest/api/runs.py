"""Read API for runs and their events (read scope); everything scoped to the key's tenant."""

from __future__ import annotations

import base64
import binascii
import math
from datetime import datetime
from urllib.parse import urlencode

import orjson
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ingest.api.errors import ApiError
from ingest.auth import HasReadScope
from ingest.selectors import run_events, run_get, run_list

MAX_PAGE = 1000  # a page of events stays well under a few MB
FILTERS = ("status", "backend", "task_type", "agent", "model")  # GET /api/v1/runs, as run_list takes them


def _int_param(request, name: str, default: int, *, minimum: int, maximum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not (minimum <= int(raw) <= maximum):
        raise ApiError(
            400, "invalid_parameter", f"{name}: must be an integer from {minimum} to {maximum}", name
        )
    return int(raw)


class FiniteFloatField(serializers.FloatField):
    """A float the JSON renderer can write: infinity and NaN (stored before the caps of
    docs/limits.md) go out as null instead of failing the whole answer."""

    def to_representation(self, value):
        value = super().to_representation(value)
        return value if math.isfinite(value) else None


class DetectionStateSerializer(serializers.Serializer):
    """Whether detection is quarantined on the run (docs/limits.md): failures 0 means it is not."""

    failures = serializers.IntegerField()
    error = serializers.CharField()
    failed_at = serializers.DateTimeField(allow_null=True)
    retry_at = serializers.DateTimeField(allow_null=True)


class RunOutputSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    agent = serializers.CharField()
    task_type = serializers.CharField()
    backend = serializers.CharField()
    model = serializers.CharField()
    status = serializers.CharField()
    terminated_by = serializers.CharField()
    budget_type = serializers.CharField()
    reason = serializers.CharField()
    budgets = serializers.JSONField()
    labels = serializers.JSONField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    last_event_at = serializers.DateTimeField(allow_null=True)
    rounds = serializers.IntegerField()
    tool_calls = serializers.IntegerField()
    tool_errors = serializers.IntegerField()
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost_usd = FiniteFloatField(allow_null=True)
    events_count = serializers.IntegerField()
    processed = serializers.SerializerMethodField()
    counted = serializers.SerializerMethodField(
        help_text=(
            "The figures (rounds, calls, errors, tokens, cost, started_at, last_event_at) count the "
            "events up to this seq: the detection pass counts them; ingest writes only events_count "
            "and what run_started / run_finished describe."
        )
    )
    detection = serializers.SerializerMethodField()

    def get_processed(self, run) -> int:
        cursor = getattr(run, "cursor", None)
        return cursor.position if cursor else 0

    def get_counted(self, run) -> int:
        cursor = getattr(run, "cursor", None)
        return cursor.figures_seq if cursor else 0

    @extend_schema_field(DetectionStateSerializer)
    def get_detection(self, run) -> dict:
        cursor = getattr(run, "cursor", None)
        if cursor is None:
            return {"failures": 0, "error": "", "failed_at": None, "retry_at": None}
        return DetectionStateSerializer(cursor).data


def runs_cursor_encode(run) -> str:
    """The cursor of the page after `run`: its start and pk, opaque to clients."""
    started = run.started_at.isoformat() if run.started_at is not None else None
    return base64.urlsafe_b64encode(orjson.dumps([started, run.pk])).decode().rstrip("=")


def runs_cursor_decode(raw: str) -> tuple[datetime | None, int]:
    try:
        started, pk = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        if (
            not isinstance(pk, int)
            or isinstance(pk, bool)
            or not (started is None or isinstance(started, str))
        ):
            raise ValueError
        return (datetime.fromisoformat(started) if started is not None else None), pk
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise ApiError(
            400,
            "invalid_parameter",
            "cursor: not a cursor of this API (take it from the Link header of the page before)",
            "cursor",
        ) from None


class RunListApi(APIView):
    """Runs, the latest started first, a page at a time: when there are more, the answer's
    `Link: <…&cursor=…>; rel="next"` header is the next page (the same filters and limit). The
    cursor is a position in that order: a run whose start moves while you page (its OTLP root
    span arriving late moves it earlier) may be listed twice or not at all."""

    permission_classes = [HasReadScope]

    @extend_schema(
        operation_id="runs_list",
        parameters=[OpenApiParameter(name, str, required=False) for name in FILTERS]
        + [
            OpenApiParameter("limit", int, required=False, description=f"runs per page, 1 to {MAX_PAGE}"),
            OpenApiParameter(
                "detection", str, required=False, enum=["failed"], description="failed: quarantined runs only"
            ),
            OpenApiParameter(
                "cursor",
                str,
                required=False,
                description="the page after the one whose Link header gave this cursor",
            ),
            OpenApiParameter(
                "Link",
                str,
                location=OpenApiParameter.HEADER,
                response=[200],
                description='`</api/v1/runs?…&cursor=…>; rel="next"` when there are more runs: the next page',
            ),
        ],
        responses=RunOutputSerializer(many=True),
    )
    def get(self, request):
        limit = _int_param(request, "limit", 100, minimum=1, maximum=MAX_PAGE)
        if request.query_params.get("detection", "failed") != "failed":
            raise ApiError(400, "invalid_parameter", "detection: must be failed, or left out", "detection")
        for name in FILTERS:
            value = request.query_params.get(name, "")
            if len(value) > 200 or "\x00" in value:
                reason = (
                    "must not contain U+0000 (NUL)" if "\x00" in value else "must be at most 200 characters"
                )
                raise ApiError(400, "invalid_parameter", f"{name}: {reason}", name)
        raw = request.query_params.get("cursor")
        after = runs_cursor_decode(raw) if raw is not None else None
        runs = list(
            run_list(
                tenant=request.user.tenant, filters=request.query_params.dict(), limit=limit + 1, after=after
            ).select_related("cursor")
        )
        response = Response(RunOutputSerializer(runs[:limit], many=True).data)
        if len(runs) > limit:
            params = {k: v for k, v in request.query_params.items() if k != "cursor"}
            params["cursor"] = runs_cursor_encode(runs[limit - 1])
            response["Link"] = f'<{request.path}?{urlencode(params)}>; rel="next"'
        return response


class RunDetailApi(APIView):
    permission_classes = [HasReadScope]

    @extend_schema(operation_id="runs_retrieve", responses=RunOutputSerializer)
    def get(self, request, run_id: str):
        run = run_get(tenant=request.user.tenant, run_id=run_id)
        if run is None:
            raise ApiError(404, "not_found", f"run_id: no run {run_id!r} for this API key's tenant", "run_id")
        return Response(RunOutputSerializer(run).data)


class EventOutputSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    event = serializers.JSONField(source="body")


class RunEventsApi(APIView):
    permission_classes = [HasReadScope]

    @extend_schema(
        operation_id="runs_events",
        parameters=[
            OpenApiParameter("after", int, required=False),
            OpenApiParameter("limit", int, required=False),
        ],
        responses=EventOutputSerializer(many=True),
    )
    def get(self, request, run_id: str):
        run = run_get(tenant=request.user.tenant, run_id=run_id)
        if run is None:
            raise ApiError(404, "not_found", f"run_id: no run {run_id!r} for this API key's tenant", "run_id")
        after = _int_param(request, "after", 0, minimum=0, maximum=2**31 - 1)
        limit = _int_param(request, "limit", MAX_PAGE, minimum=1, maximum=MAX_PAGE)
        return Response(
            EventOutputSerializer(run_events(run=run, after_seq=after, limit=limit), many=True).data
        )
