"""PostgreSQL's own statements for the services' fast paths (SQLite takes the ORM path beside each),
and the row layouts they read and write."""

from __future__ import annotations

import functools
import struct
from datetime import UTC, datetime, timedelta

import orjson
from django.db import connection, models

from ingest.bulk import TENANT_PK, db_column
from ingest.detection.bounds import MAX_TOTAL_USD
from ingest.models import (
    Backend,
    Detection,
    Event,
    ModelPrice,
    PendingResult,
    Run,
    RunCursor,
)
from ingest.pricing import PriceBook

# What only run_started (agent ... labels) and run_finished (status ... finished_at) set: ingest
# writes them, for the runs whose batch holds such an event (_describe_sql).
STARTED_FIGURES = ("agent", "task_type", "backend", "model", "budgets", "labels")
FINISHED_FIGURES = ("status", "terminated_by", "budget_type", "reason", "finished_at")
DESCRIBED = (*STARTED_FIGURES, *FINISHED_FIGURES, "started_at")
# What the detection pass counts, each event once (RunCursor.figures_seq; _PROGRESS_SQL).
COUNTED_FIGURES = (
    "rounds",
    "tool_calls",
    "tool_errors",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "started_at",
    "last_event_at",
)
# Every figure of a run that its events make: ingest's (the count, the description) and the pass's.
RUN_FIGURES = (*STARTED_FIGURES, *FINISHED_FIGURES, *COUNTED_FIGURES, "events_count", "unverified_from_seq")


def _insert_missing_sql(model: type[models.Model], template: models.Model, key: str, values: list) -> tuple:
    """INSERT ... ON CONFLICT DO NOTHING of one row per value of `key`, the other columns as in
    template, as one statement over unnest() (PostgreSQL): (sql, params)."""
    key_field = next(f for f in model._meta.concrete_fields if f.attname == key)
    fields = [
        f for f in model._meta.concrete_fields if f is not key_field and f is not model._meta.auto_field
    ]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(db_column(f)) for f in [*fields, key_field])
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "
        f"SELECT {'%s, ' * len(fields)}k FROM unnest(%s::{key_field.db_type(connection)}[]) AS u(k) "
        "ON CONFLICT DO NOTHING"
    )
    return sql, [*insert_defaults(template, fields), values]


def insert_defaults(template: models.Model, fields) -> list:
    """The values an INSERT of `template` gives these fields (their defaults, auto_now's time), as
    the database takes them."""
    return [f.get_db_prep_save(f.pre_save(template, add=True), connection) for f in fields]


@functools.cache
def _take_sql() -> tuple[str, str, str, str]:
    """The statements that hold a batch's runs (ingestion._runs_take):

    - insert: the runs among these ids (a JSON array) that are not stored, RETURNING (id, run_id);
    - find: the (run_id, id) of runs of the tenant by their ids (a text[] literal);
    - lock: the runs of these pks (a bigint[] literal) in pk order: (run_id, id, events_count,
      tenant_id);
    - number: the same lock, and in the same statement each run's events_count raised by the
      number of events the batch adds to it (pks and counts as two arrays, then whether the sender
      lacks the ledger scope): (run_id, id, events_count before, tenant_id). A run that had no
      event gets its detection cursor. The batch's first seq of a run is its count before + 1.

    None of them leaves the planner a choice that statistics can get wrong. The insert finds a run
    that exists by its ON CONFLICT arbiter, the (tenant_id, run_id) unique index, and the lock goes by
    the primary key alone. A query by tenant_id and run_id, by contrast, was planned from the tenant's
    share of the runs: statistics taken when the tenant had few runs (a new tenant, a table just
    emptied) made every index on tenant_id look as good as the unique one, and the planner compared
    each id with every run of the tenant: 0.3 s to lock a batch of 1,000 runs, 3 ms by pk. `find`
    needs the tenant: it gives it as TENANT_PK, which leaves the unique index the planner's choice.
    """
    quote = connection.ops.quote_name
    table = quote(Run._meta.db_table)
    columns = ", ".join(quote(db_column(f)) for f in _take_fields())
    # The ids go as one JSON array (orjson writes it in microseconds; psycopg quoted an array
    # parameter element by element). WITH ORDINALITY ... ORDER BY: the rows go in in the order
    # given (sorted), whatever the plan, so two batches creating the same runs wait, not deadlock.
    # An id already stored spends a sequence value, and no heap write: the arbiter index is checked
    # before the row is inserted.
    insert = (
        f"INSERT INTO {table} ({columns}, run_id) SELECT {'%s, ' * len(_take_fields())}u.k "
        "FROM json_array_elements_text(%s::json) WITH ORDINALITY AS u(k, n) "
        "ORDER BY u.n ON CONFLICT (tenant_id, run_id) DO NOTHING RETURNING id, run_id"
    )
    find = f"SELECT run_id, id FROM {table} WHERE tenant_id = {TENANT_PK} AND run_id = ANY(%s::text[])"
    # By pk alone (see above; tests: test_tenant_plans): the caller checks each row's tenant.
    lock = (
        f"SELECT run_id, id, events_count, tenant_id FROM {table} "
        "WHERE id = ANY(%s::bigint[]) ORDER BY id FOR NO KEY UPDATE"
    )
    # The lock first, in pk order, in a WITH of its own: the UPDATE's join alone would lock the rows
    # in whatever order its plan reads them. Nothing else of the run is written: its other figures
    # are counted by the detection pass (the merge of twenty columns per run cost a batch of 1,000
    # runs 12 ms, most of what its COPY of 1,000 events costs; docs/performance.md).
    cursor_fields = _cursor_fields()
    cursor_columns = ", ".join(quote(db_column(f)) for f in cursor_fields)
    number = (
        f"WITH locked AS (SELECT id FROM {table} WHERE id = ANY(%s::bigint[]) ORDER BY id FOR NO KEY UPDATE), "
        f"numbered AS (UPDATE {table} AS r SET events_count = r.events_count + v.k, "
        "unverified_from_seq = CASE WHEN %s AND v.k > 0 THEN COALESCE(r.unverified_from_seq, r.events_count + 1) "
        "ELSE r.unverified_from_seq END "
        "FROM unnest(%s::bigint[], %s::integer[]) AS v(id, k) "
        "WHERE r.id = v.id AND r.id IN (SELECT id FROM locked) "
        "RETURNING r.run_id, r.id, r.events_count - v.k AS before, r.tenant_id), "
        f"cursors AS (INSERT INTO {quote(RunCursor._meta.db_table)} ({cursor_columns}, run_id) "
        f"SELECT {'%s, ' * len(cursor_fields)}id FROM numbered WHERE before = 0 ON CONFLICT DO NOTHING) "
        "SELECT run_id, id, before, tenant_id FROM numbered ORDER BY id"
    )
    return insert, find, lock, number


