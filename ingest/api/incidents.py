"""Read API for incidents and a run's detections (read scope), scoped to the key's tenant."""

from __future__ import annotations

from urllib.parse import urlencode

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ingest.api.errors import ApiError
from ingest.api.events import ErrorSerializer
from ingest.api.runs import _int_param
from ingest.auth import HasReadScope
from ingest.detection import KINDS
from ingest.incidents import delivered_keys
from ingest.models import Detection, Incident
from ingest.selectors import run_get

MAX_PAGE = 500
INCIDENT_KINDS = (*KINDS, "duplicate_side_effect")
MAX_ID = 2**63 - 1


class StepSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The detection.")
    seq = serializers.IntegerField(help_text="The run's event that made it fire.")
    action = serializers.CharField()
    shadow = serializers.CharField(help_text="In shadow: the action it would have taken.")
    count = serializers.IntegerField()
    ts = serializers.CharField()


class IncidentOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    run_id = serializers.CharField(source="run.run_id")
    kind = serializers.CharField()
    signature = serializers.CharField(help_text="With kind, the problem of the run this incident is.")
    tool = serializers.CharField()
    agent = serializers.CharField()
    backend = serializers.CharField()
    model = serializers.CharField()
    task_type = serializers.CharField()
    action = serializers.CharField(help_text="The strongest action so far (observe: a kind in shadow).")
    shadow = serializers.CharField()
    steps = StepSerializer(many=True, help_text="Its detections in event order (the first 50).")
    alerts = serializers.IntegerField()
    hint = serializers.CharField()
    first_seen = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()
    status = serializers.ChoiceField(choices=Incident.Status.values)
    verdict = serializers.CharField(help_text='"", true_loop or false_alarm')
    verdict_note = serializers.CharField()
    verdict_at = serializers.DateTimeField(allow_null=True)
    guard = serializers.SerializerMethodField(help_text="Whether the run uses the guard (a check was made).")

    def get_guard(self, incident) -> bool:
        return incident.run.guard_checked_at is not None


class IncidentListApi(APIView):
    """Incidents of the key's tenant in the order they began (by id), those after `after`: poll with
    the last id you saw. When there are more, `Link: <…&after=…>; rel="next"` is the next page. An
    incident that escalates keeps its id: its new steps are seen by reading it again (or by a
    notification rule's webhook)."""

    permission_classes = [HasReadScope]

    @extend_schema(
        operation_id="incidents_list",
        parameters=[
            OpenApiParameter("after", int, required=False, description="incidents with a greater id"),
            OpenApiParameter("status", str, required=False, enum=Incident.Status.values),
            OpenApiParameter("kind", str, required=False, enum=list(INCIDENT_KINDS)),
            OpenApiParameter("backend", str, required=False),
            OpenApiParameter(
                "limit", int, required=False, description=f"incidents per page, 1 to {MAX_PAGE}"
            ),
            OpenApiParameter(
                "Link",
                str,
                location=OpenApiParameter.HEADER,
                response=[200],
                description='`</api/v1/incidents?…&after=…>; rel="next"` when there are more',
            ),
        ],
        responses={200: IncidentOutputSerializer(many=True), 400: ErrorSerializer, 401: ErrorSerializer},
    )
    def get(self, request):
        after = _int_param(request, "after", 0, minimum=0, maximum=MAX_ID)
        limit = _int_param(request, "limit", 100, minimum=1, maximum=MAX_PAGE)
        query = Incident.objects.filter(tenant=request.user.tenant, pk__gt=after)
        status = request.query_params.get("status")
        if status is not None:
            if status not in Incident.Status.values:
                raise ApiError(
                    400,
                    "invalid_parameter",
                    f"status: must be one of {', '.join(Incident.Status.values)}",
                    "status",
                )
            query = query.filter(status=status)
        kind = request.query_params.get("kind")
        if kind is not None:
            if kind not in INCIDENT_KINDS:
                raise ApiError(
                    400, "invalid_parameter", "kind: not a detection kind (see docs/detection.md)", "kind"
                )
            query = query.filter(kind=kind)
        backend = request.query_params.get("backend")
        if backend is not None:
            if len(backend) > 100 or "\x00" in backend:
                raise ApiError(
                    400,
                    "invalid_parameter",
                    "backend: at most 100 characters, without U+0000 (NUL)",
                    "backend",
                )
            query = query.filter(backend=backend)
        rows = list(query.select_related("run").order_by("pk")[: limit + 1])
        response = Response(IncidentOutputSerializer(rows[:limit], many=True).data)
        if len(rows) > limit:
            params = {k: v for k, v in request.query_params.items() if k != "after"}
            params["after"] = str(rows[limit - 1].pk)
            response["Link"] = f'<{request.path}?{urlencode(params)}>; rel="next"'
        return response


class DetectionOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    seq = serializers.IntegerField(help_text="The run's event that made it fire.")
    ts = serializers.DateTimeField()
    kind = serializers.CharField()
    action = serializers.CharField()
    signature = serializers.CharField()
    tool = serializers.CharField()
    count = serializers.IntegerField()
    at_call = serializers.IntegerField()
    at_round = serializers.IntegerField()
    hint = serializers.CharField()
    evidence = serializers.JSONField()
    feedback = serializers.CharField(help_text="The verdict of its incident, or of this alert.")
    incident = serializers.IntegerField(
        allow_null=True, help_text="Its incident's id (interventions and shadow)."
    )
    reached = serializers.ChoiceField(
        choices=["guard", "traces", "none"],
        help_text=(
            "guard: a guard check answered the agent with it; traces: only recorded from traces; "
            "none: an observation (or a kind in shadow), never meant to reach the agent"
        ),
    )


class RunDetectionsApi(APIView):
    """Every detection of a run in event order, after `after` (a seq), with its incident and whether
    it reached the agent through the guard. 404 a run not known to the key's tenant."""

    permission_classes = [HasReadScope]

    @extend_schema(
        operation_id="runs_detections",
        parameters=[
            OpenApiParameter("after", int, required=False, description="detections of later events (a seq)"),
            OpenApiParameter("limit", int, required=False, description=f"1 to {MAX_PAGE}"),
        ],
        responses={
            200: DetectionOutputSerializer(many=True),
            400: ErrorSerializer,
            401: ErrorSerializer,
            404: ErrorSerializer,
        },
    )
    def get(self, request, run_id: str):
        run = run_get(tenant=request.user.tenant, run_id=run_id)
        if run is None:
            raise ApiError(404, "not_found", f"run_id: no run {run_id!r} for this API key's tenant", "run_id")
        after = _int_param(request, "after", 0, minimum=0, maximum=2**31 - 1)
        limit = _int_param(request, "limit", MAX_PAGE, minimum=1, maximum=MAX_PAGE)
        rows = list(Detection.objects.filter(run=run, seq__gt=after).order_by("seq", "pk")[:limit])
        incidents = dict(
            ((kind, signature), pk)
            for pk, kind, signature in Incident.objects.filter(run=run).values_list("pk", "kind", "signature")
        )
        delivered = delivered_keys(run=run)
        out = []
        for d in rows:
            shadow = isinstance(d.evidence, dict) and "shadow" in d.evidence
            if d.action == Detection.Action.OBSERVE:
                reached = "none"
            else:
                reached = "guard" if (d.kind, d.signature, d.action) in delivered else "traces"
            out.append(
                {
                    "id": d.pk,
                    "seq": d.seq,
                    "ts": d.ts,
                    "kind": d.kind,
                    "action": d.action,
                    "signature": d.signature,
                    "tool": d.tool,
                    "count": d.count,
                    "at_call": d.at_call,
                    "at_round": d.at_round,
                    "hint": d.hint,
                    "evidence": d.evidence,
                    "feedback": d.feedback,
                    "incident": incidents.get((d.kind, d.signature))
                    if d.action != Detection.Action.OBSERVE or shadow
                    else None,
                    "reached": reached,
                }
            )
        return Response(DetectionOutputSerializer(out, many=True).data)
