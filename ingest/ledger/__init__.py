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

One module per part: claims (states, and an attempt's claim, renewal, completion, release),
decisions (an operator's), reconcile (Celery beat), traces (traced writes feed the ledger).
"""

from ingest.ledger.claims import (
    ALLOWED,
    DEFAULT_LEASE_S,
    MAX_LEASE_S,
    OPERATOR_TARGETS,
    RECONCILE_BACKOFF_S,
    Actor,
    ClaimAnswer,
    Lease,
    NotLeaseHolder,
    S,
    StaleAttempt,
    TransitionRefused,
    fingerprint,
    operation_claim,
    operation_complete,
    operation_key_for,
    operation_release,
    operation_renew,
)
from ingest.ledger.decisions import AlreadyResolved, operation_reconcile_now, operation_resolve
from ingest.ledger.reconcile import (
    leases_expire,
    operations_purge,
    reconcile_due,
    reconciler_ask,
    reconciler_for,
)
from ingest.ledger.traces import (
    TRACE_FINISHED,
    TRACE_LEASE_S,
    TRACE_STARTED,
    TRACE_WORKER,
    trace_key,
    trace_writes_record,
)

__all__ = [
    "ALLOWED",
    "DEFAULT_LEASE_S",
    "MAX_LEASE_S",
    "OPERATOR_TARGETS",
    "RECONCILE_BACKOFF_S",
    "TRACE_FINISHED",
    "TRACE_LEASE_S",
    "TRACE_STARTED",
    "TRACE_WORKER",
    "Actor",
    "AlreadyResolved",
    "ClaimAnswer",
    "Lease",
    "NotLeaseHolder",
    "S",
    "StaleAttempt",
    "TransitionRefused",
    "fingerprint",
    "leases_expire",
    "operation_claim",
    "operation_complete",
    "operation_key_for",
    "operation_reconcile_now",
    "operation_release",
    "operation_renew",
    "operation_resolve",
    "operations_purge",
    "reconcile_due",
    "reconciler_ask",
    "reconciler_for",
    "trace_key",
    "trace_writes_record",
]
