"""The idempotency ledger: claim, complete, resolve, reconcile (services: they own transactions).

An operation moves only along ALLOWED; every move appends an OperationTransition. A claim is
atomic: of two callers racing for a new key exactly one gets `execute` (INSERT ... ON CONFLICT
DO NOTHING, then SELECT ... FOR UPDATE of the row that won).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from ingest import metrics
from ingest.bulk import rows_update
from ingest.detection.config import NON_RETRYABLE, RETRYABLE
from ingest.detection.normalize import canonical
from ingest.models import Operation, OperationTransition, Reconciler, Tenant

logger = logging.getLogger(__name__)
S = Operation.Status
Actor = OperationTransition.Actor

ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.RUNNING, S.UNKNOWN},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.RETRYABLE_FAILED, S.UNKNOWN},
    S.RETRYABLE_FAILED: {S.RUNNING},
    S.UNKNOWN: {S.SUCCEEDED, S.RETRYABLE_FAILED, S.FAILED, S.COMPENSATED},
    S.SUCCEEDED: {S.COMPENSATED},
    S.FAILED: set(),
    S.COMPENSATED: set(),
}
DEFAULT_LEASE_S = 60
MAX_LEASE_S = 3600
RECONCILE_BACKOFF_S = (15, 30, 60, 120, 300, 600, 1200, 1800)  # then every 30 min, each ± jitter


class TransitionRefused(Exception):
    def __init__(self, operation: Operation, to: str) -> None:
        super().__init__(f"{operation.operation_key}: {operation.status} -> {to} is not allowed")
        self.operation = operation
        self.to = to


def fingerprint(args: dict[str, Any]) -> str:
    """sha256 of the canonical arguments (keys sorted, noise such as request ids dropped)."""
    return hashlib.sha256(orjson.dumps(canonical(args), option=orjson.OPT_SORT_KEYS)).hexdigest()


def operation_key_for(*, operation_key: str | None, run_id: str | None, step_id: str | None) -> str | None:
    """The caller's business key, else sha256(run_id:step_id); never a timestamp or a fresh uuid."""
    if operation_key:
        return operation_key
    if run_id and step_id:
        return hashlib.sha256(f"{run_id}:{step_id}".encode()).hexdigest()
    return None


def _move(
    op: Operation,
    to: str,
    *,
    actor: str,
    actor_id: str = "",
    note: str = "",
    evidence: dict | None = None,
    into: list[OperationTransition] | None = None,
) -> None:
    """Change the status in memory and record the transition; the caller saves the operation.

    into: collect the transition there unsaved (the caller stores it, with others, in one INSERT).
    """
    if to not in ALLOWED[op.status]:
        raise TransitionRefused(op, to)
    transition = OperationTransition(
        operation=op,
        from_status=op.status,
        to_status=to,
        actor=actor,
        actor_id=actor_id,
        note=note,
        evidence=evidence or {},
    )
    if into is None:
        transition.save(force_insert=True)
    else:
        into.append(transition)
    if to == S.UNKNOWN:
        # A new period of not knowing: reconciliation starts over (its own attempts and backoff).
        op.unknown_since = timezone.now()
        op.next_reconcile_at = timezone.now()
        op.reconcile_attempts = 0
        metrics.unknown_outcome(op)
    elif op.status == S.UNKNOWN and op.unknown_since:
        metrics.unknown_reconciled(op, (timezone.now() - op.unknown_since).total_seconds())
    op.status = to


