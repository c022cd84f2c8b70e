"""The ledger's states and claims: the moves ALLOWED between states, and an attempt's claim,
renewal, completion and release of an operation."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.db import connection, transaction
from django.utils import timezone

from ingest import metrics
from ingest.bulk import TENANT_PK, of_tenant, postgres_statements
from ingest.detection.config import NON_RETRYABLE, RETRYABLE
from ingest.detection.normalize import canonical
from ingest.models import Operation, OperationTransition, Tenant

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

    def as_dict(self, *, key: str) -> dict[str, Any]:
        """The answer as the ledger API's claim and the guard's check (its `ledger`) both give it:
        decision, operation_key, status, and per decision the lease (execute), the stored result as
        the very bytes it was stored as (reuse), the error (failed), retry_after (wait), or the two
        fingerprints and a detail naming `args` (conflict)."""
        op = self.operation
        out: dict[str, Any] = {"decision": self.decision, "operation_key": key, "status": op.status}
        if self.decision == "execute":
            out["lease"] = lease_state(op)
        elif self.decision == "reuse":
            out["result"] = orjson.Fragment(op.result_json or "null")
        elif self.decision == "failed":
            out["error"] = {"error_class": op.error_class, "detail": op.error}
        elif self.decision == "wait":
            out["retry_after"] = self.retry_after
        elif self.decision == "conflict":
            out.update(self.extra)
            out["detail"] = (
                f"args: operation {key} was claimed with other arguments "
                f"(stored fingerprint {self.extra['stored_fingerprint']}, this one {self.extra['fingerprint']})"
            )
        return out


def lease_state(op: Operation) -> dict[str, Any]:
    """The lease an `execute` hands out: its holder, fencing token (attempt) and end."""
    return {
        "owner": op.lease_owner,
        "expires_at": op.lease_expires_at.isoformat() if op.lease_expires_at else None,
        "attempt": op.attempts,
        "attempt_id": op.attempt_id,
    }


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
    if postgres_statements() and not connection.in_atomic_block:
        # The common case, a new key, in one statement and one round trip (autocommit).
        op = _insert_claimed(tenant, key, tool, args, fp, worker_id, expires, step_id, now, attempt_id)
        if op is not None:
            return ClaimAnswer("execute", op)
    with transaction.atomic():
        inserted = _insert(tenant, key, tool, args, fp, worker_id, expires, step_id, attempt_id)
        op = Operation.objects.select_for_update().get(of_tenant(tenant), operation_key=key)
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
            if lease_live and op.lease_expires_at is not None:
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
            f"WHERE tenant_id = {TENANT_PK} AND operation_key = %s AND status = %s AND lease_owner = %s "
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
    if outcome == "succeeded" and postgres_statements() and not connection.in_atomic_block:
        result_json = orjson.dumps(result).decode()
        digest = hashlib.sha256(result_json.encode()).hexdigest()
        op = _complete_succeeded(tenant, key, worker_id, attempt, result_json, digest, external_request_id)
        if op is not None:
            return op
    refused: NotLeaseHolder | None = None
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(of_tenant(tenant), operation_key=key).first()
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
        of_tenant(tenant), operation_key=key, status=S.RUNNING, lease_owner=worker_id, attempts=attempt
    ).update(lease_expires_at=expires, updated_at=now)
    if renewed:
        return Lease(
            operation_key=key, status=S.RUNNING, owner=worker_id, attempt=attempt, expires_at=expires
        )
    refused: NotLeaseHolder | None = None
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(of_tenant(tenant), operation_key=key).first()
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
        op = Operation.objects.select_for_update().filter(of_tenant(tenant), operation_key=key).first()
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
