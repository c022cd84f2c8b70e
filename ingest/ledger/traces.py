"""Traced writes feed the ledger: a traced write's call and result move its operation as a claim
and a completion would."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from ingest.bulk import concrete_field, db_column, of_tenant, rows_update
from ingest.detection.config import NON_RETRYABLE, RETRYABLE
from ingest.ledger.claims import Actor, S, _move, fingerprint, operation_key_for
from ingest.models import Operation, OperationTransition

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
    keyed = []
    for i, (kind, run, call) in enumerate(steps):
        key = trace_key(call, run)
        if key is not None:
            keyed.append((i, kind, run, call, key))
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
            which |= of_tenant(tenant_id) & Q(operation_key__in=sorted(keys))
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
    tenant, key = (quote(db_column(concrete_field(Operation, name))) for name in ("tenant", "operation_key"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(db_column(f)) for f in fields)}) "
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