@dataclass
class ClaimAnswer:
    decision: str  # execute | reuse | failed | wait | reconcile | compensated | conflict
    operation: Operation
    http_status: int = 200
    retry_after: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def operation_claim(
    *,
    tenant: Tenant,
    key: str,
    tool: str,
    args: dict[str, Any],
    worker_id: str,
    lease_s: float,
    run_id: str = "",
    step_id: str = "",
) -> ClaimAnswer:
    """Claim `key` to execute it, or learn what became of it."""
    lease_s = min(max(lease_s, 1.0), MAX_LEASE_S)
    fp = fingerprint(args)
    now = timezone.now()
    expires = now + timedelta(seconds=lease_s)
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        # The common case, a new key, in one statement and one round trip (autocommit).
        op = _insert_claimed(tenant, key, tool, args, fp, worker_id, expires, step_id, now)
        if op is not None:
            return ClaimAnswer("execute", op)
    with transaction.atomic():
        inserted = _insert(tenant, key, tool, args, fp, worker_id, expires, step_id)
        op = Operation.objects.select_for_update().get(tenant=tenant, operation_key=key)
        if inserted:
            OperationTransition.objects.create(
                operation=op,
                from_status="",
                to_status=S.RUNNING,
                actor=Actor.WORKER,
                actor_id=worker_id,
                note="claimed",
            )
            return ClaimAnswer("execute", op)
        if op.fingerprint != fp:
            metrics.payload_conflict(op)
            return ClaimAnswer(
                "conflict", op, 422, extra={"stored_fingerprint": op.fingerprint, "fingerprint": fp}
            )
        if op.status in (S.PENDING, S.RETRYABLE_FAILED):
            _move(op, S.RUNNING, actor=Actor.WORKER, actor_id=worker_id, note="claimed again")
            op.lease_owner, op.lease_expires_at, op.attempts = (
                worker_id,
                now + timedelta(seconds=lease_s),
                op.attempts + 1,
            )
            op.save()
            return ClaimAnswer("execute", op)
        if not (op.status == S.RUNNING and op.lease_owner == worker_id):
            metrics.dedupe_hit(op)
        if op.status == S.SUCCEEDED:
            return ClaimAnswer("reuse", op)
        if op.status == S.FAILED:
            return ClaimAnswer("failed", op)
        if op.status == S.RUNNING:
            if op.lease_expires_at and op.lease_expires_at > now and op.lease_owner == worker_id:
                # The holder asks again: its first answer was lost on the way (it cannot have
                # executed without it). The same lease, not a wait on itself until it expires.
                return ClaimAnswer("execute", op)
            if op.lease_expires_at and op.lease_expires_at > now:
                metrics.lease_contention(op)
                return ClaimAnswer(
                    "wait", op, 409, retry_after=round((op.lease_expires_at - now).total_seconds(), 3)
                )
            _lease_expired(op)
            op.save()
        if op.status == S.COMPENSATED:
            return ClaimAnswer("compensated", op, 409)
        return ClaimAnswer("reconcile", op, 409)


def _new_row(
    tenant: Tenant, key: str, tool: str, args: dict, fp: str, owner: str, expires: datetime, step_id: str
) -> dict[str, Any]:
    now = timezone.now()
    return {
        "tenant_id": tenant.pk,
        "operation_key": key,
        "tool": tool,
        "fingerprint": fp,
        "args": orjson.dumps(args).decode(),
        "status": S.RUNNING,
        "lease_owner": owner,
        "lease_expires_at": expires,
        "attempts": 1,
        "external_request_id": "",
        "result_digest": "",
        "error_class": "",
        "source": "api",
        "call_id": "",
        "step_id": step_id,
        "executions": 0,
        "needs_person": False,
        "reconcile_attempts": 0,
        "created_at": now,
        "updated_at": now,
    }


