"""POST /api/v1/runs/{run_id}/check: the guard's decision about a proposed tool call (ingest scope);
POST /api/v1/runs/{run_id}/handoff: a person's answer to a run waiting for one (operate scope)."""

from __future__ import annotations

import time

import orjson
from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.views import APIView

from ingest import metrics
from ingest.api.errors import ApiError, RateLimited
from ingest.api.events import ErrorSerializer, RateLimitedSerializer
from ingest.api.inputs import FlatInput, parse_input
from ingest.auth import HasIngestScope, HasOperateScope
from ingest.bulk import of_tenant
from ingest.guard import (
    CallRefused,
    HandoffRefused,
    ProposedCall,
    RunNotKnown,
    call_check,
    run_handoff_answer,
)
from ingest.incidents import guard_answer_record
from ingest.ledger import DEFAULT_LEASE_S, MAX_LEASE_S
from ingest.models import ApiKey, Run
from ingest.quotas import OverLimit, quota_take
from ingest.schema import TOOL_KINDS, EventError, check_ts, find_nul, validate_event

ID_MAX = 200  # worker_id, attempt_id (the ledger's columns)
LEASE_MIN_S = 1
DECISIONS = (
    *("allow", "reuse", "correct", "handoff", "terminate"),
    *("execute", "wait", "reconcile", "failed", "compensated", "conflict"),
)


class CheckInput(serializers.Serializer):
    """The call the model proposed (for the OpenAPI document; the view checks the body by hand)."""

    tool = serializers.CharField(max_length=200)
    kind = serializers.ChoiceField(
        choices=TOOL_KINDS, required=False, help_text="Default: the tool registry's, else other."
    )
    args = serializers.DictField()
    round = serializers.IntegerField(
        min_value=1, required=False, help_text="Default: the run's current round."
    )
    ts = serializers.DateTimeField(
        required=False, help_text="RFC 3339; when the runtime saw the call (default: now)."
    )
    operation_key = serializers.CharField(max_length=500, required=False)
    step_id = serializers.CharField(max_length=200, required=False)
    worker_id = serializers.CharField(max_length=ID_MAX, required=False, help_text="Required for a write.")
    lease_s = serializers.FloatField(
        min_value=LEASE_MIN_S, max_value=MAX_LEASE_S, required=False, default=DEFAULT_LEASE_S
    )
    attempt_id = serializers.CharField(
        max_length=ID_MAX,
        required=False,
        help_text="A write: the client's id of this attempt (asked again with it, a lost answer's lease comes back).",
    )
    require_run = serializers.BooleanField(
        required=False, default=False, help_text="404 when the run is not known."
    )


# The fields of a check's body, as the OpenAPI document gives them (CheckInput); anything else is a
# mistake worth naming (a typo would go unnoticed). parse_check checks them by hand (the call as the
# tool_call event it will be, ID_MAX, LEASE_MIN_S): tests/ingest/test_guard.py tries both at each edge.
FIELDS = tuple(CheckInput().fields)


class CheckOutput(serializers.Serializer):
    decision = serializers.ChoiceField(choices=DECISIONS)
    run_known = serializers.BooleanField()
    kind = serializers.CharField()
    hint = serializers.CharField(
        help_text="What to tell the model (correct), or why (handoff, terminate, reuse)."
    )
    detections = serializers.ListField(child=serializers.DictField())
    diagnosis = serializers.DictField(
        required=False, help_text="terminate: terminated_by, budget_type, limit, ..."
    )
    handoff = serializers.DictField(required=False, help_text="handoff: what happened and what was tried.")
    reuse = serializers.DictField(required=False, help_text="reuse: result, call_id, seq, at.")
    ledger = serializers.DictField(
        required=False, help_text="A write: the ledger's decision and its details."
    )
    cut_short = serializers.DictField(
        required=False,
        help_text=(
            "Present when the answer does not reflect every event of the run: reason (time_budget: "
            "not processed within LOOPWATCH_GUARD_BUDGET_MS; detection_failed: the run's detection is "
            "quarantined), detail, events_behind."
        ),
    )


