"""Retention: how long a run's events, model rounds and tool calls are kept, and how they go.

PostgreSQL. The three tables are partitioned by range of run id (migration 0014), and the runs of
one UTC day take their ids from a block of their own, [day * BLOCK, (day + 1) * BLOCK): when a day
starts, the beat task moves the run id sequence to that day's block, after making its partitions
(and those of the next AHEAD_DAYS days). So a partition holds every row of one day's runs, a run is
never split between partitions, and the unique (run, seq) and (run, event_id) that dedupe events
hold across partitions (run_id, the partition key, is in both). Runs from before the migration
live in `<table>_before`; rows of runs whose partition is gone live in `<table>_default`.

A run is *done* with its rows at a cutoff (now minus its tenant's retention) when it was created
before it, is finished or has sent nothing since (by its events' own ts), and detection has
processed all its events. A partition is dropped whole (DROP TABLE: no DELETE of its rows) once its
day is older than the longest retention of any tenant; the rows of its runs that are not done (open
and active, or behind in detection) are first moved into the default partition, in the same
transaction, and stay there until they are done (then deleted: few rows). A run open that long is
thus never cut in half, and its cursor and engine state (RunCursor, never partitioned) survive
whatever goes. Tenants that keep their events for less than the longest retention are purged per
partition by tenant: their done runs' rows are deleted from the partition (a DELETE, by run), and
the partition is recorded as gone through for them (RetentionPurge).

SQLite (embedded) keeps plain tables: the rows of done runs are deleted by run.

Runs themselves, with their figures, cursor and detections, are kept LOOPWATCH_RUN_RETENTION_DAYS
(at least as long as their tenant's events), then deleted by rows; the overview's rollups are the
dashboards' (dashboards.overview.rollup.rollups_purge).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Exists, F, OuterRef, Q

from ingest.models import Event, ModelRound, PendingResult, RetentionPurge, Run, RunCursor, Tenant, ToolCall

logger = logging.getLogger(__name__)

# Run ids per day: 2**32 runs a day is never reached, and ids stay below 2**53 (exact as JSON numbers
# in a browser) until the year 4000.
BLOCK = 2**32
EPOCH = date(1970, 1, 1)
PARTITIONED = (Event, ModelRound, ToolCall)
# Partitions made ahead: a beat that is down for two days still finds them; the sequence only moves
# into a day whose partitions exist (and runs stay in the previous block meanwhile, harmlessly).
AHEAD_DAYS = 2
OPEN = (Run.Status.RUNNING, Run.Status.WAITING)
# Rows of runs still needed that a drop moves to the default partition within its transaction (which
# holds the tables' locks, ingest waiting): past it the partition is kept for now, and said why.
MOVE_LIMIT = 100_000
# Partition DDL waits this long for a table's lock (ingest's and detection's transactions hold it
# shared), then gives up until the next pass: a waiting DDL lock would queue the ingest behind it.
LOCK_TIMEOUT_MS = 2000
# Runs whose rows one DELETE removes (by run id); and the time a pass spends deleting past runs.
RUN_BATCH = 2000
RUNS_PURGE_BUDGET_S = 120.0
# The session advisory lock a pass holds on PostgreSQL ("lwre").
PASS_LOCK = 0x6C777265

_BOUND = re.compile(r"FROM \((.+?)\) TO \((.+?)\)")


def day_block(day: date) -> int:
    """The first run id of a day's block."""
    return (day - EPOCH).days * BLOCK


def _day(when: datetime) -> date:
    return when.astimezone(UTC).date()


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


@dataclass(frozen=True)
class Partition:
    """A partition of one of the PARTITIONED tables: run ids [lo, hi); None for MINVALUE/MAXVALUE."""

    name: str
    lo: int | None
    hi: int | None
    default: bool = False

    def overlaps(self, lo: int, hi: int) -> bool:
        if self.default:
            return False
        return (self.lo is None or self.lo < hi) and (self.hi is None or lo < self.hi)

    def holds(self, run_pk: int) -> bool:
        return self.overlaps(run_pk, run_pk + 1)


