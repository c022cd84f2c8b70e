"""The ledger API for agent runtimes (ledger scope): claim, renew, complete, release, look up
(docs/ledger.md)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.views import APIView

from ingest import metrics
from ingest.api.errors import ApiError
from ingest.api.events import ErrorSerializer as ErrorBody
from ingest.api.inputs import FlatInput, parse_input
from ingest.auth import HasLedgerScope
from ingest.bulk import of_tenant
from ingest.ledger import (
    DEFAULT_LEASE_S,
    MAX_LEASE_S,
    NotLeaseHolder,
    TransitionRefused,
    operation_claim,
    operation_complete,
    operation_key_for,
    operation_release,
    operation_renew,
)
from ingest.models import Operation


def _json(payload: dict[str, Any], status: int = 200, *, raw_result: str | None = None) -> HttpResponse:
    body = orjson.dumps(payload)
    if raw_result is not None:
        # The stored result goes out as the very bytes it was stored as, for every repeat.
        body = body[:-1] + b',"result":' + raw_result.encode() + b"}"
    return HttpResponse(body, status=status, content_type="application/json")


def operation_state(op: Operation, *, history: bool = False) -> dict[str, Any]:
    state = {
        "operation_key": op.operation_key,
        "tool": op.tool,
        "status": op.status,
        "fingerprint": op.fingerprint,
        "attempts": op.attempts,
        "attempt_id": op.attempt_id,
        "lease_owner": op.lease_owner,
        "lease_expires_at": op.lease_expires_at.isoformat() if op.lease_expires_at else None,
        "external_request_id": op.external_request_id,
        "error_class": op.error_class,
        "needs_person": op.needs_person,
        "reconcile_attempts": op.reconcile_attempts,
        "created_at": op.created_at.isoformat(),
        "updated_at": op.updated_at.isoformat(),
    }
    if history:
        state["history"] = [
            {
                "from": t.from_status,
                "to": t.to_status,
                "actor": t.actor,
                "actor_id": t.actor_id,
                "note": t.note,
                "operator_reference": t.operator_reference,
                "evidence": t.evidence,
                "at": t.at.isoformat(),
            }
            for t in op.history.all()
        ]
    return state


class ClaimInput(FlatInput):
    operation_key = serializers.CharField(required=False, max_length=500, allow_blank=False)
    run_id = serializers.CharField(required=False, max_length=200)
    step_id = serializers.CharField(required=False, max_length=200)
    tool = serializers.CharField(max_length=200)
    args = serializers.DictField()
    worker_id = serializers.CharField(max_length=200)
    lease_s = serializers.FloatField(
        required=False, default=DEFAULT_LEASE_S, min_value=1, max_value=MAX_LEASE_S
    )
    attempt_id = serializers.CharField(
        required=False,
        max_length=200,
        default="",
        help_text="The client's id of this attempt (new per attempt): asked again with it after a lost "
        "answer, the same lease comes back; without it, a second claim of a live lease waits.",
    )


ATTEMPT_HELP = "The fencing token: lease.attempt of the claim. Left out: checked by worker_id alone."


class CompleteInput(FlatInput):
    worker_id = serializers.CharField(max_length=200)
    attempt = serializers.IntegerField(required=False, min_value=0, allow_null=True, help_text=ATTEMPT_HELP)
    outcome = serializers.ChoiceField(choices=["succeeded", "failed", "timeout"])
    result = serializers.JSONField(required=False, allow_null=True)
    error_class = serializers.ChoiceField(
        required=False,
        choices=[
            "transient",
            "rate_limited",
            "invalid_argument",
            "permission",
            "not_found",
            "parse_error",
            "empty_result",
            "other",
        ],
    )
    external_request_id = serializers.CharField(required=False, max_length=500, allow_blank=True)
    no_side_effect = serializers.BooleanField(required=False, default=False)


class RenewInput(FlatInput):
    worker_id = serializers.CharField(max_length=200)
    attempt = serializers.IntegerField(
        min_value=0, help_text="The fencing token: lease.attempt of the claim."
    )
    lease_s = serializers.FloatField(
        required=False, default=DEFAULT_LEASE_S, min_value=1, max_value=MAX_LEASE_S
    )


class ReleaseInput(FlatInput):
    worker_id = serializers.CharField(max_length=200)
    attempt_id = serializers.CharField(required=False, max_length=200, default="")
    attempt = serializers.IntegerField(required=False, min_value=0, allow_null=True, default=None)


def _not_holder(exc: NotLeaseHolder, field: str) -> HttpResponse:
    """409 with the API's error shape, plus where the operation stands (status, current_attempt)."""
    return _json(
        {
            "error": exc.code,
            "detail": f"{field}: {exc}",
            "field": field,
            "status": exc.status,
            "current_attempt": exc.current_attempt,
        },
        409,
    )


