"""The operator's decisions, through the ledger (which owns the transitions and their history)."""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.queue.forms import ACTIONS
from ingest.ledger import operation_reconcile_now, operation_resolve
from ingest.models import Operation


@dataclass(frozen=True)
class Decided:
    operation: Operation
    message: str


def queue_decide(
    *, operation: Operation, user, action: str, note: str, shown_status: str, external_reference: str = ""
) -> Decided:
    """Apply one decision; raises ingest.ledger.AlreadyResolved when the state moved since it was shown."""
    who = user.get_username()
    if action == "reconcile":
        op = operation_reconcile_now(operation=operation, user=who, note=note, expected=shown_status)
        answer = op.last_reconcile or {}
        if op.status == Operation.Status.UNKNOWN:
            detail = (
                answer.get("note")
                or answer.get("answer")
                or answer.get("error")
                or f"answer {answer.get('status', '?')}"
            )
            return Decided(op, f"Asked the downstream: no definite answer ({detail}); still UNKNOWN.")
        return Decided(op, f"Asked the downstream: {answer.get('verdict', '?')} → {op.status}.")
    label, to = ACTIONS[action]
    op = operation_resolve(
        operation=operation,
        to=to,
        user=who,
        note=note.strip(),
        external_reference=external_reference.strip() if action == "succeeded" else "",
        expected=shown_status,
    )
    return Decided(op, f"{op.operation_key}: {label} → {op.status}.")
