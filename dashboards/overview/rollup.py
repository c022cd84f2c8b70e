"""The overview's hourly rollup: hours of runs and detections summed once, read by every page.

An hour is rolled for every tenant at once, in one transaction under the lock of its RollupHour
row: its rows are deleted and built again from the runs that started in it and the detections whose
event fell in it. Rolling an hour twice, or from two workers at once, gives the same rows (the second
waits for the first, then replaces its rows). The page reads the rolled hours from here and every
other part of its range (the open hour, the range's ragged ends, hours not rolled yet or dirty) from
the runs and detections themselves, so the figures never depend on whether a pass has run.

The open hour is rolled too, up to the minute OPEN_GRACE before the pass (RollupHour.until), again at
every pass: the page reads only the minutes since live, so its time does not grow with the hour's
data. A run started in the rolled part that changes (an event, a finish) shows its new figures from
the next pass on (LOOPWATCH_ROLLUP_EVERY_S), as a late change to a closed hour does.

Late data. Runs change after their hour has closed (they finish, cost more, loop); detections and
verdicts arrive for old hours. A pass finds the hours to roll again without any hook in ingest:
- runs whose detection cursor moved since the last pass (every stored event of a run is followed by
  the detection task, which moves the cursor in the transaction that stores detections and the run's
  loop figures): the hours they started in;
- detections stored since the last pass: the hours of their events;
- hours whose count of RUNNING or WAITING runs differs from the count when they were rolled (the
  guard hands a run to a person and back without an event);
- hours marked dirty by a verdict (dashboards.alerts.services).
Changes are looked for since the previous pass's start minus OVERLAP: a transaction that wrote its
timestamp before that start but committed after the pass read is seen by the next pass.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, DateTimeField, ExpressionWrapper, F, Q

from dashboards.models import DetectionRollup, RollupHour, RollupState, RunRollup, TailRollup
from dashboards.overview.selectors import (
    FINISHED,
    HOUR,
    MINUTE,
    QUARTER,
    EpochBucket,
    bucket_of,
    bucket_start,
    run_ended,
    run_group_figures,
    run_sums,
)
from ingest.models import Detection, Run, RunCursor, Tenant

logger = logging.getLogger(__name__)

STATE = "overview"
# Longer than any transaction that stamps a change and commits later: the detection tasks' time
# limits are 150 and 330 s.
OVERLAP = timedelta(minutes=10)
# A pass rolls at most this many hours, newest first: a first backfill of a long history is spread
# over passes (each a few seconds), and the hours not rolled yet are read live meanwhile.
MAX_HOURS_PER_PASS = 24 * 7
# Hours older than this are never rolled (a custom range there is read live, as before).
ROLLUP_DAYS = 400
UNSETTLED = (Run.Status.RUNNING, Run.Status.WAITING)
# The open hour is rolled up to the minute this long before the pass: the first batch of a run that
# started in the last seconds may still be on its way (an exporter sends every few seconds).
OPEN_GRACE = timedelta(seconds=60)


def hour_of(when: datetime) -> datetime:
    return bucket_of(when, HOUR)


def rollup_hour_build(*, hour: datetime, now: datetime, until: datetime | None = None) -> int:
    """Build the rollup rows of one hour (all tenants) again, up to `until` (the open hour; None:
    the whole hour); returns how many rows it holds."""
    end = min(until, hour + HOUR) if until is not None else hour + HOUR
    with transaction.atomic():
        # The marker first, locked: a second roll of the same hour waits here, then replaces these rows.
        RollupHour.objects.bulk_create(
            [RollupHour(hour=hour, rolled_at=now, dirty=True)], ignore_conflicts=True
        )
        marker = RollupHour.objects.select_for_update().get(hour=hour)
        RunRollup.objects.filter(hour=hour).delete()
        DetectionRollup.objects.filter(hour=hour).delete()
        TailRollup.objects.filter(hour=hour).delete()
        runs, running, waiting = _run_cells(hour, end)
        detections = _detection_cells(hour, end)
        tails = _tail_cells(hour, end)
        RunRollup.objects.bulk_create(runs, batch_size=500)
        DetectionRollup.objects.bulk_create(detections, batch_size=500)
        TailRollup.objects.bulk_create(tails, batch_size=1000)
        RollupHour.objects.filter(pk=marker.pk).update(
            rolled_at=now, dirty=False, running=running, waiting=waiting, until=end
        )
    return len(runs) + len(detections) + len(tails)


def _cell(hour: datetime, tenant_id: int, backend: str, model: str, task_type: str, agent: str) -> dict:
    """The fields every rollup row has: its hour, tenant and the overview's filter values."""
    return {
        "hour": hour,
        "tenant_id": tenant_id,
        "backend": backend,
        "model": model,
        "task_type": task_type,
        "agent": agent,
    }


