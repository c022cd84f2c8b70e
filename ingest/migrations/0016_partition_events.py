"""PostgreSQL: events, model rounds and tool calls become tables partitioned by range of run id.

A day's runs take their ids from a block of their own (ingest.retention: the run id sequence is
moved to the day's block when the day starts), so a partition holds every row of the runs of one
day: a run is never split between partitions, and the unique (run, seq) and (run, event_id) hold
across them (the partition key, run_id, is in both). Retention drops a partition whole.

Converted in place, for a database that holds rows already: a partitioned copy of each table is
made with the old table's columns, the rows are moved into it (all of them into the partition of
the runs from before this migration, `<table>_before`; `<table>_default` holds the rows of runs
whose partition retention dropped), the old table is dropped and the copy takes
its name, indexes and constraints (the primary key becomes (id, run_id): a partitioned table's
unique keys must hold the partition key). The whole of it is one transaction, with the tables
locked: a large table takes its copy's time (docs/retention.md gives figures).

The partitions of today's and tomorrow's blocks are made here; the beat task (ingest.retention_apply)
makes the next ones and moves the sequence. SQLite keeps plain tables.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from django.db import migrations

TABLES = ("ingest_event", "ingest_modelround", "ingest_toolcall")
# Frozen here (ingest.retention holds the live ones): a migration must not change with the code.
BLOCK = 2**32
EPOCH = date(1970, 1, 1)


def _block(day: date) -> int:
    return (day - EPOCH).days * BLOCK


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _convert(cursor, table: str, before: int, days: list[date]) -> None:
    cursor.execute(
        "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass "
        "ORDER BY contype = 'f', conname",
        [table],
    )
    constraints = cursor.fetchall()
    owned = {name for name, _, _ in constraints}
    cursor.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s",
        [table],
    )
    indexes = [(name, sql) for name, sql in cursor.fetchall() if name not in owned]
    new = f"{table}_partitioned"
    cursor.execute(
        f"CREATE TABLE {_q(new)} (LIKE {_q(table)} INCLUDING ALL EXCLUDING INDEXES EXCLUDING CONSTRAINTS) "
        "PARTITION BY RANGE (run_id)"
    )
    cursor.execute(
        f"CREATE TABLE {_q(table + '_before')} PARTITION OF {_q(new)} FOR VALUES FROM (MINVALUE) TO ({before})"
    )
    # Rows of runs whose own partition is gone (ingest.retention).
    cursor.execute(f"CREATE TABLE {_q(table + '_default')} PARTITION OF {_q(new)} DEFAULT")
    for day in days:
        lo = _block(day)
        cursor.execute(
            f"CREATE TABLE {_q(f'{table}_d{day:%Y%m%d}')} PARTITION OF {_q(new)} "
            f"FOR VALUES FROM ({lo}) TO ({lo + BLOCK})"
        )
    cursor.execute(f"INSERT INTO {_q(new)} SELECT * FROM {_q(table)}")
    cursor.execute(f"DROP TABLE {_q(table)}")
    cursor.execute(f"ALTER TABLE {_q(new)} RENAME TO {_q(table)}")
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    (sequence,) = cursor.fetchone()
    cursor.execute(f"ALTER SEQUENCE {sequence} RENAME TO {_q(table + '_id_seq')}")
    cursor.execute(
        f"SELECT setval(pg_get_serial_sequence(%s, 'id'), COALESCE(max(id), 0) + 1, false) FROM {_q(table)}",
        [table],
    )
    for name, kind, definition in constraints:
        if kind == "p":
            definition = "PRIMARY KEY (id, run_id)"
        cursor.execute(f"ALTER TABLE {_q(table)} ADD CONSTRAINT {_q(name)} {definition}")
    for _name, sql in indexes:
        cursor.execute(sql)
    cursor.execute(f"ANALYZE {_q(table)}")


def forward(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    today = datetime.now(UTC).date()
    days = [today, date.fromordinal(today.toordinal() + 1)]
    with schema_editor.connection.cursor() as cursor:
        for table in TABLES:
            _convert(cursor, table, _block(today), days)
        # From now on today's runs take ids in today's block (forward only: rows of runs with ids past
        # it, if any, went to the partition that holds them).
        cursor.execute("SELECT pg_get_serial_sequence('ingest_run', 'id')")
        (sequence,) = cursor.fetchone()
        cursor.execute(f"SELECT setval(%s, GREATEST(last_value, %s)) FROM {sequence}", [sequence, _block(today)])


def backward(apps, schema_editor) -> None:
    """Plain tables again: the rows are copied into an unpartitioned table (the run ids stay)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(
                "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = %s::regclass ORDER BY contype = 'f', conname",
                [table],
            )
            constraints = cursor.fetchall()
            owned = {name for name, _, _ in constraints}
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s",
                [table],
            )
            indexes = [(name, sql) for name, sql in cursor.fetchall() if name not in owned]
            plain = f"{table}_plain"
            cursor.execute(
                f"CREATE TABLE {_q(plain)} (LIKE {_q(table)} INCLUDING ALL EXCLUDING INDEXES EXCLUDING CONSTRAINTS)"
            )
            cursor.execute(f"INSERT INTO {_q(plain)} SELECT * FROM {_q(table)}")
            cursor.execute(f"DROP TABLE {_q(table)}")  # and its partitions
            cursor.execute(f"ALTER TABLE {_q(plain)} RENAME TO {_q(table)}")
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
            (sequence,) = cursor.fetchone()
            cursor.execute(f"ALTER SEQUENCE {sequence} RENAME TO {_q(table + '_id_seq')}")
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence(%s, 'id'), COALESCE(max(id), 0) + 1, false) "
                f"FROM {_q(table)}",
                [table],
            )
            for name, kind, definition in constraints:
                if kind == "p":
                    definition = "PRIMARY KEY (id)"
                cursor.execute(f"ALTER TABLE {_q(table)} ADD CONSTRAINT {_q(name)} {definition}")
            for _name, sql in indexes:
                cursor.execute(sql.replace(" ON ONLY ", " ON ", 1))
        cursor.execute("DELETE FROM ingest_retentionpurge")


class Migration(migrations.Migration):
    dependencies = [("ingest", "0015_tenant_retention")]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
