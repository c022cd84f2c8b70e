"""Celery tasks: interfaces that take ids and call a service."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from ingest.events import TASK_DETECT_PENDING, TASK_DETECT_RUN, TASK_DETECT_RUNS, TASK_DETECT_SWEEP
from ingest.ledger import leases_expire, operations_purge, reconcile_due
from ingest.models import RunCursor
from ingest.otlp.service import otlp_parked_sweep as parked_spans_sweep
from ingest.services import detection_enqueue, run_process, runs_pending_process, runs_process


@shared_task(name=TASK_DETECT_RUN, soft_time_limit=120, time_limit=150)
def detect_run(run_pk: int) -> int:
    """Process a run's new events. Harmless when delivered twice: the cursor row serialises it."""
    return run_process(run_pk=run_pk)


@shared_task(name=TASK_DETECT_RUNS, soft_time_limit=300, time_limit=330)
def detect_runs(run_pks: list[int]) -> int:
    """Process the runs one stored batch touched, together (a few queries for all of them). Runs
    another task holds are taken last, once it has let them go: the two never wait on each other
    for more than one pass."""
    return runs_process(run_pks=run_pks, skip_locked=True)


@shared_task(name=TASK_DETECT_PENDING, soft_time_limit=120, time_limit=150)
def detect_pending() -> int:
    """Process the runs waiting in Redis (ingest.pending), pass after pass. Harmless when delivered
    twice or when another task took the runs first: it finds fewer, or none."""
    return runs_pending_process()


@shared_task(name=TASK_DETECT_SWEEP, soft_time_limit=60, time_limit=90)
def detect_sweep(limit: int = 500) -> int:
    """Re-queue runs whose cursor lags their events (a lost enqueue: broker down at commit time, a
    task killed after taking them), with a task queued whatever the flag says (ingest.pending), and
    quarantined runs whose next try is due; not those still waiting for it. Sent by beat and by the
    workers themselves (loopwatch.celery.SweepTimer)."""
    due = Q(failures=0) | Q(retry_at__lte=timezone.now())
    lagging = list(
        RunCursor.objects.filter(due, position__lt=F("run__events_count")).values_list("run_id", flat=True)[
            :limit
        ]
    )
    if lagging:
        detection_enqueue(lagging, force=True)
    return len(lagging)


@shared_task(name="ingest.ledger_expire_leases", soft_time_limit=60, time_limit=90)
def ledger_expire_leases() -> int:
    """RUNNING operations past their lease become UNKNOWN."""
    return leases_expire()


@shared_task(name="ingest.ledger_reconcile", soft_time_limit=240, time_limit=300)
def ledger_reconcile() -> int:
    """Ask the downstream about UNKNOWN operations that are due."""
    return reconcile_due()


@shared_task(name="ingest.ledger_purge", soft_time_limit=240, time_limit=300)
def ledger_purge() -> int:
    return operations_purge()


@shared_task(name="ingest.otlp_parked_sweep", soft_time_limit=60, time_limit=90)
def otlp_parked_sweep() -> int:
    """Place the OTLP spans parked for a run that exists now; drop those parked longer than
    LOOPWATCH_OTLP_PARK_S. Harmless when delivered twice: a span is placed in the transaction that
    removes it."""
    placed, dropped = parked_spans_sweep(
        max_age_s=settings.LOOPWATCH_OTLP_PARK_S, max_event_bytes=settings.LOOPWATCH_MAX_EVENT_BYTES
    )
    return placed + dropped