@dataclass
class RetentionReport:
    """What a pass did (the management command prints it, the task logs it)."""

    created: list[str] = field(default_factory=list)
    sequence_moved_to: int | None = None
    dropped: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    moved_runs: int = 0
    events_deleted: dict[str, int] = field(default_factory=dict)  # tenant slug → event rows deleted
    runs_deleted: int = 0

    def lines(self) -> list[str]:
        out = [f"partition made: {name}" for name in self.created]
        if self.sequence_moved_to is not None:
            out.append(f"run ids from {self.sequence_moved_to}")
        out += [f"partition dropped: {name}" for name in self.dropped]
        out += [f"partition kept: {name}: {why}" for name, why in self.kept.items()]
        if self.moved_runs:
            out.append(f"runs moved to the default partition: {self.moved_runs}")
        out += [f"events deleted of {slug}: {n}" for slug, n in sorted(self.events_deleted.items())]
        if self.runs_deleted:
            out.append(f"runs deleted: {self.runs_deleted}")
        return out or ["nothing to do"]


def retention_days(tenant: Tenant) -> int:
    return tenant.retention_days or settings.LOOPWATCH_RETENTION_DAYS


def retention_max() -> int:
    """The longest any tenant keeps its events: partitions are dropped past it."""
    longest = Tenant.objects.filter(retention_days__isnull=False).order_by("-retention_days").first()
    return max(settings.LOOPWATCH_RETENTION_DAYS, (longest.retention_days or 0) if longest else 0)


def retention_apply(*, now: datetime) -> RetentionReport:
    """One pass: partitions ahead and the day's block, then drops and purges (steps in the module
    docstring). Harmless twice; a pass that finds another one running (an advisory lock) does
    nothing."""
    report = RetentionReport()
    if connection.vendor != "postgresql":
        events_purge(now=now, report=report)
        report.runs_deleted = runs_purge(now=now)
        return report
    with connection.cursor() as cursor:
        # One pass at a time (beat's and a command's): two would race to make or drop the same table.
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [PASS_LOCK])
        if not cursor.fetchone()[0]:
            report.kept["*"] = "another retention pass is running"
            return report
    try:
        report.created = partitions_ensure(now=now)
        report.sequence_moved_to = run_ids_advance(now=now)
        tenants_purge(now=now, report=report)
        partitions_drop(now=now, report=report)
        default_purge(now=now, report=report)
        report.runs_deleted = runs_purge(now=now)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK])
    return report


# --- PostgreSQL: the partitions --------------------------------------------------------------------


def partitions_of(table: str) -> list[Partition]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [table],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        if bound == "DEFAULT":
            found.append(Partition(name, None, None, default=True))
            continue
        match = _BOUND.search(bound)
        if not match:
            continue
        lo, hi = (None if v in ("MINVALUE", "MAXVALUE") else int(v.strip("'")) for v in match.groups())
        found.append(Partition(name, lo, hi))
    return sorted(found, key=lambda p: (p.default, -(2**63) if p.lo is None else p.lo))


def _run_sequence() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, %s)", [Run._meta.db_table, Run._meta.pk.column])
        return cursor.fetchone()[0]


def _run_ids_last() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT last_value FROM {_run_sequence()}")
        return cursor.fetchone()[0]