def _run_cells(start: datetime, end: datetime) -> tuple[list[RunRollup], int, int]:
    rows = (
        Run.objects.filter(started_at__gte=start, started_at__lt=end)
        .annotate(quarter=EpochBucket("started_at", QUARTER))
        .values_list(
            *("tenant_id", "backend", "model", "task_type", "agent"),
            *("status", "terminated_by", "budget_type", "quarter"),
        )
        .annotate(**run_sums())
        .order_by()
    )
    cells: dict[tuple[Any, ...], RunRollup] = {}
    running = waiting = 0
    for (
        tenant_id,
        backend,
        model,
        task_type,
        agent,
        status,
        terminated_by,
        budget_type,
        quarter,
        *sums,
    ) in rows:
        n, flagged, events, calls, cost, burned = sums
        ended = run_ended(status=status, terminated_by=terminated_by, budget_type=budget_type)
        key = (tenant_id, backend, model, task_type, agent, ended)
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = RunRollup(**_cell(start, *key[:5]), ended=ended)
        figures = run_group_figures(
            status=status, n=n, flagged=flagged, events=events, calls=calls, cost=cost, burned=burned
        )
        for name, value in figures.items():
            setattr(cell, name, getattr(cell, name) + value)
        if status == Run.Status.RUNNING:
            running += n
        elif status == Run.Status.WAITING:
            waiting += n
        if status in FINISHED:
            name = f"finished_q{quarter % 4}"
            setattr(cell, name, getattr(cell, name) + n)
    return list(cells.values()), running, waiting


def _detection_cells(start: datetime, end: datetime) -> list[DetectionRollup]:
    rows = (
        Detection.objects.filter(ts__gte=start, ts__lt=end)
        .annotate(quarter=EpochBucket("ts", QUARTER))
        .values_list(
            *("tenant_id", "backend", "model", "task_type", "agent"),
            *("kind", "action", "feedback", "quarter"),
        )
        .annotate(n=Count("*"))
        .order_by()
    )
    cells: dict[tuple, DetectionRollup] = {}
    for *key, quarter, n in rows:
        cell = cells.get(tuple(key))
        if cell is None:
            kind, action, feedback = key[5:]
            cell = cells[tuple(key)] = DetectionRollup(
                **_cell(start, *key[:5]), kind=kind, action=action, feedback=feedback
            )
        cell.n += n
        name = f"n_q{quarter % 4}"
        setattr(cell, name, getattr(cell, name) + n)
    return list(cells.values())


def _tail_cells(start: datetime, end: datetime) -> list[TailRollup]:
    """The finished runs started in [start, end) counted per value of each long-tail metric: one
    grouped scan by both values (as the live read groups them), split per metric here."""
    rows = (
        Run.objects.filter(started_at__gte=start, started_at__lt=end, status__in=FINISHED)
        .values_list(*("tenant_id", "backend", "model", "task_type", "agent"), "rounds", "tool_calls")
        .annotate(n=Count("*"))
        .order_by()
    )
    counts: dict[tuple, int] = defaultdict(int)
    for *dimensions, rounds, calls, n in rows:
        counts[(*dimensions, TailRollup.Metric.ROUNDS, rounds)] += n
        counts[(*dimensions, TailRollup.Metric.TOOL_CALLS, calls)] += n
    return [
        TailRollup(**_cell(start, *key[:5]), metric=key[5], value=key[6], n=n) for key, n in counts.items()
    ]


def rollup_hours_dirty(*, times: list[datetime]) -> int:
    """Mark the rolled hours holding these times dirty: the page reads them live until rolled again."""
    hours = {hour_of(when) for when in times if when is not None}
    return RollupHour.objects.filter(hour__in=hours, dirty=False).update(dirty=True) if hours else 0


def _changed_hours(
    *, since: datetime | None, closed: datetime, oldest: datetime, tenant_ids: list[int]
) -> set:
    """The rolled hours whose runs or detections changed since `since` (see the module's docstring)."""
    changed: set[datetime] = set()
    epoch_hours: set[int] = set()
    if since is not None:
        epoch_hours.update(
            RunCursor.objects.filter(updated_at__gt=since, run__started_at__isnull=False)
            .annotate(at=EpochBucket("run__started_at", HOUR))
            .values_list("at", flat=True)
            .distinct()
            .order_by()
        )
        epoch_hours.update(
            Detection.objects.filter(tenant_id__in=tenant_ids, created_at__gt=since)
            .annotate(at=EpochBucket("ts", HOUR))
            .values_list("at", flat=True)
            .distinct()
            .order_by()
        )
    changed.update(bucket_start(at, HOUR) for at in epoch_hours)
    # Runs handed to a person, or back, by the guard: no event, no cursor move.
    now_unsettled: dict[datetime, list[int]] = defaultdict(lambda: [0, 0])
    rows = (
        Run.objects.filter(
            tenant_id__in=tenant_ids, status__in=UNSETTLED, started_at__gte=oldest, started_at__lt=closed
        )
        .annotate(at=EpochBucket("started_at", HOUR))
        .values_list("at", "status")
        .annotate(n=Count("*"))
        .order_by()
    )
    for at, status, n in rows:
        now_unsettled[bucket_start(at, HOUR)][UNSETTLED.index(status)] += n
    markers = RollupHour.objects.filter(
        Q(running__gt=0) | Q(waiting__gt=0) | Q(hour__in=list(now_unsettled)), dirty=False
    ).values_list("hour", "running", "waiting")
    for hour, running, waiting in markers:
        if now_unsettled.get(hour, [0, 0]) != [running, waiting]:
            changed.add(hour)
    return {hour for hour in changed if oldest <= hour < closed}