@functools.cache
def _cursor_fields() -> tuple[models.Field, ...]:
    """The columns a new detection cursor is inserted with (their defaults), beside its run_id."""
    return tuple(
        f
        for f in RunCursor._meta.concrete_fields
        if f.attname != "run_id" and f is not RunCursor._meta.auto_field
    )


def json_array(values: list) -> str:
    """PostgreSQL's text form of an array of numbers, NULLs (None), timestamps (aware datetimes) or
    plain strings, written by orjson: JSON's text of such a list is the array's, brackets aside
    (JSON escapes `"` and `\\` as the array form does; a string with a control character would
    not be read back as it was: not for text from events)."""
    return "{" + orjson.dumps(values).decode()[1:-1] + "}"


def text_array(values) -> str:
    """PostgreSQL's text form of an array of strings, each quoted: '{"a","b \\"c\\""}'."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


@functools.cache
def _take_fields() -> tuple[models.Field, ...]:
    """The columns a new run is inserted with (their defaults), beside its run_id."""
    return tuple(
        f for f in Run._meta.concrete_fields if f.attname != "run_id" and f is not Run._meta.auto_field
    )


@functools.cache
def _describe_sql() -> str:
    """The UPDATE that writes what a batch's run_started and run_finished describe, for the few runs
    whose batch holds one: a JSON object per run, a field left out keeps its stored value;
    started_at is the earliest run_started's ts (the detection pass keeps the earliest event's)."""
    quote = connection.ops.quote_name
    types = {f.attname: f.db_type(connection) for f in Run._meta.concrete_fields}
    merge = {name: "COALESCE(d.{0}, r.{0})" for name in DESCRIBED}
    merge["started_at"] = "LEAST(r.{0}, d.{0})"  # NULLs are ignored
    assignments = ", ".join(f"{quote(name)} = " + merge[name].format(quote(name)) for name in DESCRIBED)
    record = ", ".join(f"{quote(name)} {types[name]}" for name in ("id", *DESCRIBED))
    return (
        f"UPDATE {quote(Run._meta.db_table)} AS r SET {assignments} "
        f"FROM json_to_recordset(%s::json) AS d({record}) WHERE r.id = d.id"
    )


class _PriceBook(PriceBook):
    """PriceBook's prices and markups in one query on PostgreSQL (two through the ORM)."""

    SQL = (
        f"SELECT b.name, b.markup, p.model, p.input_usd_per_mtok, p.output_usd_per_mtok "
        f"FROM {Backend._meta.db_table} b LEFT JOIN {ModelPrice._meta.db_table} p "
        "ON p.backend_id = b.id WHERE b.name = ANY(%s)"
    )
    # The same for the backends of these runs (a detection pass reads it beside its runs).
    RUNS_SQL = SQL.replace("= ANY(%s)", f"IN (SELECT backend FROM {Run._meta.db_table} WHERE id = ANY(%s))")

    def __init__(self, pairs: set[tuple[str, str]] | None = None, *, rows: list[tuple] | None = None) -> None:
        self._markup = {}
        self._prices = {}
        if rows is None:
            with connection.cursor() as cursor:
                cursor.execute(self.SQL, [sorted({b for b, _ in pairs or ()})])
                rows = cursor.fetchall()
        for name, markup, model, input_price, output_price in rows:
            self._markup[name] = float(markup)
            if model is not None:
                self._prices[(name, model)] = (input_price, output_price)