def _ddl(statements: list[tuple[str, list]]) -> bool:
    """Run DDL in one transaction that waits at most LOCK_TIMEOUT_MS for each lock; False when a lock
    was not had (tried again at the next pass)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
            # Deferred foreign-key checks of rows written earlier in this transaction (a caller's)
            # would stop the DROP of their table: they are made now.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            for sql, params in statements:
                cursor.execute(sql, params)
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        logger.warning("retention: a lock was not had in %d ms: %s", LOCK_TIMEOUT_MS, exc)
        return False
    return True


def partitions_ensure(*, now: datetime) -> list[str]:
    """Make the partitions of today's block and the next AHEAD_DAYS days' where missing.

    CREATE TABLE then ATTACH PARTITION, not CREATE TABLE ... PARTITION OF: attaching takes the
    parent's lock in a mode ingest's inserts do not wait for (SHARE UPDATE EXCLUSIVE); the empty
    table gets the parent's indexes and foreign keys as it is attached.
    """
    created = []
    today = _day(now)
    for model in PARTITIONED:
        table = model._meta.db_table
        existing = partitions_of(table)
        for offset in range(AHEAD_DAYS + 1):
            day = today + timedelta(days=offset)
            lo = day_block(day)
            if any(p.overlaps(lo, lo + BLOCK) for p in existing):
                continue
            name = f"{table}_d{day:%Y%m%d}"
            done = _ddl(
                [
                    (
                        f"CREATE TABLE {_q(name)} (LIKE {_q(table)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                        "INCLUDING STORAGE INCLUDING COMPRESSION)",
                        [],
                    ),
                    (
                        f"ALTER TABLE {_q(table)} ATTACH PARTITION {_q(name)} FOR VALUES FROM ({lo}) TO ({lo + BLOCK})",
                        [],
                    ),
                ]
            )
            if done:
                created.append(name)
    return created


def run_ids_advance(*, now: datetime) -> int | None:
    """Move the run id sequence to today's block, once today's partitions exist; the block's first
    id when it moved."""
    start = day_block(_day(now))
    for model in PARTITIONED:
        if not any(p.holds(start) for p in partitions_of(model._meta.db_table)):
            return None
    sequence = _run_sequence()
    with connection.cursor() as cursor:
        # Only forward: ids handed out meanwhile are below the block (an older day's).
        cursor.execute(
            f"SELECT setval(%s, %s) FROM {sequence} WHERE last_value < %s", [sequence, start, start]
        )
        return start if cursor.fetchone() else None


_RUNS = (
    f"{Run._meta.db_table} r JOIN {Tenant._meta.db_table} t ON t.id = r.tenant_id "
    f"LEFT JOIN {RunCursor._meta.db_table} c ON c.run_id = r.id"
)
# A run is done with its rows at its tenant's cutoff (the module docstring).
_CUTOFF = "%(now)s - make_interval(days => COALESCE(t.retention_days, %(days)s))"
_DONE = (
    f"(r.created_at < {_CUTOFF} AND (r.status NOT IN ('running', 'waiting') OR r.last_event_at IS NULL "
    f"OR r.last_event_at < {_CUTOFF}) AND COALESCE(c.position, 0) >= r.events_count)"
)


def _same_bounds(table: str, like: Partition) -> Partition | None:
    for p in partitions_of(table):
        if (p.lo, p.hi, p.default) == (like.lo, like.hi, like.default):
            return p
    return None


def _runs_in(part: Partition) -> tuple[str, dict[str, int | None]]:
    """A condition on r.id: the runs whose rows the partition may hold."""
    if part.lo is None:
        return "r.id < %(hi)s", {"hi": part.hi}
    return "r.id >= %(lo)s AND r.id < %(hi)s", {"lo": part.lo, "hi": part.hi}


def partitions_drop(*, now: datetime, report: RetentionReport) -> None:
    """Drop the partitions whose day is older than the longest retention; the rows of their runs
    that are not done move to the default partition first, in the same transaction."""
    cutoff_block = day_block(_day(now - timedelta(days=retention_max())))
    current = _run_ids_last()
    events = Event._meta.db_table
    for part in partitions_of(events):
        if part.default or part.hi is None or part.hi > cutoff_block:
            continue
        if (part.lo is None or part.lo <= current) and current < part.hi:
            report.kept[part.name] = "new runs take their ids from it"
            continue
        where, params = _runs_in(part)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT r.id, r.events_count FROM {_RUNS} WHERE {where} AND NOT {_DONE}",
                {**params, "now": now, "days": settings.LOOPWATCH_RETENTION_DAYS},
            )
            needed = cursor.fetchall()
        held = sum(n for _, n in needed)
        if held > MOVE_LIMIT:
            report.kept[part.name] = (
                f"{len(needed)} runs not done (open and active, or behind in detection) hold {held} "
                f"events, more than the {MOVE_LIMIT} a drop moves"
            )
            continue
        keep = [pk for pk, _ in needed]
        statements: list[tuple[str, list]] = []
        for model in PARTITIONED:
            table = model._meta.db_table
            same = _same_bounds(table, part)
            if same is None:
                continue
            statements.append((f"ALTER TABLE {_q(table)} DETACH PARTITION {_q(same.name)}", []))
            if keep:
                statements.append(
                    (f"INSERT INTO {_q(table)} SELECT * FROM {_q(same.name)} WHERE run_id = ANY(%s)", [keep])
                )
            statements.append((f"DROP TABLE {_q(same.name)}", []))
        lo_hi = (
            ("run_id < %s", [part.hi])
            if part.lo is None
            else ("run_id >= %s AND run_id < %s", [part.lo, part.hi])
        )
        statements.append(
            (
                f"DELETE FROM {_q(PendingResult._meta.db_table)} WHERE {lo_hi[0]} AND NOT run_id = ANY(%s)",
                [*lo_hi[1], keep],
            )
        )
        statements.append(
            (f"DELETE FROM {_q(RetentionPurge._meta.db_table)} WHERE partition = %s", [part.name])
        )
        if _ddl(statements):
            report.dropped.append(part.name)
            report.moved_runs += len(keep)
        else:
            report.kept[part.name] = f"its tables' lock was not had in {LOCK_TIMEOUT_MS} ms"


def _rows_delete(tables: list[str], run_pks: list[int]) -> int:
    """Delete the rows of these runs from these tables (events first); the event rows deleted."""
    deleted = 0
    with connection.cursor() as cursor:
        for start in range(0, len(run_pks), RUN_BATCH):
            chunk = run_pks[start : start + RUN_BATCH]
            for i, table in enumerate(tables):
                cursor.execute(f"DELETE FROM {_q(table)} WHERE run_id = ANY(%s)", [chunk])
                if i == 0:
                    deleted += cursor.rowcount
            cursor.execute(f"DELETE FROM {_q(PendingResult._meta.db_table)} WHERE run_id = ANY(%s)", [chunk])
    return deleted


def tenants_purge(*, now: datetime, report: RetentionReport) -> None:
    """Delete, partition by partition, the rows of the done runs of the tenants that keep their
    events for less than the longest retention; record a partition gone through for a tenant once
    none of its runs there is left, and for all of them once every such tenant is."""
    longest = retention_max()
    short = {t.pk: t for t in Tenant.objects.all() if retention_days(t) < longest}
    if not short:
        return
    newest_block = day_block(_day(now - timedelta(days=min(retention_days(t) for t in short.values()))))
    oldest_block = day_block(_day(now - timedelta(days=max(retention_days(t) for t in short.values()))))
    for part in partitions_of(Event._meta.db_table):
        if part.default or part.hi is None or part.hi > newest_block:
            continue
        recorded = set(RetentionPurge.objects.filter(partition=part.name).values_list("tenant_id", flat=True))
        if None in recorded:
            continue
        where, params = _runs_in(part)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT r.tenant_id, r.id, {_DONE} FROM {_RUNS} WHERE {where} AND r.tenant_id = ANY(%(tenants)s)",
                {
                    **params,
                    "now": now,
                    "days": settings.LOOPWATCH_RETENTION_DAYS,
                    "tenants": [pk for pk in short if pk not in recorded],
                },
            )
            rows = cursor.fetchall()
        done: dict[int, list[int]] = {}
        waiting: set[int] = set()
        for tenant_pk, run_pk, is_done in rows:
            if is_done:
                done.setdefault(tenant_pk, []).append(run_pk)
            else:
                waiting.add(tenant_pk)
        tables = [
            same.name
            for model in PARTITIONED
            if (same := _same_bounds(model._meta.db_table, part)) is not None
        ]
        for tenant_pk, run_pks in done.items():
            with transaction.atomic():
                deleted = _rows_delete(tables, run_pks)
                tenant = short[tenant_pk]
                if tenant_pk not in waiting and part.hi <= day_block(
                    _day(now - timedelta(days=retention_days(tenant)))
                ):
                    RetentionPurge.objects.get_or_create(
                        tenant=tenant, partition=part.name, defaults={"events": deleted}
                    )
            if deleted:
                report.events_deleted[tenant.slug] = report.events_deleted.get(tenant.slug, 0) + deleted
        if not waiting and part.hi <= oldest_block:
            RetentionPurge.objects.get_or_create(tenant=None, partition=part.name)


def default_purge(*, now: datetime, report: RetentionReport) -> None:
    """Delete from the default partitions the rows of runs now done (the runs a drop moved there,
    and the new events of runs whose partition was gone)."""
    tables = []
    for model in PARTITIONED:
        default = next((p for p in partitions_of(model._meta.db_table) if p.default), None)
        if default:
            tables.append(default.name)
    if not tables:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT r.id, r.tenant_id FROM {_RUNS} WHERE r.id IN (SELECT DISTINCT run_id FROM {_q(tables[0])} "
            f"UNION SELECT DISTINCT run_id FROM {_q(tables[-1])}) AND {_DONE}",
            {"now": now, "days": settings.LOOPWATCH_RETENTION_DAYS},
        )
        rows = cursor.fetchall()
    if not rows:
        return
    slugs = dict(Tenant.objects.filter(pk__in={t for _, t in rows}).values_list("pk", "slug"))
    by_tenant: dict[int, list[int]] = {}
    for run_pk, tenant_pk in rows:
        by_tenant.setdefault(tenant_pk, []).append(run_pk)
    for tenant_pk, run_pks in by_tenant.items():
        with transaction.atomic():
            deleted = _rows_delete(tables, run_pks)
        slug = slugs[tenant_pk]
        report.events_deleted[slug] = report.events_deleted.get(slug, 0) + deleted


# --- SQLite: plain tables ------------------------------------------------------------------------


def _done(cutoff: datetime) -> Q:
    """Runs done with their rows at this cutoff (the ORM's form of _DONE)."""
    quiet = ~Q(status__in=OPEN) | Q(last_event_at__isnull=True) | Q(last_event_at__lt=cutoff)
    processed = Q(cursor__isnull=True) | Q(cursor__position__gte=F("events_count"))
    return Q(created_at__lt=cutoff) & quiet & processed


def events_purge(*, now: datetime, report: RetentionReport) -> None:
    """Delete the events, rounds, calls and pending results of done runs, tenant by tenant, by run."""
    tables = [model._meta.db_table for model in PARTITIONED]
    for tenant in Tenant.objects.all():
        cutoff = now - timedelta(days=retention_days(tenant))
        has_events = Exists(Event.objects.filter(run_id=OuterRef("pk")))
        while True:
            run_pks = list(
                Run.objects.filter(_done(cutoff), has_events, tenant=tenant).values_list("pk", flat=True)[
                    :RUN_BATCH
                ]
            )
            if not run_pks:
                break
            with transaction.atomic():
                deleted = _rows_delete(tables, run_pks)
            report.events_deleted[tenant.slug] = report.events_deleted.get(tenant.slug, 0) + deleted


# --- both: runs past their own retention -------------------------------------------------------------


def runs_purge(*, now: datetime, budget_s: float = RUNS_PURGE_BUDGET_S) -> int:
    """Delete the runs done at LOOPWATCH_RUN_RETENTION_DAYS (or their tenant's event retention, when
    longer), with their cursor, detections and whatever rows of theirs are left; operations keep
    their history (run set to NULL). At most budget_s of work: the rest at the next pass."""
    deadline = time.monotonic() + budget_s
    deleted = 0
    for tenant in Tenant.objects.all():
        days = max(settings.LOOPWATCH_RUN_RETENTION_DAYS, retention_days(tenant))
        cutoff = now - timedelta(days=days)
        runs = Run.objects.filter(_done(cutoff), tenant=tenant)
        if connection.vendor == "postgresql":
            # Run ids of later days are in later blocks: the primary key bounds the scan.
            runs = runs.filter(pk__lt=day_block(_day(cutoff)) + BLOCK)
        while time.monotonic() < deadline:
            run_pks = list(runs.values_list("pk", flat=True)[:RUN_BATCH])
            if not run_pks:
                break
            with transaction.atomic():
                Run.objects.filter(pk__in=run_pks).delete()
            deleted += len(run_pks)
    return deleted