def _bad(field: str, reason: str, code: str = "invalid") -> ApiError:
    return ApiError(400, code, f"{field}: {reason}", field=field)


def parse_check(body: bytes, *, run_id: str) -> tuple[ProposedCall, bool]:
    """The proposed call of a request body, or ApiError naming the field and the reason."""
    try:
        data = orjson.loads(body or b"null")
    except orjson.JSONDecodeError as exc:
        raise _bad("body", f"not valid JSON ({exc})", "invalid_json") from None
    if not isinstance(data, dict):
        raise _bad("body", "must be a JSON object with tool and args", "invalid_body")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise _bad(unknown[0], f"is not a field of a check (known: {', '.join(FIELDS)})")
    # The call is checked as the tool_call event it will be, by the same code as ingest.
    event = {k: data[k] for k in ("tool", "kind", "args", "round", "operation_key", "step_id") if k in data}
    event.update(type="tool_call", run_id=run_id, ts="2000-01-01T00:00:00Z", call_id="check")
    event.setdefault("round", 1)
    try:
        validate_event(event)
    except EventError as exc:
        raise _bad(exc.field, exc.reason) from None
    nul = find_nul(data)
    if nul is not None:
        raise _bad(nul, "must not contain the character U+0000 (NUL)")
    ts = None
    if "ts" in data:
        try:
            ts = check_ts(data["ts"])
        except EventError as exc:
            raise _bad(exc.field, exc.reason) from None
    ids = {name: data.get(name, "") for name in ("worker_id", "attempt_id")}
    for name, value in ids.items():
        if not isinstance(value, str) or len(value) > ID_MAX:
            raise _bad(name, f"must be a string of at most {ID_MAX} characters")
    worker_id, attempt_id = ids["worker_id"], ids["attempt_id"]
    lease_s = data.get("lease_s", DEFAULT_LEASE_S)
    if (
        isinstance(lease_s, bool)
        or not isinstance(lease_s, int | float)
        or not LEASE_MIN_S <= lease_s <= MAX_LEASE_S
    ):
        raise _bad("lease_s", f"must be a number of seconds from {LEASE_MIN_S} to {MAX_LEASE_S}")
    require_run = data.get("require_run", False)
    if not isinstance(require_run, bool):
        raise _bad("require_run", "must be true or false")
    call = ProposedCall(
        tool=data["tool"],
        args=data["args"],
        kind=data.get("kind", ""),
        round=data.get("round"),
        ts=ts,
        operation_key=data.get("operation_key", ""),
        step_id=data.get("step_id", ""),
        worker_id=worker_id,
        lease_s=float(lease_s),
        attempt_id=attempt_id,
    )
    return call, require_run


