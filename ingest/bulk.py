"""Set-based writes of model rows that the ORM offers only at a high CPU cost, and several
statements sent in one round trip."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import orjson
import psycopg
from django.db import connection, models
from django.db.models.expressions import RawSQL

_PORTABLE: ContextVar[bool] = ContextVar("portable_writes", default=False)

# A tenant's pk, as a parameter, in a statement that finds the tenant's runs by run_id (or its rows
# by another key). As the value of a subquery, the planner estimates it as an average tenant's share
# of the rows: given as a constant, it was estimated from statistics that may count none of the
# tenant's rows (a tenant new since the last ANALYZE), and PostgreSQL read every run of the tenant
# through an index on tenant_id for each lookup, where the unique (tenant_id, run_id) index finds
# the one (tests: test_tenant_plans). CAST, not ::, for SQLite too.
TENANT_PK = "(SELECT CAST(%s AS bigint))"


def of_tenant(tenant: Any) -> models.Q:
    """TENANT_PK for the ORM: Run.objects.filter(of_tenant(tenant), run_id=...). `tenant`: a Tenant
    or its pk."""
    return models.Q(tenant_id=RawSQL(TENANT_PK, (getattr(tenant, "pk", tenant),)))


def postgres_statements() -> bool:
    """Whether the writes (and the reads that lock for them) that PostgreSQL does with statements
    of its own take those (on PostgreSQL) rather than the portable ORM path (SQLite, or inside
    portable_writes()): the one switch of rows_update, the pipeline's pass (read, materialise,
    progress) and the ledger's one-statement claim and completion."""
    return connection.vendor == "postgresql" and not _PORTABLE.get()


@contextmanager
def portable_writes() -> Iterator[None]:
    """The portable ORM path on PostgreSQL too: the parity tests run both paths on PostgreSQL over
    the same input and compare the rows (tests/ingest/test_storage_parity.py)."""
    token = _PORTABLE.set(True)
    try:
        yield
    finally:
        _PORTABLE.reset(token)


def concrete_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    """One of the model's fields that has a column (a relation's reverse side or a generic key has
    none: naming one in a hand-written statement is a programming error)."""
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.column:
        raise LookupError(f"{model.__name__}.{name}: not a field with a column")
    return field


def db_column(field: models.Field[Any, Any]) -> str:
    """The column of a concrete field (the stubs allow None, for fields that have no column)."""
    if not field.column:
        raise LookupError(f"{field}: not a field with a column")
    return field.column


def pk_column(model: type[models.Model]) -> str:
    return db_column(model._meta.pk)


def rows_update(model: type[models.Model], rows: Sequence[models.Model], names: Sequence[str]) -> None:
    """Write these fields of these rows (by pk) with one statement.

    On PostgreSQL an UPDATE ... FROM jsonb_populate_recordset() of the values as one JSON array,
    read as rows of the table itself (every column its own type). Not bulk_update(): its CASE ...
    WHEN per field and row cost Django ~40 ms of CPU for 40 tool calls, more than the rest of a
    detection pass. Elsewhere bulk_update(). The values go as orjson writes them (_values).
    """
    if not rows:
        return
    if not postgres_statements():
        model._default_manager.bulk_update(rows, list(names))
        return
    statements_run([update_statement(model, rows, names)])


def update_statement(
    model: type[models.Model], rows: Sequence[models.Model], names: Sequence[str]
) -> Statement:
    """rows_update's statement on PostgreSQL (for statements_run); None when there are no rows."""
    if not rows:
        return None
    fields = [model._meta.pk, *(concrete_field(model, name) for name in names)]
    return _update_sql(model, tuple(names)), [_values(rows, fields, add=False)]


def insert_statement(
    model: type[models.Model], rows: Sequence[models.Model], *, ignore_conflicts: bool = False
) -> Statement:
    """INSERT these new rows with one statement (their pks are not read back), for statements_run;
    None when there are no rows. PostgreSQL only: an INSERT ... SELECT from jsonb_populate_recordset()
    of the rows as one JSON array (bulk_create() prepared every field of every row in Python, a third
    of a detection pass's CPU)."""
    if not rows:
        return None
    return _insert_sql(model, ignore_conflicts), [_values(rows, _insert_fields(model), add=True)]


Statement = tuple[str, Sequence[Any]] | None  # (sql, params); None: nothing to run


def statements_run(statements: Sequence[Statement]) -> list[list[tuple] | None]:
    """Run the statements in order and return each one's rows (None for one without rows, or left
    out as None), in one round trip to PostgreSQL.

    With client-side binding (Django's default with psycopg 3) psycopg sends the statements, their
    parameters merged in, as one simple query, and reads the results one after the other: a
    detection pass went from 19 round trips to 9, and a round trip cost ~1 ms on the busy 2-core
    machine. With server-side binding, or elsewhere, one execute per statement.
    """
    todo = [(i, statement) for i, statement in enumerate(statements) if statement is not None]
    results: list[list[tuple] | None] = [None] * len(statements)
    if not todo:
        return results
    with connection.cursor() as cursor:
        if len(todo) == 1 or not isinstance(cursor.cursor, psycopg.ClientCursor):
            for i, (sql, params) in todo:
                cursor.execute(sql, params)
                results[i] = cursor.fetchall() if cursor.description else None
            return results
        cursor.execute(
            ";\n".join(sql for _, (sql, _) in todo), [p for _, (_, params) in todo for p in params]
        )
        for n, (i, _) in enumerate(todo):
            if n:
                cursor.nextset()
            results[i] = cursor.fetchall() if cursor.description else None
    return results


def _values(rows: Sequence[models.Model], fields: Sequence[models.Field], *, add: bool) -> str:
    """The rows as one JSON array of {column: value}, values as the fields would save them
    (pre_save: auto_now and auto_now_add), written by orjson: datetimes as ISO 8601, JSON fields as
    JSON (None as SQL NULL, as the JSONField stores it)."""
    data = []
    for row in rows:
        data.append({f.column: f.pre_save(row, add) for f in fields})
    return dumps_bounded(data).decode()


def dumps_bounded(value: Any) -> bytes:
    """orjson.dumps, and when it refuses an integer past 64 bits (a JSON value of a row: evidence, a
    state), the same with each such integer written as a float: one odd value must not fail the
    statement of a whole detection pass. Non-finite floats are written as null, as orjson does."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return orjson.dumps(_within_64_bits(value))


def _within_64_bits(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else float(value)
    if isinstance(value, dict):
        return {key: _within_64_bits(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_within_64_bits(item) for item in value]
    return value


@functools.cache
def _insert_fields(model: type[models.Model]) -> tuple[models.Field, ...]:
    return tuple(f for f in model._meta.concrete_fields if f is not model._meta.auto_field)


@functools.cache
def _insert_sql(model: type[models.Model], ignore_conflicts: bool) -> str:
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    columns = ", ".join(quote(db_column(f)) for f in _insert_fields(model))
    sql = f"INSERT INTO {table} ({columns}) SELECT {columns} FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb)"
    return sql + " ON CONFLICT DO NOTHING" if ignore_conflicts else sql


@functools.cache
def _update_sql(model: type[models.Model], names: tuple[str, ...]) -> str:
    quote = connection.ops.quote_name
    table, pk = quote(model._meta.db_table), quote(pk_column(model))
    columns = [quote(db_column(concrete_field(model, name))) for name in names]
    assignments = ", ".join(f"{name} = v.{name}" for name in columns)
    return (
        f"UPDATE {table} AS t SET {assignments} "
        f"FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb) AS v WHERE t.{pk} = v.{pk}"
    )