def _first_data_hour(*, tenant_ids: list[int], oldest: datetime) -> datetime | None:
    """The earliest hour since `oldest` holding a run's start or a detection (per tenant: indexed)."""
    firsts = []
    for tenant_id in tenant_ids:
        firsts.append(
            Run.objects.filter(tenant_id=tenant_id, started_at__gte=oldest)
            .order_by("started_at")
            .values_list("started_at", flat=True)
            .first()
        )
        firsts.append(
            Detection.objects.filter(tenant_id=tenant_id, ts__gte=oldest)
            .order_by("ts")
            .values_list("ts", flat=True)
            .first()
        )
    found = [when for when in firsts if when is not None]
    return hour_of(min(found)) if found else None


def rollup_pass(*, now: datetime, max_hours: int | None = MAX_HOURS_PER_PASS) -> int:
    """Roll the hours that need it; returns how many hours it rolled.

    1. Mark dirty the rolled hours that changed since the previous pass (minus OVERLAP), and record
       this pass's start as the new mark.
    2. Due: the dirty hours, the closed hours rolled only in part (while they were open), and the
       closed hours since the first run or detection (at most ROLLUP_DAYS back) that were never
       rolled.
    3. Roll them, newest first, at most max_hours (None: all); the rest stay due for the next pass.
    4. Roll the open hour up to the minute OPEN_GRACE before `now`.
    """
    closed = hour_of(now)
    # Never an hour rollups_purge would delete again.
    oldest = closed - timedelta(days=min(ROLLUP_DAYS, settings.LOOPWATCH_ROLLUP_RETENTION_DAYS))
    tenant_ids = list(Tenant.objects.values_list("pk", flat=True))
    state = RollupState.objects.filter(name=STATE).first()
    since = state.checked_at - OVERLAP if state is not None else None
    changed = _changed_hours(since=since, closed=closed, oldest=oldest, tenant_ids=tenant_ids)
    if changed:
        RollupHour.objects.filter(hour__in=changed, dirty=False).update(dirty=True)
    RollupState.objects.update_or_create(name=STATE, defaults={"checked_at": now})
    hour_end = ExpressionWrapper(F("hour") + HOUR, output_field=DateTimeField())
    due = set(
        RollupHour.objects.filter(Q(dirty=True) | Q(until__lt=hour_end), hour__gte=oldest, hour__lt=closed)
        .values_list("hour", flat=True)
        .order_by()
    )
    first = _first_data_hour(tenant_ids=tenant_ids, oldest=oldest)
    if first is not None and first < closed:
        rolled = set(
            RollupHour.objects.filter(hour__gte=first, hour__lt=closed).values_list("hour", flat=True)
        )
        count = (closed - first) // HOUR
        due.update(hour for hour in (first + i * HOUR for i in range(count)) if hour not in rolled)
    hours = sorted(due, reverse=True)
    if max_hours is not None:
        hours = hours[:max_hours]
    for hour in hours:
        rollup_hour_build(hour=hour, now=now)
    if hours:
        logger.info("overview rollup: %d hours rolled, %d still due", len(hours), len(due) - len(hours))
    until = bucket_of(now - OPEN_GRACE, MINUTE)
    if until > closed:
        rollup_hour_build(hour=closed, now=now, until=until)
        return len(hours) + 1
    return len(hours)


def rollup_clear() -> None:
    """Forget every rolled hour (the page reads everything live until the next pass)."""
    with transaction.atomic():
        RollupHour.objects.all().delete()
        RunRollup.objects.all().delete()
        DetectionRollup.objects.all().delete()
        TailRollup.objects.all().delete()
        RollupState.objects.filter(name=STATE).delete()


def rollups_purge(*, now: datetime) -> int:
    """Delete the rolled hours older than LOOPWATCH_ROLLUP_RETENTION_DAYS (their runs and detections
    are gone sooner, LOOPWATCH_RUN_RETENTION_DAYS); returns how many hours."""
    oldest = hour_of(now) - timedelta(days=settings.LOOPWATCH_ROLLUP_RETENTION_DAYS)
    with transaction.atomic():
        RunRollup.objects.filter(hour__lt=oldest).delete()
        DetectionRollup.objects.filter(hour__lt=oldest).delete()
        TailRollup.objects.filter(hour__lt=oldest).delete()
        deleted, _ = RollupHour.objects.filter(hour__lt=oldest).delete()
    return deleted