def _insert(
    tenant: Tenant, key: str, tool: str, args: dict, fp: str, owner: str, expires: datetime, step_id: str
) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING: True when this caller created the operation (and owns it)."""
    table = Operation._meta.db_table
    values = _new_row(tenant, key, tool, args, fp, owner, expires, step_id)
    columns = ", ".join(values)
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    placeholders = ", ".join(f"%s{cast}" if name == "args" else "%s" for name in values)
    params = [
        connection.ops.adapt_datetimefield_value(v) if isinstance(v, datetime) else v for v in values.values()
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) "
            "ON CONFLICT (tenant_id, operation_key) DO NOTHING RETURNING id",
            params,
        )
        return cursor.fetchone() is not None


_TRANSITION_COLUMNS = "operation_id, from_status, to_status, actor, actor_id, note, evidence, at"


def _insert_claimed(
    tenant: Tenant,
    key: str,
    tool: str,
    args: dict,
    fp: str,
    owner: str,
    expires: datetime,
    step_id: str,
    now: datetime,
) -> Operation | None:
    """PostgreSQL: the new operation and its first transition in one statement; None when the key
    exists already (the caller then takes the locked path)."""
    values = _new_row(tenant, key, tool, args, fp, owner, expires, step_id)
    placeholders = ", ".join("%s::jsonb" if name == "args" else "%s" for name in values)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH ins AS (INSERT INTO {Operation._meta.db_table} ({', '.join(values)}) "
            f"VALUES ({placeholders}) ON CONFLICT (tenant_id, operation_key) DO NOTHING RETURNING id), "
            f"tr AS (INSERT INTO {OperationTransition._meta.db_table} ({_TRANSITION_COLUMNS}) "
            "SELECT id, '', %s, %s, %s, 'claimed', '{}'::jsonb, %s FROM ins) "
            "SELECT id FROM ins",
            [*values.values(), S.RUNNING, Actor.WORKER, owner, now],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    fields = {**values, "args": args}
    return Operation(id=row[0], tenant=tenant, **{k: v for k, v in fields.items() if k != "tenant_id"})


def _complete_succeeded(
    tenant: Tenant, key: str, worker_id: str, result_json: str, digest: str, external_request_id: str
) -> Operation | None:
    """PostgreSQL: the lease holder's success in one statement (update + transition); None when the
    operation is not RUNNING under this worker's lease (the caller then takes the locked path)."""
    now = timezone.now()
    returned = (
        "id, operation_key, tool, status, fingerprint, attempts, lease_owner, lease_expires_at, "
        "external_request_id, error_class, needs_person, reconcile_attempts, created_at, updated_at"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH upd AS (UPDATE {Operation._meta.db_table} SET status = %s, result_json = %s, "
            "result_digest = %s, external_request_id = COALESCE(NULLIF(%s, ''), external_request_id), "
            "lease_expires_at = NULL, updated_at = %s "
            "WHERE tenant_id = %s AND operation_key = %s AND status = %s AND lease_owner = %s "
            f"RETURNING {returned}), "
            f"tr AS (INSERT INTO {OperationTransition._meta.db_table} ({_TRANSITION_COLUMNS}) "
            "SELECT id, %s, %s, %s, %s, '', '{}'::jsonb, %s FROM upd) "
            f"SELECT {returned} FROM upd",
            [
                S.SUCCEEDED,
                result_json,
                digest,
                external_request_id,
                now,
                tenant.pk,
                key,
                S.RUNNING,
                worker_id,
                S.RUNNING,
                S.SUCCEEDED,
                Actor.WORKER,
                worker_id,
                now,
            ],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    names = [name.strip() for name in returned.split(",")]
    return Operation(tenant=tenant, **dict(zip(names, row, strict=True)))


def _lease_expired(op: Operation) -> None:
    # The executor may have died after the effect: UNKNOWN, never straight back to PENDING.
    _move(
        op,
        S.UNKNOWN,
        actor=Actor.SYSTEM,
        note=f"lease of {op.lease_owner} expired at {op.lease_expires_at:%Y-%m-%d %H:%M:%S}",
        evidence={"lease_owner": op.lease_owner},
    )


class NotLeaseHolder(Exception):
    pass


def operation_complete(
    *,
    tenant: Tenant,
    key: str,
    worker_id: str,
    outcome: str,
    result: Any = None,
    error_class: str = "",
    external_request_id: str = "",
    no_side_effect: bool = False,
) -> Operation:
    """The lease holder reports the outcome; the result is stored before anyone is answered."""
    if outcome == "succeeded" and connection.vendor == "postgresql" and not connection.in_atomic_block:
        result_json = orjson.dumps(result).decode()
        digest = hashlib.sha256(result_json.encode()).hexdigest()
        op = _complete_succeeded(tenant, key, worker_id, result_json, digest, external_request_id)
        if op is not None:
            return op
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(tenant=tenant, operation_key=key).first()
        if op is None:
            raise Operation.DoesNotExist(key)
        late = op.status == S.UNKNOWN and op.lease_owner == worker_id and op.reconcile_attempts == 0
        if not (op.status == S.RUNNING or late) or op.lease_owner != worker_id:
            raise NotLeaseHolder(
                f"{key}: {op.status}, lease held by {op.lease_owner or 'nobody'}; {worker_id} cannot complete it"
            )
        note = "late completion after the lease expired" if late else ""
        if external_request_id:
            op.external_request_id = external_request_id
        if outcome == "succeeded":
            op.result_json = orjson.dumps(result).decode()
            op.result_digest = hashlib.sha256(op.result_json.encode()).hexdigest()
            _move(op, S.SUCCEEDED, actor=Actor.WORKER, actor_id=worker_id, note=note)
        elif outcome == "timeout":
            if not late:
                _move(
                    op,
                    S.UNKNOWN,
                    actor=Actor.WORKER,
                    actor_id=worker_id,
                    note="timed out: the effect may have happened",
                )
        else:
            op.error_class = error_class or "other"
            op.error = result
            if op.error_class in NON_RETRYABLE:
                _move(op, S.FAILED, actor=Actor.WORKER, actor_id=worker_id, note=note or "definitive error")
            elif op.error_class in RETRYABLE and no_side_effect:
                _move(
                    op,
                    S.RETRYABLE_FAILED,
                    actor=Actor.WORKER,
                    actor_id=worker_id,
                    note="no side effect, may run again",
                )
            elif not late:
                _move(
                    op,
                    S.UNKNOWN,
                    actor=Actor.WORKER,
                    actor_id=worker_id,
                    note=f"{op.error_class} error; effect not ruled out",
                )
        op.lease_expires_at = None
        op.save()
        return op


class AlreadyResolved(Exception):
    """The operation left the state the operator saw: someone (or something) decided first."""

    def __init__(self, operation: Operation, last: OperationTransition | None) -> None:
        self.operation = operation
        self.last = last
        who = (last.actor_id or last.actor) if last else "someone"
        when = f"{last.at:%Y-%m-%d %H:%M:%S} UTC" if last else "an unknown time"
        super().__init__(f"already resolved by {who} at {when}: now {operation.status}")


def _decidable(op: Operation, expected: str) -> None:
    """Before an operator's decision: an expired lease becomes UNKNOWN first (the ledger's rule), and
    a decision taken on a state that has changed since it was shown is refused, not applied twice."""
    if op.status == S.RUNNING and op.lease_expires_at and op.lease_expires_at < timezone.now():
        _lease_expired(op)
        if expected == S.RUNNING:
            expected = S.UNKNOWN
    if expected and op.status != expected:
        raise AlreadyResolved(op, op.history.order_by("-pk").first())
    if op.status == S.RUNNING:
        # A live lease: the worker may still report; nobody decides over its head.
        raise TransitionRefused(op, "a decision while the lease is live")


def operation_resolve(
    *,
    operation: Operation,
    to: str,
    user: str,
    note: str,
    external_reference: str = "",
    expected: str = "",
) -> Operation:
    """An operator's decision: succeeded (with the reference), not executed (retryable), compensated.

    `expected`: the status the operator was shown; when the operation has moved since, AlreadyResolved.
    """
    if not note.strip():
        raise ValueError("note: say why")
    with transaction.atomic():
        op = Operation.objects.select_for_update().get(pk=operation.pk)
        _decidable(op, expected)
        if external_reference:
            op.external_request_id = external_reference
        _move(
            op,
            to,
            actor=Actor.USER,
            actor_id=user,
            note=note,
            evidence={"external_reference": external_reference} if external_reference else {},
        )
        op.needs_person = False
        if to == S.COMPENSATED:
            metrics.compensation(op)
        op.save()
        return op


def operation_reconcile_now(*, operation: Operation, user: str, note: str, expected: str = "") -> Operation:
    """An operator asks the downstream about an UNKNOWN operation now, out of the beat's schedule.

    The request is recorded in the history (UNKNOWN -> UNKNOWN, by the user); the answer moves the
    operation as the beat's reconciliation would. The row stays locked while the downstream is asked
    (the reconciler's own timeout bounds it), so the beat cannot ask about it at the same time.
    """
    if not note.strip():
        raise ValueError("note: say why")
    with transaction.atomic():
        op = Operation.objects.select_for_update().get(pk=operation.pk)
        _decidable(op, expected)
        if op.status != S.UNKNOWN:
            raise TransitionRefused(op, "reconciliation (only an UNKNOWN operation is reconciled)")
        OperationTransition.objects.create(
            operation=op,
            from_status=S.UNKNOWN,
            to_status=S.UNKNOWN,
            actor=Actor.USER,
            actor_id=user,
            note=note,
            evidence={"requested": "reconciliation now"},
        )
        reconciler = Reconciler.objects.filter(tool=op.tool).first()
        now = timezone.now()
        if reconciler is None:
            op.needs_person = True
            op.last_reconcile = {"at": now.isoformat(), "answer": "no reconciler configured for this tool"}
            op.save()
            return op
        op.needs_person = False
        verdict, answer = reconciler_ask(reconciler, op)
        _reconciled(op, reconciler, verdict, answer, now)
        return op


# --- reconciliation (Celery beat) ---------------------------------------------------------------


def leases_expire(*, now: datetime | None = None, batch: int = 200) -> int:
    """RUNNING past its lease -> UNKNOWN."""
    now = now or timezone.now()
    done = 0
    with transaction.atomic():
        for op in Operation.objects.select_for_update(skip_locked=True).filter(
            status=S.RUNNING, lease_expires_at__lt=now
        )[:batch]:
            _lease_expired(op)
            op.save()
            done += 1
    return done


def reconcile_due(*, now: datetime | None = None, batch: int = 50, budget_s: float = 180.0) -> int:
    """Ask the downstream about UNKNOWN operations that are due; returns how many were asked.

    1. Claim one due UNKNOWN row at a time with SELECT ... FOR UPDATE SKIP LOCKED, in a transaction
       of its own: only the operation being asked about is locked, and others reconcile the rest.
    2. Call its tool's reconciler (a timeout per request).
    3. Done -> SUCCEEDED with the answer as evidence; provably not done -> RETRYABLE_FAILED;
       anything else -> stays UNKNOWN, next try after an exponential backoff with jitter, and after
       max_attempts or give_up_after_min the operation needs a person.
    Stops after `batch` operations or `budget_s` seconds, well inside the task's time limit, so that
    a hanging downstream cannot roll back what was already decided.
    """
    started = time.monotonic()
    asked = 0
    reconcilers = {r.tool: r for r in Reconciler.objects.all()}
    for _ in range(batch):
        if time.monotonic() - started > budget_s:
            break
        moment = now or timezone.now()
        with transaction.atomic():
            op = (
                Operation.objects.select_for_update(skip_locked=True)
                .filter(status=S.UNKNOWN, needs_person=False, next_reconcile_at__lte=moment)
                .order_by("next_reconcile_at")
                .first()
            )
            if op is None:
                break
            reconciler = reconcilers.get(op.tool)
            if reconciler is None:
                op.needs_person = True
                op.last_reconcile = {"answer": "no reconciler configured for this tool"}
                op.save(update_fields=["needs_person", "last_reconcile", "updated_at"])
                continue
            asked += 1
            verdict, answer = reconciler_ask(reconciler, op)
            _reconciled(op, reconciler, verdict, answer, moment)
    return asked


def _reconciled(
    op: Operation, reconciler: Reconciler, verdict: str, answer: dict[str, Any], now: datetime
) -> None:
    op.reconcile_attempts += 1
    op.last_reconcile = {"at": now.isoformat(), "verdict": verdict, **answer}
    if verdict == "done":
        _move(
            op, S.SUCCEEDED, actor=Actor.RECONCILER, note="the downstream says it happened", evidence=answer
        )
        if op.result_json is None and "body" in answer:
            # The tool's own answer never came; the downstream's record of the effect is the best result.
            op.result_json = orjson.dumps(answer["body"]).decode()
            op.result_digest = hashlib.sha256(op.result_json.encode()).hexdigest()
    elif verdict == "not_done":
        _move(
            op,
            S.RETRYABLE_FAILED,
            actor=Actor.RECONCILER,
            note="the downstream says it did not happen",
            evidence=answer,
        )
    else:
        delay = RECONCILE_BACKOFF_S[min(op.reconcile_attempts - 1, len(RECONCILE_BACKOFF_S) - 1)]
        op.next_reconcile_at = now + timedelta(seconds=delay * random.uniform(0.5, 1.5))
        age_min = (now - (op.unknown_since or now)).total_seconds() / 60
        if op.reconcile_attempts >= reconciler.max_attempts or age_min >= reconciler.give_up_after_min:
            op.needs_person = True
    op.save()


def reconciler_ask(reconciler: Reconciler, op: Operation) -> tuple[str, dict[str, Any]]:
    """('done' | 'not_done' | 'unknown', what the downstream answered)."""
    if "{external_request_id}" in reconciler.url_template and not op.external_request_id:
        if "{operation_key}" not in reconciler.url_template:
            return "unknown", {"error": "no external_request_id to ask about"}
    url = reconciler.url_template.replace(
        "{operation_key}", urllib.request.quote(op.operation_key, safe="")
    ).replace("{external_request_id}", urllib.request.quote(op.external_request_id, safe=""))
    headers = dict(settings.LOOPWATCH_RECONCILER_HEADERS.get(reconciler.headers_name, {}))
    headers.setdefault("Accept", "application/json")
    request = urllib.request.Request(url, method=reconciler.method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=reconciler.timeout_s) as response:
            status, raw = response.status, response.read(1 << 20)
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and reconciler.not_found_means_not_done:
            return "not_done", {"url": url, "status": 404}
        return "unknown", {"url": url, "status": exc.code}
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        return "unknown", {"url": url, "error": str(exc)[:300]}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "unknown", {"url": url, "status": status, "error": "answer is not JSON"}
    value: Any = body
    for part in reconciler.field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    answer = {"url": url, "status": status, "field": reconciler.field, "value": value, "body": body}
    if value in reconciler.done_values:
        return "done", answer
    if value in reconciler.not_done_values:
        return "not_done", answer
    return "unknown", answer


def operations_purge(*, now: datetime | None = None) -> int:
    """Drop finished operations past their retention; never RUNNING, UNKNOWN or PENDING.

    Nothing younger than the longest retry window (leases and reconciliation backoff) goes either.
    """
    now = now or timezone.now()
    floor = timedelta(seconds=max(MAX_LEASE_S, sum(RECONCILE_BACKOFF_S)))
    ttl_days = settings.LOOPWATCH_LEDGER_TTL_DAYS
    deleted = 0
    for tool_kind, days in ttl_days.items():
        cutoff = now - max(timedelta(days=days), floor)
        qs = Operation.objects.filter(
            status__in=[S.SUCCEEDED, S.FAILED, S.RETRYABLE_FAILED, S.COMPENSATED], updated_at__lt=cutoff
        )
        if tool_kind != "default":
            qs = qs.filter(tool=tool_kind)
        else:
            qs = qs.exclude(tool__in=[k for k in ttl_days if k != "default"])
        deleted += qs.delete()[1].get(Operation._meta.label, 0)
    return deleted


# --- traces feed the ledger ---------------------------------------------------------------------

TRACE_WORKER = "trace"


TRACE_LEASE_S = 900  # a traced write with no result after this long becomes UNKNOWN


def trace_key(call, run) -> str | None:
    """A traced write's operation key: its operation_key, else sha256(run_id:step_id), else none."""
    return operation_key_for(operation_key=call.operation_key, run_id=run.run_id, step_id=call.step_id)


TRACE_STARTED = "started"
TRACE_FINISHED = "finished"


# Every column a traced step may change (op.save() of one operation wrote them all).
_TRACE_FIELDS = [
    *("status", "lease_owner", "lease_expires_at", "attempts", "executions", "call_id"),
    *("external_request_id", "result_json", "result_digest", "error_class", "error"),
    *("unknown_since", "next_reconcile_at", "reconcile_attempts", "updated_at"),
]


def trace_writes_record(*, steps: list[tuple[str, Any, Any]]) -> list[dict[str, Any] | None]:
    """Traced writes' starts and results (TRACE_STARTED / TRACE_FINISHED, run, call), applied in
    this order exactly as they would be applied one at a time, in a few
    statements for all of them (the detection task feeds every traced write of a pass at once):

    1. Create the operations of the keys a start names, from the key's first start, with one
       INSERT ... ON CONFLICT DO NOTHING in key order (a key that exists stays as it is).
    2. Lock every operation the steps name with one SELECT ... FOR UPDATE in pk order: two tasks
       never deadlock, and the API's claims and completions wait as they did for one step.
    3. Apply the steps in order to the locked rows in memory. An operation step 1 created exists
       from its first start on: a result before it finds no operation, as it would have.
    4. Store the transitions with one INSERT and the changed operations with one UPDATE.
    All in one transaction: every step is stored or none. Returns, per step, the evidence of a
    duplicate side effect (a start; see _trace_started) or None.
    """
    answers: list[dict[str, Any] | None] = [None] * len(steps)
    keyed = [(i, kind, run, call, trace_key(call, run)) for i, (kind, run, call) in enumerate(steps)]
    keyed = [step for step in keyed if step[4] is not None]
    if not keyed:
        return answers
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        ops, born = _trace_ops_lock(keyed, now)
        existing = {pair: op for pair, op in ops.items() if pair not in born}
        transitions: list[OperationTransition] = []
        changed: dict[int, Operation] = {}
        for i, kind, run, call, key in keyed:
            pair = (run.tenant_id, key)
            op = existing.get(pair)
            if kind == TRACE_STARTED:
                if op is None:  # the start this call created the operation for
                    op = existing[pair] = ops[pair]
                    transitions.append(
                        OperationTransition(
                            operation=op,
                            from_status="",
                            to_status=S.RUNNING,
                            actor=Actor.TRACE,
                            actor_id=run.run_id,
                            note="seen executing in a trace",
                        )
                    )
                    continue
                answers[i] = _trace_started(op, run, call, key, now, transitions)
            elif op is None or not _trace_finished(op, run, call, transitions):
                continue
            op.updated_at = now
            changed[op.pk] = op
        OperationTransition.objects.bulk_create(transitions)
        rows_update(Operation, list(changed.values()), _TRACE_FIELDS)
    return answers


def _trace_ops_lock(
    keyed: list[tuple[int, str, Any, Any, str]], now: datetime
) -> tuple[dict[tuple[int, str], Operation], set[tuple[int, str]]]:
    """Steps 1 and 2 of trace_writes_record: ({(tenant_id, key): locked operation}, the pairs this
    call created). Again when a key a start names is gone between the INSERT and the lock (purged
    meanwhile): the start then creates it, as it would have."""
    born: set[tuple[int, str]] = set()
    while True:
        firsts: dict[tuple[int, str], tuple[Any, Any]] = {}
        for _, kind, run, call, key in keyed:
            if kind == TRACE_STARTED:
                firsts.setdefault((run.tenant_id, key), (run, call))
        born |= _trace_ops_insert(firsts, now)
        wanted: dict[int, set[str]] = {}
        for _, _, run, _, key in keyed:
            wanted.setdefault(run.tenant_id, set()).add(key)
        which = Q()
        for tenant_id, keys in wanted.items():
            which |= Q(tenant_id=tenant_id, operation_key__in=sorted(keys))
        ops = {
            (op.tenant_id, op.operation_key): op
            for op in Operation.objects.select_for_update().filter(which).order_by("pk")
        }
        if all(pair in ops for pair in firsts):
            return ops, born


def _trace_ops_insert(firsts: dict[tuple[int, str], tuple[Any, Any]], now: datetime) -> set[tuple[int, str]]:
    """INSERT ... ON CONFLICT DO NOTHING of a traced operation per (tenant, key), from its first
    start; returns the pairs inserted."""
    if not firsts:
        return set()
    rows = []
    for (tenant_id, key), (run, call) in sorted(firsts.items()):
        rows.append(
            Operation(
                tenant_id=tenant_id,
                operation_key=key,
                tool=call.tool,
                fingerprint=fingerprint(call.args),
                args=call.args,
                status=S.RUNNING,
                lease_owner=TRACE_WORKER,
                lease_expires_at=now + timedelta(seconds=TRACE_LEASE_S),
                source="trace",
                run_id=run.pk,
                call_id=call.call_id,
                step_id=call.step_id,
                attempts=1,
                executions=1,
            )
        )
    meta = Operation._meta
    fields = [f for f in meta.concrete_fields if f is not meta.auto_field]
    quote = connection.ops.quote_name
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    params = [f.get_db_prep_save(f.pre_save(row, add=True), connection) for row in rows for f in fields]
    tenant, key = (quote(meta.get_field(name).column) for name in ("tenant", "operation_key"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
            f"VALUES {', '.join([one] * len(rows))} ON CONFLICT ({tenant}, {key}) DO NOTHING "
            f"RETURNING {tenant}, {key}",
            params,
        )
        return {tuple(row) for row in cursor.fetchall()}


def _trace_started(
    op: Operation, run, call, key: str, now: datetime, transitions: list[OperationTransition]
) -> dict[str, Any] | None:
    """A `write` tool_call seen in a trace, of an operation that exists already: the evidence of a
    duplicate side effect when the same key was already executed and its effect happened or may
    have (SUCCEEDED, UNKNOWN, RUNNING); None otherwise."""
    previous = op.status
    # An operation claimed through the API and traced too: its first traced call is that same
    # execution. Only a second traced execution is a second effect.
    seen_before = op.executions >= 1
    op.executions += 1
    duplicate = None
    if seen_before and previous in (S.SUCCEEDED, S.UNKNOWN, S.RUNNING):
        duplicate = {
            "operation_key": key,
            "previous_status": previous,
            "executions": op.executions,
            "same_arguments": fingerprint(call.args) == op.fingerprint,
        }
    if previous in (S.PENDING, S.RETRYABLE_FAILED):
        op.attempts += 1
        _move(
            op,
            S.RUNNING,
            actor=Actor.TRACE,
            actor_id=run.run_id,
            note="executed again (trace)",
            into=transitions,
        )
    if op.status == S.RUNNING and op.lease_owner in ("", TRACE_WORKER):
        op.lease_owner, op.lease_expires_at = TRACE_WORKER, now + timedelta(seconds=TRACE_LEASE_S)
    op.call_id = call.call_id
    return duplicate


def _trace_finished(op: Operation, run, call, transitions: list[OperationTransition]) -> bool:
    """The result of a traced write: ok -> SUCCEEDED, timeout -> UNKNOWN, a definitive error ->
    FAILED, a transient one -> RETRYABLE_FAILED (a 503/429 answer: the service refused it), any
    other error -> UNKNOWN (its effect is not ruled out). False when it changes nothing."""
    if op.status != S.RUNNING or op.lease_owner != TRACE_WORKER:
        return False  # claimed through the API meanwhile, or already settled: the API's account wins
    if call.external_request_id:
        op.external_request_id = call.external_request_id
    evidence = {"run_id": run.run_id, "call_id": call.call_id}
    if call.result_status == "ok" and call.error_class not in NON_RETRYABLE:
        op.result_json = orjson.dumps(call.result).decode()
        op.result_digest = hashlib.sha256(op.result_json.encode()).hexdigest()
        _move(op, S.SUCCEEDED, actor=Actor.TRACE, actor_id=run.run_id, evidence=evidence, into=transitions)
    elif call.result_status == "timeout":
        _move(
            op,
            S.UNKNOWN,
            actor=Actor.TRACE,
            actor_id=run.run_id,
            note="timed out: the effect may have happened",
            evidence=evidence,
            into=transitions,
        )
    else:
        op.error_class, op.error = call.error_class or "other", call.result
        if op.error_class in NON_RETRYABLE:
            to = S.FAILED
        elif op.error_class in RETRYABLE:
            to = S.RETRYABLE_FAILED
        else:
            to = S.UNKNOWN
        _move(
            op,
            to,
            actor=Actor.TRACE,
            actor_id=run.run_id,
            note=f"{op.error_class} error",
            evidence=evidence,
            into=transitions,
        )
    op.lease_expires_at = None
    return True