class OperationClaimApi(APIView):
    """Claim an operation to execute it (a new attempt, with its fencing token), or learn what
    became of it.

    200 execute (lease: owner, expires_at, attempt = the fencing token, attempt_id) / reuse (with
    the first result) / failed; 409 wait (another attempt's live lease, whoever sends this claim) /
    reconcile (UNKNOWN: never executed again automatically); 422 the key with other arguments.
    """

    permission_classes = [HasLedgerScope]
    parser_classes: list = []

    @extend_schema(
        operation_id="operations_claim",
        request=ClaimInput,
        responses={200: dict, 409: dict, 422: dict, 400: ErrorBody},
    )
    def post(self, request):
        started = time.perf_counter()
        data = parse_input(ClaimInput, request)
        key = operation_key_for(
            operation_key=data.get("operation_key"), run_id=data.get("run_id"), step_id=data.get("step_id")
        )
        if key is None:
            raise ApiError(
                400, "invalid", "operation_key: give it, or run_id and step_id to derive it", "operation_key"
            )
        answer = operation_claim(
            tenant=request.user.tenant,
            key=key,
            tool=data["tool"],
            args=data["args"],
            worker_id=data["worker_id"],
            lease_s=data["lease_s"],
            step_id=data.get("step_id", ""),
            attempt_id=data["attempt_id"],
        )
        payload = answer.as_dict(key=key)  # as the guard's check gives it (its `ledger`)
        if answer.decision == "reuse":
            response = _json(payload)  # the stored result as the very bytes it was stored as
            metrics.result_reused(answer.operation, time.perf_counter() - started)
            return response
        if answer.decision == "conflict":  # the API's error shape around the same detail
            payload = {
                "error": "payload_conflict",
                "detail": payload["detail"],
                "field": "args",
                **answer.extra,
            }
        response = _json(payload, answer.http_status)
        if answer.decision == "wait":
            response["Retry-After"] = str(max(1, round(answer.retry_after)))
        return response


class OperationCompleteApi(APIView):
    """The holder of the latest attempt reports the outcome: succeeded, failed, or timeout
    (-> UNKNOWN). 409 not_lease_holder / stale_attempt (recorded in the history) with the
    operation's status and current_attempt."""

    permission_classes = [HasLedgerScope]
    parser_classes: list = []

    @extend_schema(
        operation_id="operations_complete",
        request=CompleteInput,
        responses={200: dict, 404: ErrorBody, 409: ErrorBody},
    )
    def post(self, request, key: str):
        data = parse_input(CompleteInput, request)
        if data["outcome"] == "failed" and not data.get("error_class"):
            raise ApiError(400, "invalid", "error_class: required when the outcome is failed", "error_class")
        try:
            op = operation_complete(
                tenant=request.user.tenant,
                key=key,
                worker_id=data["worker_id"],
                outcome=data["outcome"],
                result=data.get("result"),
                error_class=data.get("error_class", ""),
                external_request_id=data.get("external_request_id", ""),
                no_side_effect=data["no_side_effect"],
                attempt=data.get("attempt"),
            )
        except Operation.DoesNotExist:
            raise ApiError(
                404, "not_found", f"key: no operation {key!r} for this API key's tenant", "key"
            ) from None
        except NotLeaseHolder as exc:
            return _not_holder(exc, "attempt" if exc.code == "stale_attempt" else "worker_id")
        except TransitionRefused as exc:
            raise ApiError(409, "transition_refused", str(exc), "outcome") from None
        return _json(operation_state(op))