class RunCheckApi(APIView):
    """Ask before a tool call runs: allow, reuse, correct, handoff, terminate, or for a write the
    ledger's decision (execute, reuse, wait, reconcile, failed, compensated, conflict).

    Every decision is a 200. 400 a body that is not a valid call (naming the field), 401/403 a
    missing, unknown or under-scoped key (a write also needs the `ledger` scope: its check claims
    the operation), 404 a run not known with require_run, 413 a body over LOOPWATCH_MAX_EVENT_BYTES,
    429 over the key's or its tenant's checks_per_s (Retry-After; the body names the limit).
    """

    permission_classes = [HasIngestScope]
    parser_classes: list = []

    @extend_schema(
        operation_id="runs_check",
        request=CheckInput,
        responses={
            200: CheckOutput,
            400: ErrorSerializer,
            401: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            413: ErrorSerializer,
            429: RateLimitedSerializer,
        },
    )
    def post(self, request, run_id: str):
        try:
            quota_take(key=request.auth, what="checks")
        except OverLimit as over:
            raise RateLimited(over) from None
        if not 0 < len(run_id) <= 200:
            raise _bad("run_id", "must be 1 to 200 characters")
        limit = settings.LOOPWATCH_MAX_EVENT_BYTES
        length = request.META.get("CONTENT_LENGTH") or "0"
        if not length.isdigit():
            raise _bad("Content-Length", "must be a number", "bad_request")
        if int(length) > limit or len(request.body) > limit:
            raise ApiError(
                413,
                "body_too_large",
                f"body: over the limit of {limit} bytes for one call (LOOPWATCH_MAX_EVENT_BYTES)",
                field="body",
            )
        call, require_run = parse_check(request.body, run_id=run_id)
        key: ApiKey = request.auth
        started = time.perf_counter()
        try:
            answer = call_check(
                tenant=request.user.tenant,
                run_id=run_id,
                call=call,
                require_run=require_run,
                may_claim=ApiKey.Scope.LEDGER in key.scopes,
                budget_s=settings.LOOPWATCH_GUARD_BUDGET_MS / 1000,
            )
        except RunNotKnown:
            raise ApiError(
                404, "not_found", f"run_id: no run {run_id!r} for this API key's tenant", "run_id"
            ) from None
        except CallRefused as exc:
            code = "permission_denied" if exc.status == 403 else "invalid"
            raise ApiError(exc.status, code, str(exc), field=exc.field) from None
        body = answer.as_dict()
        # What reached the agent: this run uses the guard, and the intervention this answer carries
        # (shown on the incident and the run's page beside what was only recorded from traces).
        guard_answer_record(
            tenant_id=request.user.tenant.pk,
            run_id=run_id,
            answer=body,
            now=timezone.now(),
            run_pk=answer.run_pk,
            guard_checked=answer.guard_checked,
        )
        metrics.guard_answered(decision=answer.decision, seconds=time.perf_counter() - started)
        return HttpResponse(orjson.dumps(body), content_type="application/json")


class HandoffAnswerInput(FlatInput):
    answer = serializers.ChoiceField(
        choices=["resume", "stop"],
        help_text="resume: checks decide again (the engine's counts carry on); stop: the run is abandoned.",
    )
    note = serializers.CharField(max_length=2000, help_text="What was done or decided; kept with the answer.")
    by = serializers.CharField(
        max_length=200, help_text="Who answered (a person, as the integration knows them)."
    )
    handoff_at = serializers.CharField(
        max_length=64,
        required=False,
        help_text="The handoff's `at` the person was shown: a newer handoff of the run is not answered.",
    )


class RunHandoffAnswerApi(APIView):
    """Answer a run waiting for a person (the guard's handoff): resume it or stop it, as the run's
    page does. 200 with the run's status and handoff; 409 when nothing changed (answered already,
    asked again since, or not waiting), saying why; 404 a run not known to the key's tenant."""

    permission_classes = [HasOperateScope]
    parser_classes: list = []

    @extend_schema(
        operation_id="runs_handoff_answer",
        request=HandoffAnswerInput,
        responses={
            200: dict,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
    )
    def post(self, request, run_id: str):
        data = parse_input(HandoffAnswerInput, request)
        run = Run.objects.filter(of_tenant(request.user.tenant), run_id=run_id).first()
        if run is None:
            raise ApiError(404, "not_found", f"run_id: no run {run_id!r} for this API key's tenant", "run_id")
        try:
            run = run_handoff_answer(
                run=run,
                resume=data["answer"] == "resume",
                by=data["by"].strip(),
                note=data["note"].strip(),
                shown_at=data.get("handoff_at"),
            )
        except HandoffRefused as refused:
            raise ApiError(409, refused.reason, f"run_id: {run_id}: {refused.describe()}", "run_id") from None
        body = {"run_id": run.run_id, "status": run.status, "handoff": run.handoff}
        return HttpResponse(orjson.dumps(body), content_type="application/json")
