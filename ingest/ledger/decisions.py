"""An operator's decisions about an operation: resolve it by hand, or have it reconciled now."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from ingest import metrics
from ingest.ledger.claims import OPERATOR_TARGETS, Actor, S, TransitionRefused, _lease_expired, _move
from ingest.ledger.reconcile import _reconciled, reconciler_ask, reconciler_for
from ingest.models import Operation, OperationTransition


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