class OperationRenewApi(APIView):
    """The holder of an attempt is still at work: its lease runs lease_s more seconds from now.
    A holder whose lease ran out (UNKNOWN since, nobody decided) is RUNNING again. 409
    stale_attempt / not_lease_holder (recorded) when the attempt no longer holds the operation."""

    permission_classes = [HasLedgerScope]
    parser_classes: list = []

    @extend_schema(
        operation_id="operations_renew",
        request=RenewInput,
        responses={200: dict, 400: ErrorBody, 404: ErrorBody, 409: dict},
    )
    def post(self, request, key: str):
        data = parse_input(RenewInput, request)
        try:
            lease = operation_renew(
                tenant=request.user.tenant,
                key=key,
                worker_id=data["worker_id"],
                attempt=data["attempt"],
                lease_s=data["lease_s"],
            )
        except Operation.DoesNotExist:
            raise ApiError(
                404, "not_found", f"key: no operation {key!r} for this API key's tenant", "key"
            ) from None
        except NotLeaseHolder as exc:
            return _not_holder(exc, "attempt" if exc.code == "stale_attempt" else "worker_id")
        return _json(
            {
                "operation_key": key,
                "status": lease.status,
                "lease": {
                    "owner": lease.owner,
                    "expires_at": lease.expires_at.isoformat(),
                    "attempt": lease.attempt,
                },
            }
        )


class OperationReleaseApi(APIView):
    """An attempt gives its claim back without having run the tool (its claim's answer came too
    late, say): RETRYABLE_FAILED, it may run again; also once its lease ran out. By attempt_id
    (all a client whose claim got no answer knows) or attempt. 409 when it is not that attempt's."""

    permission_classes = [HasLedgerScope]
    parser_classes: list = []

    @extend_schema(
        operation_id="operations_release",
        request=ReleaseInput,
        responses={200: dict, 400: ErrorBody, 404: ErrorBody, 409: dict},
    )
    def post(self, request, key: str):
        data = parse_input(ReleaseInput, request)
        if not data["attempt_id"] and data["attempt"] is None:
            raise ApiError(
                400,
                "invalid",
                "attempt_id: give it (or attempt): which attempt gives its claim back",
                "attempt_id",
            )
        try:
            op = operation_release(
                tenant=request.user.tenant,
                key=key,
                worker_id=data["worker_id"],
                attempt_id=data["attempt_id"],
                attempt=data["attempt"],
            )
        except Operation.DoesNotExist:
            raise ApiError(
                404, "not_found", f"key: no operation {key!r} for this API key's tenant", "key"
            ) from None
        except NotLeaseHolder as exc:
            return _not_holder(exc, "attempt_id")
        return _json(operation_state(op))


class OperationDetailApi(APIView):
    permission_classes = [HasLedgerScope]

    @extend_schema(operation_id="operations_retrieve", responses={200: dict, 404: ErrorBody})
    def get(self, request, key: str):
        op = Operation.objects.filter(of_tenant(request.user.tenant), operation_key=key).first()
        if op is None:
            raise ApiError(404, "not_found", f"key: no operation {key!r} for this API key's tenant", "key")
        state = operation_state(op, history=True)
        return (
            _json(state, raw_result=op.result_json)
            if op.result_json is not None
            else _json({**state, "result": None})
        )