RUN_FIELDS = (
    *("tenant_id", "backend", "model", "task_type", "run_id", "agent", "first_loop_seq"),
    "unverified_from_seq",
)


EVENT_COPY_SQL = "COPY ingest_event (tenant_id, run_id, seq, event_id, type, ts, body) FROM STDIN"
EVENT_COPY_BINARY_SQL = EVENT_COPY_SQL + " (FORMAT BINARY)"

# PostgreSQL's binary COPY format: a header, per row the field count then each field as its length
# (-1 for NULL) and its bytes, a trailer. The field types must be the columns' own: int8 tenant_id and
# run_id, int4 seq, text event_id and type, timestamptz ts (int8 microseconds since 2000-01-01 UTC),
# jsonb body (a version byte, 1, then the JSON text).
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_COPY_TRAILER = b"\xff\xff"
_COPY_ROW_HEAD = struct.Struct(">hiqiq").pack  # 7 fields, tenant_id, run_id
_COPY_SEQ_ID = struct.Struct(">iii").pack  # seq, then the event_id's length
_COPY_TS_BODY = struct.Struct(">iqib").pack  # ts, then the body's length and jsonb version
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_COPY_TYPES: dict[str, bytes] = {}


def _events_copy(tenant_pk: int, rows: list[tuple]) -> None:
    """The rows in one binary COPY (ingestion._events_insert says why binary)."""
    parts = [_COPY_HEADER]
    append = parts.append
    head_pk, head = None, b""  # every run's rows start with its head
    types = _COPY_TYPES
    for run_pk, seq, event_id, kind, ts, body in rows:
        if run_pk != head_pk:
            head_pk, head = run_pk, _COPY_ROW_HEAD(7, 8, tenant_pk, 8, run_pk)
        append(head)
        if event_id is None:
            append(_COPY_SEQ_ID(4, seq, -1))
        else:
            raw_id = event_id.encode()
            append(_COPY_SEQ_ID(4, seq, len(raw_id)))
            append(raw_id)
        kind_field = types.get(kind)
        if kind_field is None:
            raw_kind = kind.encode()
            kind_field = types[kind] = len(raw_kind).to_bytes(4, "big") + raw_kind
        append(kind_field)
        append(_COPY_TS_BODY(8, (ts - _PG_EPOCH) // _ONE_US, len(body) + 1, 1))
        append(body)
    append(_COPY_TRAILER)
    with connection.cursor() as cursor, cursor.copy(EVENT_COPY_BINARY_SQL) as copy:
        copy.write(b"".join(parts))


# The (run pk, event_id) pairs among these already stored. Two array parameters, not IN (...) with a
# placeholder per id: psycopg's client-side binding parsed a thousand placeholders for longer than the
# database took to answer.
_EVENTS_STORED_SQL = "SELECT run_id, event_id FROM ingest_event WHERE run_id = ANY(%s) AND event_id = ANY(%s)"
_RUNS_DROP_EMPTY_SQL = (
    f"DELETE FROM {Run._meta.db_table} WHERE id = ANY(%s) AND events_count = 0 RETURNING tenant_id, run_id"
)
# A pass waits for a lock at most this long (set_config(..., true): for its transaction only).
_LOCK_TIMEOUT_SQL = "SELECT set_config('lock_timeout', %s, true)"


# PostgreSQL: the cursors locked in pk order (the engine state, the biggest value a pass reads, is
# decoded by orjson, several times faster than the JSONField's json.loads: jsonb arrives as text),
# then each run's next events after its cursor, `limit` at most, by the (run, seq) index (the
# subquery takes the rows the first statement locked), then the runs.
# Runs quarantined and not yet due are left out (failures > 0 and retry_at after now).
_CURSORS_LOCK_SQL = (
    f"SELECT run_id, position, processed, figures_seq, engine_state FROM {RunCursor._meta.db_table} "
    "WHERE run_id = ANY(%s) AND (failures = 0 OR retry_at <= %s) ORDER BY run_id FOR UPDATE{skip}"
)
_EVENTS_AFTER_SQL = f"""
SELECT c.run_id, e.seq, e.type, e.ts, e.body
FROM (
    SELECT run_id, position FROM {RunCursor._meta.db_table}
    WHERE run_id = ANY(%s) AND (failures = 0 OR retry_at <= %s) ORDER BY run_id FOR UPDATE{{skip}}
) AS c
CROSS JOIN LATERAL (
    SELECT seq, type, ts, body FROM {Event._meta.db_table}
    WHERE run_id = c.run_id AND seq > c.position ORDER BY seq LIMIT %s
) AS e
ORDER BY c.run_id, e.seq
"""
# Columns in the model's field order, as Run.from_db() takes them.
_RUN_COLUMNS = [f.attname for f in Run._meta.concrete_fields if f.attname in ("id", *RUN_FIELDS)]
_RUNS_SQL = f"SELECT {', '.join(_RUN_COLUMNS)} FROM {Run._meta.db_table} WHERE id = ANY(%s)"


# PostgreSQL: the pass's run figures in one statement. The runs are locked in pk order
# first, as ingest locks them (FOR NO KEY UPDATE: the pass's inserts hold KEY SHARE on them, which
# that lock does not wait for), so a pass and a batch cannot deadlock. A figure absent from a run's
# row keeps its stored value; first_loop_at and terminated_by are only set once. The counted figures
# (COUNTED_FIGURES) are the pass's events not counted before (RunCursor.figures_seq): added, or the
# earliest / latest / greatest kept.
_PROGRESS_SQL = f"""
WITH locked AS (
    SELECT id FROM {Run._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE
)
UPDATE {Run._meta.db_table} AS r SET
    last_progress_step = v.last_progress_step,
    detections_count = CASE WHEN v.counted
        THEN (SELECT count(*) FROM {Detection._meta.db_table} AS d WHERE d.run_id = r.id)
        ELSE r.detections_count END,
    max_action = COALESCE(v.max_action, r.max_action),
    loop_flagged = r.loop_flagged OR COALESCE(v.loop_flagged, false),
    first_loop_at = COALESCE(r.first_loop_at, v.first_loop_at),
    first_loop_seq = COALESCE(v.first_loop_seq, r.first_loop_seq),
    cost_after_loop_usd = LEAST(r.cost_after_loop_usd + COALESCE(v.cost_after_loop_usd, 0), {MAX_TOTAL_USD}),
    terminated_by = CASE WHEN r.terminated_by = '' AND v.terminated_by <> ''
        THEN v.terminated_by ELSE r.terminated_by END,
    budget_type = CASE WHEN r.terminated_by = '' AND v.terminated_by <> ''
        THEN v.budget_type ELSE r.budget_type END,
    rounds = GREATEST(r.rounds, COALESCE(v.rounds, 0)),
    tool_calls = r.tool_calls + COALESCE(v.tool_calls, 0),
    tool_errors = r.tool_errors + COALESCE(v.tool_errors, 0),
    input_tokens = r.input_tokens + COALESCE(v.input_tokens, 0),
    output_tokens = r.output_tokens + COALESCE(v.output_tokens, 0),
    cost_usd = LEAST(r.cost_usd + COALESCE(v.cost_usd, 0), {MAX_TOTAL_USD}),
    started_at = LEAST(r.started_at, v.started_at),
    last_event_at = GREATEST(r.last_event_at, v.last_event_at)
FROM jsonb_to_recordset(%s::jsonb) AS v(
    id bigint, last_progress_step integer, counted boolean, max_action text, loop_flagged boolean,
    first_loop_at timestamptz, first_loop_seq integer, cost_after_loop_usd double precision,
    terminated_by text, budget_type text, rounds integer, tool_calls integer, tool_errors integer,
    input_tokens bigint, output_tokens bigint, cost_usd double precision, started_at timestamptz,
    last_event_at timestamptz
)
WHERE r.id = v.id AND r.id IN (SELECT id FROM locked)
"""


# PostgreSQL: the pass's cursors, moved, with the engine states (text: ingest.models.JSONText). Sent
# with server-side binding, parameters in binary (positions_save): the states arrive as they are,
# where a text array in the query had to be unescaped element by element (83 ms for 1,000 states).
_POSITIONS_SQL = f"""
UPDATE {RunCursor._meta.db_table} AS c
SET position = v.position, processed = v.processed, engine_state = v.engine_state, updated_at = %b,
    figures_seq = GREATEST(c.figures_seq, v.position),
    failures = 0, error = '', failed_at = NULL, retry_at = NULL
FROM unnest(%b::bigint[], %b::integer[], %b::integer[], %b::text[])
    AS v(run_id, position, processed, engine_state)
WHERE c.run_id = v.run_id
"""


_PENDING_DELETE_SQL = f"DELETE FROM {PendingResult._meta.db_table} WHERE id = ANY(%s)"
