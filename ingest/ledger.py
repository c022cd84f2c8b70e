"""The idempotency ledger: claim, renew, complete, release, resolve, reconcile (services: they own
transactions). docs/ledger.md describes the protocol.

An operation moves only along ALLOWED; every move appends an OperationTransition. A claim is
atomic: of two callers racing for a new key exactly one gets `execute` (INSERT ... ON CONFLICT
DO NOTHING, then SELECT ... FOR UPDATE of the row that won).

An attempt, not a process, owns a claim: each `execute` is a new attempt, numbered in
`Operation.attempts` (its fencing token), with the client's `attempt_id`. A second claim of a
RUNNING key under a live lease waits, whoever sends it; only the same attempt_id asking again (its
answer was lost) gets its lease back. Renewals and completions carry the token: a stale one is
refused and recorded in the history.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import random
import time
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
from ingest.downstream import Refused, downstream_fetch, kept, target_for
from ingest.models import Operation, OperationTransition, Reconciler, Tenant

logger = logging.getLogger(__name__)
S = Operation.Status
Actor = OperationTransition.Actor

ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.RUNNING, S.UNKNOWN},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.RETRYABLE_FAILED, S.UNKNOWN},
    # -> UNKNOWN from RETRYABLE_FAILED, SUCCEEDED or FAILED: only an unverified account (a trace
    # sent with a key without the ledger scope) when a claim asks for a verdict.
    S.RETRYABLE_FAILED: {S.RUNNING, S.UNKNOWN},
    # -> RUNNING: only the holder of the attempt whose lease ran out, renewing it (still at work).
    S.UNKNOWN: {S.SUCCEEDED, S.RETRYABLE_FAILED, S.FAILED, S.COMPENSATED, S.RUNNING},
    S.SUCCEEDED: {S.COMPENSATED, S.UNKNOWN},
    S.FAILED: {S.UNKNOWN},
    S.COMPENSATED: set(),
}
# What a person may decide (operation_resolve): the other moves are the ledger's own.
OPERATOR_TARGETS = frozenset({S.SUCCEEDED, S.RETRYABLE_FAILED, S.FAILED, S.COMPENSATED})
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
    operator_reference: str = "",
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
        operator_reference=operator_reference,
        evidence=evidence or {},
    )
    if into is None:
        transition.save(force_insert=True)
    else:
        into.append(transition)
    # Any move ends the question a person was asked (an UNKNOWN settled, or a new one for the
    # reconciler first), and a verdict from anyone but a trace is not an unverified trace's.
    op.needs_person = False
    op.unverified = False
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
    attempt_id: str = "",
) -> ClaimAnswer:
    """Claim `key` to execute it (a new attempt), or learn what became of it.

    attempt_id: the client's id of this attempt. The same attempt_id asking again while its lease
    is live gets that lease back (its first answer was lost: it cannot have executed without it);
    any other claim of a RUNNING key under a live lease waits, the same worker_id included.
    """
    lease_s = min(max(lease_s, 1.0), MAX_LEASE_S)
    fp = fingerprint(args)
    now = timezone.now()
    expires = now + timedelta(seconds=lease_s)
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        # The common case, a new key, in one statement and one round trip (autocommit).
        op = _insert_claimed(tenant, key, tool, args, fp, worker_id, expires, step_id, now, attempt_id)
        if op is not None:
            return ClaimAnswer("execute", op)
    with transaction.atomic():
        inserted = _insert(tenant, key, tool, args, fp, worker_id, expires, step_id, attempt_id)
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
        if op.unverified and op.status in (S.SUCCEEDED, S.FAILED, S.RETRYABLE_FAILED):
            # Only a trace of a key without the ledger scope says so: evidence for a person or the
            # reconciler, never a verdict this claim acts on (ingest-only keys cannot plant results).
            traced = op.status
            _move(
                op,
                S.UNKNOWN,
                actor=Actor.SYSTEM,
                note=(
                    f"traced as {traced} through an API key without the ledger scope: evidence, "
                    "not a verdict; reconcile it before it runs again"
                ),
                evidence={"traced_status": traced},
            )
            op.save()
            return ClaimAnswer("reconcile", op, 409)
        if op.status in (S.PENDING, S.RETRYABLE_FAILED):
            _move(op, S.RUNNING, actor=Actor.WORKER, actor_id=worker_id, note="claimed again")
            op.lease_owner, op.lease_expires_at, op.attempts, op.attempt_id = (
                worker_id,
                now + timedelta(seconds=lease_s),
                op.attempts + 1,
                attempt_id,
            )
            op.save()
            return ClaimAnswer("execute", op)
        lease_live = op.status == S.RUNNING and op.lease_expires_at is not None and op.lease_expires_at > now
        same_attempt = lease_live and bool(attempt_id) and op.attempt_id == attempt_id
        if same_attempt:
            # The attempt asks again: its first answer was lost on the way (it cannot have executed
            # without it). The same lease, not a wait on itself until it expires.
            return ClaimAnswer("execute", op)
        metrics.dedupe_hit(op)
        if op.status == S.SUCCEEDED:
            return ClaimAnswer("reuse", op)
        if op.status == S.FAILED:
            return ClaimAnswer("failed", op)
        if op.status == S.RUNNING:
            if lease_live:
                # Another attempt holds it, whoever sends this one (two threads share a worker_id).
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
    tenant: Tenant,
    key: str,
    tool: str,
    args: dict,
    fp: str,
    owner: str,
    expires: datetime,
    step_id: str,
    attempt_id: str,
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
        "attempt_id": attempt_id,
        "external_request_id": "",
        "result_digest": "",
        "error_class": "",
        "source": "api",
        "call_id": "",
        "step_id": step_id,
        "executions": 0,
        "needs_person": False,
        "unverified": False,
        "reconcile_attempts": 0,
        "created_at": now,
        "updated_at": now,
    }


def _insert(
    tenant: Tenant,
    key: str,
    tool: str,
    args: dict,
    fp: str,
    owner: str,
    expires: datetime,
    step_id: str,
    attempt_id: str,
) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING: True when this caller created the operation (and owns it)."""
    table = Operation._meta.db_table
    values = _new_row(tenant, key, tool, args, fp, owner, expires, step_id, attempt_id)
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
    attempt_id: str,
) -> Operation | None:
    """PostgreSQL: the new operation and its first transition in one statement; None when the key
    exists already (the caller then takes the locked path)."""
    values = _new_row(tenant, key, tool, args, fp, owner, expires, step_id, attempt_id)
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
    tenant: Tenant,
    key: str,
    worker_id: str,
    attempt: int | None,
    result_json: str,
    digest: str,
    external_request_id: str,
) -> Operation | None:
    """PostgreSQL: the lease holder's success in one statement (update + transition); None when the
    operation is not RUNNING under this worker's lease and attempt (the caller then takes the
    locked path, which says why)."""
    now = timezone.now()
    returned = (
        "id, operation_key, tool, status, fingerprint, attempts, attempt_id, lease_owner, lease_expires_at, "
        "external_request_id, error_class, needs_person, reconcile_attempts, created_at, updated_at"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH upd AS (UPDATE {Operation._meta.db_table} SET status = %s, result_json = %s, "
            "result_digest = %s, external_request_id = COALESCE(NULLIF(%s, ''), external_request_id), "
            "lease_expires_at = NULL, updated_at = %s "
            "WHERE tenant_id = %s AND operation_key = %s AND status = %s AND lease_owner = %s "
            "AND attempts = COALESCE(%s::integer, attempts) "
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
                attempt,
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
    """A completion, renewal or release by someone who does not hold the operation's attempt."""

    code = "not_lease_holder"

    def __init__(self, message: str, *, operation: Operation | None = None) -> None:
        super().__init__(message)
        self.operation = operation
        self.current_attempt = operation.attempts if operation is not None else None
        self.status = operation.status if operation is not None else ""


class StaleAttempt(NotLeaseHolder):
    """A fencing token (attempt number) that is not the operation's latest attempt."""

    code = "stale_attempt"


def _holds(op: Operation, worker_id: str, attempt: int | None) -> bool:
    """Whether (worker_id, attempt) is the operation's latest attempt; a client that sends no
    attempt (from before fencing tokens) is judged by its worker_id alone."""
    return op.lease_owner == worker_id and (attempt is None or op.attempts == attempt)


def _refusal(
    op: Operation, *, what: str, worker_id: str, attempt: int | None, **evidence: Any
) -> NotLeaseHolder:
    """The refusal of `what` (complete, renew) by a non-holder, recorded in the operation's history
    (from and to its unchanged status): a stale attempt still at work is worth knowing about. Not
    recorded: the current attempt's renewal once its operation settled (a heartbeat that was in
    flight when its own completion landed)."""
    stale = attempt is not None and attempt != op.attempts
    if stale:
        error: NotLeaseHolder = StaleAttempt(
            f"attempt {attempt} is not the operation's current attempt {op.attempts} "
            f"({op.operation_key}: {op.status}): {worker_id} cannot {what} it with a stale fencing token",
            operation=op,
        )
    else:
        error = NotLeaseHolder(
            f"{op.operation_key}: {op.status}, lease held by {op.lease_owner or 'nobody'} "
            f"(attempt {op.attempts}); {worker_id} cannot {what} it",
            operation=op,
        )
    if stale or what != "renew":
        OperationTransition.objects.create(
            operation=op,
            from_status=op.status,
            to_status=op.status,
            actor=Actor.WORKER,
            actor_id=worker_id,
            note=f"refused: {error}",
            evidence={"refused": what, "attempt": attempt, "current_attempt": op.attempts, **evidence},
        )
    return error


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
    attempt: int | None = None,
) -> Operation:
    """The holder of the latest attempt reports the outcome; the result is stored before anyone is
    answered. attempt: its fencing token (None: a client from before tokens, judged by worker_id).

    Also taken: a late report of the attempt whose lease ran out (UNKNOWN since, and nobody decided
    meanwhile), and a success that agrees with a SUCCEEDED someone else found meanwhile (kept as
    it was). Anything else raises NotLeaseHolder (StaleAttempt for an older token), recorded.
    """
    if outcome == "succeeded" and connection.vendor == "postgresql" and not connection.in_atomic_block:
        result_json = orjson.dumps(result).decode()
        digest = hashlib.sha256(result_json.encode()).hexdigest()
        op = _complete_succeeded(tenant, key, worker_id, attempt, result_json, digest, external_request_id)
        if op is not None:
            return op
    refused: NotLeaseHolder | None = None
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(tenant=tenant, operation_key=key).first()
        if op is None:
            raise Operation.DoesNotExist(key)
        holder = _holds(op, worker_id, attempt)
        # UNKNOWN because its lease ran out (a completion clears lease_expires_at, an expiry keeps it).
        late = op.status == S.UNKNOWN and holder and op.lease_expires_at is not None
        if op.status == S.SUCCEEDED and holder and attempt is not None and outcome == "succeeded":
            last = op.history.order_by("-pk").first()
            if last is not None and not (last.actor == Actor.WORKER and last.actor_id == worker_id):
                OperationTransition.objects.create(
                    operation=op,
                    from_status=S.SUCCEEDED,
                    to_status=S.SUCCEEDED,
                    actor=Actor.WORKER,
                    actor_id=worker_id,
                    note=f"the holder's own report agrees: succeeded (attempt {attempt})",
                    evidence={"attempt": attempt},
                )
            return op
        if not ((op.status == S.RUNNING and holder) or late):
            refused = _refusal(op, what="complete", worker_id=worker_id, attempt=attempt, outcome=outcome)
        else:
            _complete_apply(
                op,
                worker_id=worker_id,
                late=late,
                outcome=outcome,
                result=result,
                error_class=error_class,
                external_request_id=external_request_id,
                no_side_effect=no_side_effect,
            )
    if refused is not None:
        raise refused  # after the commit: the refusal stays in the history
    return op


def _complete_apply(
    op: Operation,
    *,
    worker_id: str,
    late: bool,
    outcome: str,
    result: Any,
    error_class: str,
    external_request_id: str,
    no_side_effect: bool,
) -> None:
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


@dataclass(frozen=True)
class Lease:
    """A renewed lease: its holder, attempt (fencing token) and end."""

    operation_key: str
    status: str
    owner: str
    attempt: int
    expires_at: datetime


def operation_renew(*, tenant: Tenant, key: str, worker_id: str, attempt: int, lease_s: float) -> Lease:
    """The holder of `attempt` is still at work: its lease runs `lease_s` from now.

    A holder whose lease ran out meanwhile (UNKNOWN since, nobody decided) is RUNNING again: it is
    alive, and a reconciler's "not done" must not license a second execution. Anything else raises
    NotLeaseHolder (StaleAttempt for an older token), recorded in the history.
    """
    lease_s = min(max(lease_s, 1.0), MAX_LEASE_S)
    now = timezone.now()
    expires = now + timedelta(seconds=lease_s)
    # The common case in one UPDATE: a renewal is not a transition (nothing is recorded).
    renewed = Operation.objects.filter(
        tenant=tenant, operation_key=key, status=S.RUNNING, lease_owner=worker_id, attempts=attempt
    ).update(lease_expires_at=expires, updated_at=now)
    if renewed:
        return Lease(
            operation_key=key, status=S.RUNNING, owner=worker_id, attempt=attempt, expires_at=expires
        )
    refused: NotLeaseHolder | None = None
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(tenant=tenant, operation_key=key).first()
        if op is None:
            raise Operation.DoesNotExist(key)
        if op.status == S.UNKNOWN and _holds(op, worker_id, attempt) and op.lease_expires_at is not None:
            _move(
                op,
                S.RUNNING,
                actor=Actor.WORKER,
                actor_id=worker_id,
                note=f"the holder renewed after its lease had run out: attempt {attempt} is still at work",
                evidence={"attempt": attempt, "lease_expired_at": op.lease_expires_at.isoformat()},
            )
            op.lease_expires_at = expires
            op.save()
        else:
            refused = _refusal(op, what="renew", worker_id=worker_id, attempt=attempt)
    if refused is not None:
        raise refused
    return Lease(
        operation_key=key, status=op.status, owner=op.lease_owner, attempt=op.attempts, expires_at=expires
    )


def operation_release(
    *, tenant: Tenant, key: str, worker_id: str, attempt_id: str = "", attempt: int | None = None
) -> Operation:
    """The holder gives its claim back without having run the tool: no effect, it may run again
    (RETRYABLE_FAILED), also once its lease ran out (UNKNOWN since, nobody decided).

    A client whose claim got no answer in time knows only the attempt_id it sent: with it, the
    claim that landed anyway never leaves an UNKNOWN for a person. Raises NotLeaseHolder when the
    operation is not this attempt's (not recorded: the claim may have been answered `wait`).
    """
    if not attempt_id and attempt is None:
        raise ValueError("attempt_id or attempt: which attempt gives its claim back")
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(tenant=tenant, operation_key=key).first()
        if op is None:
            raise Operation.DoesNotExist(key)
        mine = op.lease_owner == worker_id and (
            (attempt is not None and op.attempts == attempt)
            or (bool(attempt_id) and op.attempt_id == attempt_id)
        )
        if mine and op.status == S.RETRYABLE_FAILED:
            return op  # given back already (a release sent again)
        if not mine or not (
            op.status == S.RUNNING or (op.status == S.UNKNOWN and op.lease_expires_at is not None)
        ):
            raise NotLeaseHolder(
                f"{key}: {op.status}, attempt {op.attempts} of {op.lease_owner or 'nobody'}; "
                f"{worker_id}'s attempt {attempt_id or attempt} has nothing to give back",
                operation=op,
            )
        _move(
            op,
            S.RETRYABLE_FAILED,
            actor=Actor.WORKER,
            actor_id=worker_id,
            note="released by its attempt before it ran: no effect, it may run again",
            evidence={"attempt": op.attempts, "attempt_id": op.attempt_id},
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

    The operator's reference is stored on the decision (OperationTransition.operator_reference); the
    operation keeps the external_request_id its attempt reported, which the history would lose.
    `expected`: the status the operator was shown; when the operation has moved since, AlreadyResolved.
    """
    if not note.strip():
        raise ValueError("note: say why")
    with transaction.atomic():
        op = Operation.objects.select_for_update().get(pk=operation.pk)
        _decidable(op, expected)
        if to not in OPERATOR_TARGETS:
            raise TransitionRefused(op, to)
        _move(op, to, actor=Actor.USER, actor_id=user, note=note, operator_reference=external_reference)
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
        reconciler = reconciler_for(op)
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
    # A tenant's operations are asked of that tenant's reconcilers only (with its credentials).
    reconcilers = {
        (r.tenant_id, r.tool): r
        for r in Reconciler.objects.filter(tenant__isnull=False).select_related("tenant")
    }
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
            reconciler = reconcilers.get((op.tenant_id, op.tool))
            if reconciler is None:
                op.needs_person = True
                op.last_reconcile = {"answer": "no reconciler configured for this tool"}
                op.save(update_fields=["needs_person", "last_reconcile", "updated_at"])
                continue
            asked += 1
            verdict, answer = reconciler_ask(reconciler, op)
            _reconciled(op, reconciler, verdict, answer, moment)
    return asked


def reconciler_for(op: Operation) -> Reconciler | None:
    """The reconciler of the operation's tenant for its tool (another tenant's never)."""
    return Reconciler.objects.filter(tenant_id=op.tenant_id, tool=op.tool).select_related("tenant").first()


def _quiet_at(op: Operation, reconciler: Reconciler) -> datetime:
    """When no attempt can still act: the end of the last lease (or the moment it became UNKNOWN,
    when the holder itself reported) plus the reconciler's grace for requests still under way."""
    base = op.lease_expires_at or op.unknown_since or timezone.now()
    return base + timedelta(seconds=reconciler.grace_s)


def _reconciled(
    op: Operation, reconciler: Reconciler, verdict: str, answer: dict[str, Any], now: datetime
) -> None:
    op.reconcile_attempts += 1
    op.last_reconcile = {"at": now.isoformat(), "verdict": verdict, "acted": verdict != "unknown", **answer}
    if verdict == "done":
        _move(
            op, S.SUCCEEDED, actor=Actor.RECONCILER, note="the downstream says it happened", evidence=answer
        )
        if op.result_json is None:
            # The tool's own answer never came: the downstream's verdict and the fields the
            # reconciler declares are the result (never the downstream's whole body).
            record = {answer.get("field", reconciler.field): answer.get("value"), **answer.get("kept", {})}
            op.result_json = orjson.dumps(record).decode()
            op.result_digest = hashlib.sha256(op.result_json.encode()).hexdigest()
    elif verdict == "not_done" and now < (quiet := _quiet_at(op, reconciler)):
        # True now, but the holder may still be running (or its request still on the way): not a
        # licence to execute again. Asked again once nobody can act any more.
        op.next_reconcile_at = quiet
        op.last_reconcile.update(
            acted=False,
            note=f"not done yet, but an attempt may still act until {quiet:%Y-%m-%d %H:%M:%S} UTC: asked again then",
        )
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
    """('done' | 'not_done' | 'unknown', what the downstream answered, reduced to the verdict's field
    and the reconciler's keep_fields). The request is the reconciler's tenant's, with its headers,
    checked by ingest.downstream (no redirects, no private targets unless allowed, encoded ids)."""
    try:
        target = target_for(
            reconciler.url_template,
            operation_key=op.operation_key,
            external_request_id=op.external_request_id,
        )
    except Refused as exc:
        return "unknown", {"error": f"not asked: {exc}"}
    slug = reconciler.tenant.slug if reconciler.tenant_id else ""
    headers = settings.LOOPWATCH_RECONCILER_HEADERS.get(slug, {}).get(reconciler.headers_name, {})
    try:
        status, raw = downstream_fetch(
            target, method=reconciler.method, headers=headers, timeout=reconciler.timeout_s
        )
    except (OSError, http.client.HTTPException) as exc:
        return "unknown", {"url": target.url, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if 300 <= status < 400:
        return "unknown", {"url": target.url, "status": status, "error": "a redirect is not followed"}
    if status == 404 and reconciler.not_found_means_not_done:
        return "not_done", {"url": target.url, "status": 404}
    if not 200 <= status < 300:
        return "unknown", {"url": target.url, "status": status}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "unknown", {"url": target.url, "status": status, "error": "answer is not JSON"}
    value = kept(body, [reconciler.field])[reconciler.field]
    answer = {
        "url": target.url,
        "status": status,
        "field": reconciler.field,
        "value": value,
        "kept": kept(body, reconciler.keep_fields),
    }
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
    *("needs_person", "unverified"),
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
            elif op is None or not _trace_finished(op, run, call, transitions, verified=_verified(run, call)):
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


def _verified(run, call) -> bool:
    """Whether a traced result came before any event of its run that a key without the ledger
    scope sent (Run.unverified_from_seq): only then is it a ledger verdict."""
    first = getattr(run, "unverified_from_seq", None)
    return first is None or call.result_seq < first


def _trace_finished(
    op: Operation, run, call, transitions: list[OperationTransition], *, verified: bool = True
) -> bool:
    """The result of a traced write: ok -> SUCCEEDED, timeout -> UNKNOWN, a definitive error ->
    FAILED, a transient one -> RETRYABLE_FAILED (a 503/429 answer: the service refused it), any
    other error -> UNKNOWN (its effect is not ruled out). False when it changes nothing.

    Not `verified` (sent with a key without the ledger scope): the same status, for operators and
    the duplicate-write detector, but marked unverified and without the result: a claim then gets
    `reconcile`, never what an ingest-only key planted."""
    if op.status != S.RUNNING or op.lease_owner != TRACE_WORKER:
        return False  # claimed through the API meanwhile, or already settled: the API's account wins
    if call.external_request_id:
        op.external_request_id = call.external_request_id
    evidence: dict[str, Any] = {"run_id": run.run_id, "call_id": call.call_id}
    if not verified:
        evidence["ledger_scope"] = False
    if call.result_status == "ok" and call.error_class not in NON_RETRYABLE:
        if verified:
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
    op.unverified = not verified
    return True
