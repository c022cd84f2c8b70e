"""Migration 0014 converts tables that hold rows: partitioned copies, rows moved, names swapped; and
back. On the suite's PostgreSQL, migrating its test database back and forth."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from ingest.models import Event, ModelRound, Run, Tenant, ToolCall
from ingest.retention import BLOCK, day_block

pytestmark = pytest.mark.django_db(transaction=True)
TABLES = ("ingest_event", "ingest_modelround", "ingest_toolcall")
BEFORE, PARTITIONED = ("ingest", "0015_tenant_retention"), ("ingest", "0016_partition_events")


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


def _partitioned() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT partrelid::regclass::text FROM pg_partitioned_table")
        return {row[0] for row in cursor.fetchall()}


def _rows() -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, run_id, seq, event_id, body::text FROM ingest_event ORDER BY id")
        events = cursor.fetchall()
        cursor.execute("SELECT id, run_id, seq, round FROM ingest_modelround ORDER BY id")
        rounds = cursor.fetchall()
        cursor.execute("SELECT id, run_id, seq, call_id, result::text FROM ingest_toolcall ORDER BY id")
        calls = cursor.fetchall()
    return [events, rounds, calls]


def _fill() -> list[Run]:
    """Rows as a database from before the partitions holds them: run ids from 1."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('ingest_run', 'id'), 1, false)")
    tenant = Tenant.objects.create(slug="acme")
    ts = datetime(2026, 11, 1, tzinfo=UTC)
    runs = []
    for r in range(3):
        run = Run.objects.create(tenant=tenant, run_id=f"r{r}", events_count=4)
        with connection.cursor() as cursor:  # the columns of 0015's cursors (the model has more now)
            cursor.execute(
                "INSERT INTO ingest_runcursor (run_id, position, processed, updated_at, failures, error) "
                "VALUES (%s, 4, 0, now(), 0, '')",
                [run.pk],
            )
        for seq in range(1, 5):
            Event.objects.create(
                tenant=tenant, run=run, seq=seq, event_id=f"e{seq}", type="tool_call", ts=ts, body={"n": seq}
            )
        ModelRound.objects.create(run=run, seq=1, round=1, ts=ts)
        ToolCall.objects.create(run=run, seq=2, round=1, call_id="c1", tool="t", ts=ts, result={"ok": r})
        runs.append(run)
    return runs


def test_the_migration_partitions_tables_that_hold_rows_and_back(needs_postgres):
    try:
        _migrate(BEFORE)
        assert not _partitioned() & set(TABLES)
        runs = _fill()
        rows = _rows()

        _migrate(PARTITIONED)
        assert set(TABLES) <= _partitioned()
        assert _rows() == rows  # every row, with its id
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM ingest_event_before")
            assert cursor.fetchone()[0] == 12
            cursor.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ingest_event_pkey'"
            )
            assert cursor.fetchone()[0] == "PRIMARY KEY (id, run_id)"
        # The dedupe still holds, new rows get new ids, and today's runs take today's block.
        with pytest.raises(IntegrityError), transaction.atomic():
            Event.objects.create(
                tenant_id=runs[0].tenant_id,
                run=runs[0],
                seq=9,
                event_id="e1",
                type="x",
                ts=datetime.now(UTC),
                body={},
            )
        with pytest.raises(IntegrityError), transaction.atomic():
            ModelRound.objects.create(run=runs[0], seq=1, round=2, ts=datetime.now(UTC))
        event = Event.objects.create(
            tenant_id=runs[0].tenant_id,
            run=runs[0],
            seq=5,
            event_id="e5",
            type="x",
            ts=datetime.now(UTC),
            body={},
        )
        assert event.pk > max(row[0] for row in rows[0])
        fresh = Run.objects.create(tenant_id=runs[0].tenant_id, run_id="r-new")
        today = day_block(datetime.now(UTC).date())
        assert today <= fresh.pk < today + BLOCK
        Event.objects.create(
            tenant_id=runs[0].tenant_id,
            run=fresh,
            seq=1,
            event_id="e1",
            type="x",
            ts=datetime.now(UTC),
            body={},
        )

        _migrate(BEFORE)  # and back: plain tables with the same rows
        assert not _partitioned() & set(TABLES)
        assert Event.objects.count() == 14 and ModelRound.objects.count() == 3 == ToolCall.objects.count()
    finally:
        # Back to the newest migrations, not just this one: the tests after this one run on them.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        assert set(TABLES) <= _partitioned()
