"""Writes: tenants and keys, event ingestion, and the per-run processing of stored events."""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
import math
import operator
import os
import secrets
import struct
import threading
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NotRequired, TypedDict

import orjson
from django.db import connection, models, transaction
from django.utils import timezone

from ingest.detection import ACTIONS, Engine, RunState
from ingest.events import ALERT_MESSAGE, alerts_group
from ingest.ledger import trace_write_finished, trace_write_started
from ingest.models import (
    ApiKey,
    Backend,
    Detection,
    Event,
    ModelPrice,
    ModelRound,
    PendingResult,
    Run,
    RunCursor,
    Tenant,
    ToolCall,
)
from ingest.pricing import PriceBook
from ingest.schema import EventError, find_nul, parse_ts, validate_event
from ingest.selectors import detection_config

logger = logging.getLogger(__name__)

KEY_PREFIX = "lw_"


# --- tenants and keys ------------------------------------------------------------------


def tenant_get_or_create(*, slug: str, name: str = "") -> Tenant:
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return tenant


def api_key_hash(raw: str) -> str:
    # Keys are 256-bit random tokens, so a plain sha256 is enough (no password stretching needed).
    return hashlib.sha256(raw.encode()).hexdigest()


def api_key_create(*, tenant: Tenant, scopes: list[str], name: str = "") -> tuple[ApiKey, str]:
    """Create a key; the raw key is returned once and never stored."""
    unknown = set(scopes) - set(ApiKey.Scope.values)
    if unknown or not scopes:
        raise ValueError(f"scopes must be a non-empty subset of {', '.join(ApiKey.Scope.values)}")
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant, name=name, prefix=raw[:10], key_hash=api_key_hash(raw), scopes=sorted(set(scopes))
    )
    return key, raw


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke at once in this process; other server processes stop accepting it within
    LOOPWATCH_KEY_CACHE_S seconds."""
    from ingest.auth import api_key_forget

    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    api_key_forget(key.key_hash)
    return key


# --- ingestion ---------------------------------------------------------------------------


class Verdict(TypedDict):
    index: int
    status: Literal["accepted", "duplicate", "rejected"]
    field: NotRequired[str]
    reason: NotRequired[str]
    error: NotRequired[str]


@dataclass
class IngestResult:
    verdicts: list[Verdict]
    runs_touched: list[int] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for v in self.verdicts if v["status"] == status)

    def as_dict(self) -> dict[str, Any]:
        counts = Counter(v["status"] for v in self.verdicts)
        return {
            "accepted": counts["accepted"],
            "duplicate": counts["duplicate"],
            "rejected": counts["rejected"],
            "results": self.verdicts,
        }


class EventTooLarge(Exception):
    def __init__(self, index: int, size: int, limit: int) -> None:
        super().__init__(f"[{index}]: the event is {size} bytes, over the limit of {limit} bytes")
        self.index = index
        self.size = size
        self.limit = limit


def _rejected(index: int, field_name: str, reason: str) -> Verdict:
    path = f"[{index}].{field_name}" if field_name else f"[{index}]"
    return {
        "index": index,
        "status": "rejected",
        "field": path,
        "reason": reason,
        "error": f"{path}: {reason}",
    }


# A valid event on its way to storage: (index in the batch, event, parsed ts, stored body). A plain
# tuple: a dataclass instance per event cost more than the checks around it.
_Valid = tuple[int, dict[str, Any], datetime, bytes]


def events_ingest(*, tenant: Tenant, events: list[Any], max_event_bytes: int) -> IngestResult:
    """Validate a batch, store its valid events in one transaction, queue detection per run.

    1. Validate each event; a bad one gets a `rejected` verdict and the others go on.
    2. In one transaction: create the runs that are new, lock every touched run (in pk order, so
       concurrent batches cannot deadlock), drop events already stored, number the rest per run
       (`seq`), store them in one COPY, update the runs' figures.
    3. After the commit, queue one detection task per run.
    Raises EventTooLarge before storing anything when one event is over the limit.
    """
    verdicts: list[Verdict | None] = [None] * len(events)
    valid: list[_Valid] = []
    seen: set[tuple[str, str]] = set()
    slug = tenant.slug
    dumps = orjson.dumps
    for index, event in enumerate(events):
        try:
            ts = validate_event(event)
        except EventError as exc:
            verdicts[index] = _rejected(index, exc.field, exc.reason)
            continue
        body = dumps(event)
        if len(body) > max_event_bytes:
            raise EventTooLarge(index, len(body), max_event_bytes)
        if b"\\u0000" in body:
            nul_path = find_nul(event)
            if nul_path is not None:
                verdicts[index] = _rejected(index, nul_path, "must not contain the character U+0000 (NUL)")
                continue
        if event["type"] == "run_started" and event.get("tenant", slug) != slug:
            verdicts[index] = _rejected(index, "tenant", f"must be the API key's tenant {slug!r} or left out")
            continue
        event_id = event.get("event_id")
        if event_id is not None:
            pair = (event["run_id"], event_id)
            if pair in seen:
                verdicts[index] = {"index": index, "status": "duplicate"}
                continue
            seen.add(pair)
        valid.append((index, event, ts, body))

    runs_touched: list[int] = []
    if valid:
        runs_touched = _store_atomic(tenant, valid, verdicts)
        transaction.on_commit(lambda: _enqueue_detection(runs_touched), robust=True)
    return IngestResult(verdicts=[v for v in verdicts if v is not None], runs_touched=runs_touched)


# The unique index that finds an event_id already stored for its run (ingest.models.Event).
EVENT_ID_CONSTRAINT = "event_run_event_id_uniq"


def _store_atomic(tenant: Tenant, valid: list[_Valid], verdicts: list[Verdict | None]) -> list[int]:
    """_store() in a transaction (a savepoint inside another).

    On PostgreSQL the events go in first without looking for stored duplicates: the unique
    (run, event_id) index checks every row of the COPY anyway. When it finds one, that transaction
    is rolled back and the batch stored again, this time dropping what is already stored: the
    outcome is the same as checking first, and a batch without duplicates (nearly all of them)
    saves the lookup of its thousand event_ids.
    """
    if connection.vendor == "postgresql":
        try:
            with transaction.atomic():
                return _store(tenant, valid, verdicts, check_stored=False)
        except Exception as exc:
            if not _is_event_id_conflict(exc):
                raise
    with transaction.atomic():
        return _store(tenant, valid, verdicts, check_stored=True)


def _is_event_id_conflict(exc: BaseException) -> bool:
    for err in (exc, exc.__cause__):
        diag = getattr(err, "diag", None)
        if diag is not None and getattr(err, "sqlstate", None) == "23505":
            return diag.constraint_name == EVENT_ID_CONSTRAINT
    return False


RUN_FIGURES = [
    "agent",
    "task_type",
    "backend",
    "model",
    "budgets",
    "labels",
    "status",
    "terminated_by",
    "budget_type",
    "reason",
    "started_at",
    "finished_at",
    "last_event_at",
    "rounds",
    "tool_calls",
    "tool_errors",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "events_count",
]
JSON_FIGURES = ("budgets", "labels")
# What only run_started (agent ... labels) and run_finished (status ... finished_at) set. On PostgreSQL
# the UPDATE leaves them as stored for a run without such an event in the batch (it sends none).
DESCRIPTION_FIGURES = (
    *("agent", "task_type", "backend", "model", "budgets", "labels"),
    *("status", "terminated_by", "budget_type", "reason", "finished_at"),
)
# On PostgreSQL these are merged into the stored values by the UPDATE itself (the earliest start, the
# latest event, the batch's last finish if any): the lock does not read them (Django's loader turns
# each timestamp back into a datetime in Python: three quarters of the CPU of reading the runs).
TIME_FIGURES = ("started_at", "finished_at", "last_event_at")


class _RunRow:
    """A locked run's pk, run_id and figures (RUN_FIGURES), as _run_apply updates them (PostgreSQL).

    Read with one SELECT ... FOR UPDATE instead of model instances, which cost more CPU than the rest
    of the run's share of a batch. budgets and labels stay the stored JSON text, as orjson fragments
    (written back as they are), until an event replaces them. The TIME_FIGURES start as None: they
    hold the batch's own values, which the UPDATE merges with the stored ones.
    """

    __slots__ = ("pk", "run_id", *RUN_FIGURES)
    # The columns the lock reads, in this order (the SELECT is built from it).
    LOCKED = (
        *("pk", "run_id", "agent", "task_type", "backend", "model", "budgets", "labels"),
        *("status", "terminated_by", "budget_type", "reason", "rounds", "tool_calls", "tool_errors"),
        *("input_tokens", "output_tokens", "cost_usd", "events_count"),
    )

    def __init__(self, values: tuple) -> None:
        (
            self.pk,
            self.run_id,
            self.agent,
            self.task_type,
            self.backend,
            self.model,
            budgets,
            labels,
            self.status,
            self.terminated_by,
            self.budget_type,
            self.reason,
            self.rounds,
            self.tool_calls,
            self.tool_errors,
            self.input_tokens,
            self.output_tokens,
            self.cost_usd,
            self.events_count,
        ) = values
        self.budgets = orjson.Fragment(budgets)
        self.labels = orjson.Fragment(labels)
        self.started_at = self.finished_at = self.last_event_at = None


assert set(_RunRow.LOCKED) | set(TIME_FIGURES) == set(_RunRow.__slots__)


def _runs_lock(tenant: Tenant, run_ids: list[str]) -> dict[str, Run | _RunRow]:
    # Inserts in run_id order, then locks in pk order: two batches touching the same runs never deadlock.
    _insert_missing(Run, Run(tenant=tenant), "run_id", sorted(run_ids))
    if connection.vendor != "postgresql":
        return {
            run.run_id: run
            for run in Run.objects.select_for_update()
            .filter(tenant=tenant, run_id__in=run_ids)
            .order_by("pk")
        }
    with connection.cursor() as cursor:
        cursor.execute(_run_statements()[0], [tenant.pk, run_ids])
        return {row[1]: _RunRow(row) for row in cursor.fetchall()}


def _insert_missing_sql(model: type[models.Model], template: models.Model, key: str, values: list) -> tuple:
    """INSERT ... ON CONFLICT DO NOTHING of one row per value of `key`, the other columns as in
    template, as one statement over unnest() (PostgreSQL): (sql, params)."""
    key_field = next(f for f in model._meta.concrete_fields if f.attname == key)
    fields = [
        f for f in model._meta.concrete_fields if f is not key_field and f is not model._meta.auto_field
    ]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in [*fields, key_field])
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "
        f"SELECT {'%s, ' * len(fields)}k FROM unnest(%s::{key_field.db_type(connection)}[]) AS u(k) "
        "ON CONFLICT DO NOTHING"
    )
    params = [f.get_db_prep_save(f.pre_save(template, add=True), connection) for f in fields]
    return sql, [*params, values]


def _insert_missing(model: type[models.Model], template: models.Model, key: str, values: list) -> None:
    """INSERT ... ON CONFLICT DO NOTHING of one row per value of `key`, the other columns as in template.

    On PostgreSQL one statement over unnest(): bulk_create() spent more CPU preparing 50 model
    instances than the database spent storing the batch's thousand events.
    """
    if connection.vendor != "postgresql":
        rows = []
        for value in values:
            row = copy.copy(template)
            setattr(row, key, value)
            rows.append(row)
        model.objects.bulk_create(rows, ignore_conflicts=True)
        return
    sql, params = _insert_missing_sql(model, template, key, values)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _store(
    tenant: Tenant, valid: list[_Valid], verdicts: list[Verdict | None], *, check_stored: bool
) -> list[int]:
    runs = _runs_lock(tenant, list(dict.fromkeys(item[1]["run_id"] for item in valid)))
    # Runs without events get their detection cursor (with the runs' update, in the same transaction).
    fresh = [run.pk for run in runs.values() if run.events_count == 0]
    stored: set[tuple[int, str]] = set()
    if check_stored:
        # Only runs that already hold events can hold a duplicate of this batch's events.
        older = {run.pk for run in runs.values() if run.events_count}
        event_ids = {
            event["event_id"]
            for _, event, _, _ in valid
            if "event_id" in event and runs[event["run_id"]].pk in older
        }
        stored = _events_stored(older, event_ids) if event_ids else set()
    rows: list[tuple] = []
    unpriced: dict[int, list[tuple[int, int]]] = defaultdict(list)
    changed: dict[int, Run | _RunRow] = {}
    described: set[int] = set()  # runs whose DESCRIPTION figures this batch sets
    for index, event, ts, body in valid:
        run = runs[event["run_id"]]
        run_pk = run.pk
        event_id = event.get("event_id")
        if stored and event_id is not None and (run_pk, event_id) in stored:
            verdicts[index] = {"index": index, "status": "duplicate"}
            continue
        seq = run.events_count = run.events_count + 1
        kind = event["type"]
        rows.append((run_pk, seq, event_id, kind, ts, body))
        if _run_apply(run, event, ts):
            unpriced[run_pk].append((event.get("input_tokens", 0), event.get("output_tokens", 0)))
        elif kind == "run_started" or kind == "run_finished":
            described.add(run_pk)
        changed[run_pk] = run
        verdicts[index] = {"index": index, "status": "accepted"}
    if not rows:
        if fresh:
            _insert_missing(RunCursor, RunCursor(), "run_id", fresh)
        return []
    if unpriced:
        pairs = {(changed[pk].backend, changed[pk].model) for pk in unpriced}
        book = _PriceBook(pairs) if connection.vendor == "postgresql" else PriceBook(pairs)
        for pk, usage in unpriced.items():
            price = book.price(changed[pk].backend, changed[pk].model)
            changed[pk].cost_usd += sum(price.cost(i, o) for i, o in usage)
    # Each run's rows together (in seq order: the sort is stable), as its index entries lie.
    rows.sort(key=_BY_RUN)
    _events_insert(tenant.pk, rows)
    _runs_update(list(changed.values()), fresh, described)
    return list(changed)


_BY_RUN = operator.itemgetter(0)


@functools.cache
def _run_statements() -> tuple[str, str]:
    """PostgreSQL: the SELECT ... FOR UPDATE of a batch's runs and the UPDATE of their figures."""
    table = Run._meta.db_table
    column = {name: Run._meta.get_field(name).column for name in ("run_id", "tenant", *RUN_FIGURES)}
    column["pk"] = Run._meta.pk.column
    locked = ", ".join(f'"{column[name]}"' for name in _RunRow.LOCKED)
    lock = (
        f'SELECT {locked} FROM "{table}" WHERE "{column["tenant"]}" = %s AND "{column["run_id"]}" = ANY(%s) '
        f'ORDER BY "{column["pk"]}" FOR UPDATE'
    )
    # One statement for all the runs, their rows given as one JSON array read as rows of the table.
    merge = {"started_at": "LEAST(r.{0}, v.{0})", "last_event_at": "GREATEST(r.{0}, v.{0})"}
    merge.update((name, "COALESCE(v.{0}, r.{0})") for name in DESCRIPTION_FIGURES)
    assignments = ", ".join(
        f'"{column[name]}" = ' + merge.get(name, "v.{0}").format(f'"{column[name]}"') for name in RUN_FIGURES
    )
    update = (
        f'UPDATE "{table}" AS r SET {assignments} FROM json_populate_recordset(NULL::"{table}", %s::json) AS v '
        f'WHERE r."{column["pk"]}" = v."{column["pk"]}"'
    )
    return lock, update


def _events_stored(run_pks: set[int], event_ids: set[str]) -> set[tuple[int, str]]:
    """The (run pk, event_id) pairs among these already stored."""
    if connection.vendor == "postgresql":
        # Two array parameters, not IN (...) with a placeholder per id: psycopg's client-side
        # binding parsed a thousand placeholders for longer than the database took to answer.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT run_id, event_id FROM ingest_event WHERE run_id = ANY(%s) AND event_id = ANY(%s)",
                [list(run_pks), list(event_ids)],
            )
            return set(cursor.fetchall())
    return set(
        Event.objects.filter(run_id__in=run_pks, event_id__in=event_ids).values_list("run_id", "event_id")
    )


def _runs_update(runs: list[Run | _RunRow], fresh: list[int], described: set[int]) -> None:
    """Write the runs' figures, and create the detection cursors of the fresh runs.

    On PostgreSQL one statement: UPDATE ... FROM json_populate_recordset() of the figures as one JSON
    array (_RunRow: TIME_FIGURES merged; DESCRIPTION_FIGURES only for the `described` runs, the others
    keep theirs), with the cursors' INSERT in a WITH clause. Elsewhere one UPDATE per run
    (executemany). Not bulk_update(): its CASE ... WHEN expressions cost Django ~2 ms of CPU per
    run, most of a batch.
    """
    if connection.vendor == "postgresql":
        names = ("pk", *RUN_FIGURES)
        columns = [Run._meta.pk.column, *(Run._meta.get_field(name).column for name in RUN_FIGURES)]
        counted = [(c, n) for c, n in zip(columns, names, strict=True) if n not in DESCRIPTION_FIGURES]
        cost = Run._meta.get_field("cost_usd").column
        data = []
        for run in runs:
            if run.pk in described:
                row = {column: getattr(run, name) for column, name in zip(columns, names, strict=True)}
            else:
                row = {column: getattr(run, name) for column, name in counted}
            if not math.isfinite(run.cost_usd):  # JSON has no number for it; the column reads the text
                row[cost] = _FLOAT_TEXT.get(run.cost_usd, "NaN")
            data.append(row)
        sql = _run_statements()[1]
        params: list = [orjson.dumps(data).decode()]
        if fresh:
            cursor_sql, cursor_params = _insert_missing_sql(RunCursor, RunCursor(), "run_id", fresh)
            sql = f"WITH cursors AS ({cursor_sql}) {sql}"
            params = [*cursor_params, *params]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        return
    if fresh:
        _insert_missing(RunCursor, RunCursor(), "run_id", fresh)
    fields = [Run._meta.get_field(name) for name in RUN_FIGURES]
    assignments = ", ".join(f"{connection.ops.quote_name(f.column)} = %s" for f in fields)
    sql = f"UPDATE {connection.ops.quote_name(Run._meta.db_table)} SET {assignments} WHERE id = %s"
    params = [[_db_value(f, getattr(run, f.attname)) for f in fields] + [run.pk] for run in runs]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


_FLOAT_TEXT = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _db_value(field, value: Any) -> Any:
    kind = field.get_internal_type()
    if kind == "JSONField":
        return orjson.dumps(value).decode()
    if kind == "DateTimeField":
        return connection.ops.adapt_datetimefield_value(value)
    return value


class _PriceBook(PriceBook):
    """PriceBook's prices and markups in one query on PostgreSQL (two through the ORM)."""

    def __init__(self, pairs: set[tuple[str, str]]) -> None:
        self._markup = {}
        self._prices = {}
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT b.name, b.markup, p.model, p.input_usd_per_mtok, p.output_usd_per_mtok "
                f"FROM {Backend._meta.db_table} b LEFT JOIN {ModelPrice._meta.db_table} p "
                "ON p.backend_id = b.id WHERE b.name = ANY(%s)",
                [sorted({b for b, _ in pairs})],
            )
            for name, markup, model, input_price, output_price in cursor.fetchall():
                self._markup[name] = float(markup)
                if model is not None:
                    self._prices[(name, model)] = (input_price, output_price)


def _run_apply(run: Run, event: dict[str, Any], ts: datetime) -> bool:
    """Fold one event into the run's figures. True when it is a model round whose cost must be priced."""
    kind = event["type"]
    if run.started_at is None or ts < run.started_at:
        run.started_at = ts
    if run.last_event_at is None or ts > run.last_event_at:
        run.last_event_at = ts
    if kind == "model_round":
        run.rounds = max(run.rounds, event["round"])
        run.input_tokens += event.get("input_tokens", 0)
        run.output_tokens += event.get("output_tokens", 0)
        if "cost_usd" in event:
            run.cost_usd += event["cost_usd"]
            return False
        return True
    if kind == "tool_call":
        run.tool_calls += 1
    elif kind == "tool_result":
        if event["status"] != "ok":
            run.tool_errors += 1
    elif kind == "run_started":
        run.agent = event.get("agent", run.agent)
        run.task_type = event.get("task_type", run.task_type)
        run.backend = event.get("backend", run.backend)
        run.model = event.get("model", run.model)
        run.budgets = event.get("budgets", run.budgets)
        run.labels = event.get("labels", run.labels)
    elif kind == "run_finished":
        run.status = event["status"]
        run.terminated_by = event.get("terminated_by", "")
        run.budget_type = event.get("budget_type", "")
        run.reason = event.get("reason", "")
        run.finished_at = ts
    return False


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


def _events_insert(tenant_pk: int, rows: list[tuple]) -> None:
    """One binary COPY on PostgreSQL (the hot path); a bulk insert elsewhere.

    rows: (run pk, seq, event_id, type, ts, body). The binary rows are built here rather than by
    copy.write_row(): that formatted and escaped every value, and PostgreSQL then parsed the text
    back; binary spares both sides most of it (the body is JSON text either way).
    """
    if connection.vendor == "postgresql":
        parts = [_COPY_HEADER]
        append = parts.append
        head_pk = head = None
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
        return
    Event.objects.bulk_create(
        [
            Event(tenant_id=tenant_pk, run_id=r, seq=s, event_id=e, type=k, ts=ts, body=orjson.loads(b))
            for r, s, e, k, ts, b in rows
        ],
        batch_size=500,
    )


def _enqueue_detection(run_pks: list[int]) -> None:
    """detect_runs.delay(run_pks).

    One message per batch, not per run: a broker round trip per run was a fifth of a batch's time.
    With a broker, the message is sent from one long-lived thread per process (and waited for):
    under ASGI each request runs in a new thread, and Celery builds its result backend once per
    thread, a quarter of the CPU of a send. Eager (no broker), the task runs here, in the request's
    thread.
    """
    from ingest.tasks import detect_runs

    if detect_runs.app.conf.task_always_eager:
        detect_runs.delay(run_pks)
        return
    _publisher().submit(detect_runs.delay, run_pks).result()


_publisher_pool: ThreadPoolExecutor | None = None
_publisher_lock = threading.Lock()


def _publisher() -> ThreadPoolExecutor:
    global _publisher_pool
    if _publisher_pool is None:
        with _publisher_lock:
            if _publisher_pool is None:
                _publisher_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="detection-publisher")
    return _publisher_pool


def _publisher_forget() -> None:
    """In a forked child the parent's publisher thread does not exist: start a new one when needed."""
    global _publisher_pool, _publisher_lock
    _publisher_pool, _publisher_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_publisher_forget)


# --- per-run processing ---------------------------------------------------------------------

PROCESS_CHUNK = 2000  # events per pass: bounds a task's memory and lock time on a huge backlog


def run_process(*, run_pk: int, chunk: int = PROCESS_CHUNK) -> int:
    """Process a run's events after its cursor, once and in order. Returns how many it processed.

    1. Lock the run's cursor row (a second task for the same run waits here, then finds nothing).
    2. Read the events after the cursor, in seq order, at most `chunk` of them.
    3. Build model rounds and tool calls, joining each result to the most recent unanswered call
       with its call_id; a result without a call is kept and joined when the call comes.
    4. Move the cursor and commit; repeat until the run is caught up.
    """
    total = 0
    while True:
        with transaction.atomic():
            cursor = RunCursor.objects.select_for_update().filter(run_id=run_pk).first()
            if cursor is None:
                return total
            events = list(
                Event.objects.filter(run_id=run_pk, seq__gt=cursor.position)
                .order_by("seq")
                .values_list("seq", "type", "ts", "body")[:chunk]
            )
            if not events:
                return total
            fields = ("tenant_id", "backend", "model", "task_type", "run_id", "agent", "first_loop_seq")
            run = Run.objects.only(*fields).get(pk=run_pk)
            duplicates = _materialize(run, events)
            published = _detect(run, cursor, events, duplicates)
            cursor.position = events[-1][0]
            cursor.processed += len(events)
            cursor.save(update_fields=["position", "processed", "engine_state", "updated_at"])
        if published:
            alerts_publish(tenant_id=run.tenant_id, alerts=published)
        total += len(events)
        if len(events) < chunk:
            return total


def run_reprocess(*, run_pk: int) -> int:
    """Process a run again from its first event (after a fix or a threshold change).

    Rounds and calls are rebuilt; detections already stored are kept and not stored twice.
    """
    with transaction.atomic():
        cursor = RunCursor.objects.select_for_update().get(run_id=run_pk)
        ModelRound.objects.filter(run_id=run_pk).delete()
        ToolCall.objects.filter(run_id=run_pk).delete()
        PendingResult.objects.filter(run_id=run_pk).delete()
        cursor.position, cursor.engine_state = 0, None
        cursor.save(update_fields=["position", "engine_state", "updated_at"])
        Run.objects.filter(pk=run_pk).update(cost_after_loop_usd=0)  # every round is counted again
    return run_process(run_pk=run_pk)


def _detect(
    run: Run,
    cursor: RunCursor,
    events: list[tuple[int, str, datetime, dict]],
    found_elsewhere: list[Detection],
) -> list[dict]:
    """Feed the events to the engine from where it stopped; store what it finds.

    Returns the alerts to publish (interventions) once the transaction has committed.
    """
    config = detection_config(run=run)
    state = None
    if cursor.engine_state:
        try:
            state = RunState.from_dict(cursor.engine_state)
        except (TypeError, ValueError, KeyError):
            logger.warning("run %s: engine state unreadable, starting afresh", run.pk)
    state = state or RunState()
    engine = Engine(config)
    rows: list[Detection] = []
    first_loop_ts: datetime | None = None
    for seq, _kind, ts, body in events:
        for found in engine.feed(state, body):
            rows.append(
                Detection(
                    tenant_id=run.tenant_id,
                    run_id=run.pk,
                    seq=seq,
                    kind=found.kind,
                    action=found.action,
                    signature=found.signature,
                    tool=found.tool,
                    count=found.count,
                    at_call=found.at_call,
                    at_round=found.at_round,
                    backend=run.backend,
                    model=run.model,
                    task_type=run.task_type,
                    agent=run.agent,
                    evidence=found.evidence,
                    hint=found.hint,
                    ts=ts,
                )
            )
            if found.action != "observe" and first_loop_ts is None:
                first_loop_ts = ts
    rows += found_elsewhere
    if found_elsewhere and first_loop_ts is None:
        first_loop_ts = found_elsewhere[0].ts
    cursor.engine_state = state.to_dict()
    figures: dict[str, Any] = {"last_progress_step": state.last_progress_step}
    if rows:
        Detection.objects.bulk_create(rows, ignore_conflicts=True)
        figures["detections_count"] = Detection.objects.filter(run_id=run.pk).count()
        figures["max_action"] = ACTIONS[state.max_action - 1] if state.max_action else ""
    if first_loop_ts is not None:
        figures["loop_flagged"] = True
    figures.update(_loop_cost(run, events, rows))
    Run.objects.filter(pk=run.pk).update(**figures)
    if first_loop_ts is not None:
        Run.objects.filter(pk=run.pk, first_loop_at__isnull=True).update(first_loop_at=first_loop_ts)
    if state.terminated_by:
        # What the engine concluded; the runtime's own run_finished, when it comes, says what happened.
        Run.objects.filter(pk=run.pk, terminated_by="").update(
            terminated_by=state.terminated_by, budget_type=state.budget_type
        )
    interventions = [r for r in rows if r.action != "observe"]
    if not interventions:
        return []
    stored = Detection.objects.filter(
        run_id=run.pk,
        seq__gte=events[0][0],
        seq__lte=events[-1][0],
        action__in=[r.action for r in interventions],
    ).order_by("pk")
    return [alert_payload(detection, run=run) for detection in stored]


def _loop_cost(run: Run, events: list[tuple[int, str, datetime, dict]], rows: list[Detection]) -> dict:
    """Money burned in a loop: the cost of the model rounds after the event that made the first
    intervention fire, whether it fired in this batch or an earlier one (the run's first_loop_seq).
    Each round is counted once, as its batch goes by; _materialize has priced every round's body."""
    first = min((row.seq for row in rows if row.action != Detection.Action.OBSERVE), default=None)
    if run.first_loop_seq is not None and (first is None or run.first_loop_seq < first):
        first = run.first_loop_seq
    if first is None:
        return {}
    burned = math.fsum(
        body["cost_usd"] for seq, kind, _, body in events if kind == "model_round" and seq > first
    )
    figures: dict[str, Any] = {"first_loop_seq": first}
    if burned:
        figures["cost_after_loop_usd"] = models.F("cost_after_loop_usd") + burned
    return figures


def alert_payload(detection: Detection, *, run: Run) -> dict[str, Any]:
    # run (pk) and tenant_id let a page link the run and scope the alert without a query per alert.
    return {
        "id": detection.pk,
        "run_id": run.run_id,
        "run": run.pk,
        "tenant_id": run.tenant_id,
        "agent": run.agent,
        "seq": detection.seq,
        "kind": detection.kind,
        "action": detection.action,
        "tool": detection.tool,
        "count": detection.count,
        "at_call": detection.at_call,
        "at_round": detection.at_round,
        "backend": detection.backend,
        "model": detection.model,
        "task_type": detection.task_type,
        "hint": detection.hint,
        "ts": detection.ts.isoformat(),
    }


def alerts_publish(*, tenant_id: int, alerts: list[dict]) -> None:
    """Send alerts to the tenant's Channels group. At most once: pages catch up from the database."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        for alert in alerts:
            async_to_sync(layer.group_send)(alerts_group(tenant_id), {"type": ALERT_MESSAGE, "alert": alert})
    except Exception:  # a broken channel layer must not undo stored detections
        logger.exception("publishing %d alerts for tenant %s failed", len(alerts), tenant_id)


def _materialize(run: Run, events: list[tuple[int, str, datetime, dict]]) -> list[Detection]:
    run_pk = run.pk
    result_ids = {body["call_id"] for _, kind, _, body in events if kind == "tool_result"}
    call_ids = {body["call_id"] for _, kind, _, body in events if kind == "tool_call"}
    # Unanswered calls stored earlier, oldest first: a stack per call_id (the newest answers first).
    open_calls: dict[str, list[ToolCall]] = defaultdict(list)
    for call in ToolCall.objects.filter(
        run_id=run_pk, call_id__in=result_ids, result_seq__isnull=True
    ).order_by("seq"):
        open_calls[call.call_id].append(call)
    # Results that came before their call, oldest first: a queue per call_id.
    waiting: dict[str, list[PendingResult]] = defaultdict(list)
    for pending in PendingResult.objects.filter(run_id=run_pk, call_id__in=call_ids).order_by("seq"):
        waiting[pending.call_id].append(pending)

    new_rounds: list[ModelRound] = []
    new_calls: list[ToolCall] = []
    answered: list[ToolCall] = []
    new_pending: list[PendingResult] = []
    consumed: list[int] = []
    book: PriceBook | None = None
    for seq, kind, ts, body in events:
        if kind == "model_round":
            cost = body.get("cost_usd")
            if cost is None:
                book = book or PriceBook({(run.backend, run.model)})
                cost = book.price(run.backend, run.model).cost(
                    body.get("input_tokens", 0), body.get("output_tokens", 0)
                )
            new_rounds.append(
                ModelRound(
                    run_id=run_pk,
                    seq=seq,
                    round=body["round"],
                    ts=ts,
                    input_tokens=body.get("input_tokens", 0),
                    output_tokens=body.get("output_tokens", 0),
                    cost_usd=cost,
                    cost_computed="cost_usd" not in body,
                    text=body.get("text", ""),
                )
            )
            body.setdefault("cost_usd", cost)  # detection counts the cost budget with it
        elif kind == "tool_call":
            call = ToolCall(
                run_id=run_pk,
                seq=seq,
                round=body["round"],
                call_id=body["call_id"],
                tool=body["tool"],
                kind=body.get("kind", ToolCall.Kind.OTHER),
                args=body["args"],
                step_id=body.get("step_id", ""),
                operation_key=body.get("operation_key", ""),
                ts=ts,
            )
            new_calls.append(call)
            queue = waiting.get(call.call_id)
            if queue:
                pending = queue.pop(0)
                if pending.pk is not None:
                    consumed.append(pending.pk)
                else:
                    new_pending.remove(pending)
                _result_join(call, pending.seq, pending.body)
            else:
                open_calls[call.call_id].append(call)
        elif kind == "tool_result":
            stack = open_calls.get(body["call_id"])
            if stack:
                call = stack.pop()
                _result_join(call, seq, body)
                if call.pk is not None:
                    answered.append(call)
            else:
                pending = PendingResult(run_id=run_pk, seq=seq, call_id=body["call_id"], body=body)
                new_pending.append(pending)
                waiting[pending.call_id].append(pending)
    ModelRound.objects.bulk_create(new_rounds)
    ToolCall.objects.bulk_create(new_calls)
    if answered:
        ToolCall.objects.bulk_update(answered, RESULT_FIELDS)
    if consumed:
        PendingResult.objects.filter(pk__in=consumed).delete()
    PendingResult.objects.bulk_create(new_pending)
    return _ledger_feed(run, new_calls, answered)


def _ledger_feed(run: Run, new_calls: list[ToolCall], answered: list[ToolCall]) -> list[Detection]:
    """Traced writes go into the ledger; a key executed a second time is a duplicate side effect."""
    duplicates: list[Detection] = []
    for call in new_calls:
        if call.kind != ToolCall.Kind.WRITE:
            continue
        evidence = trace_write_started(run=run, call=call)
        if evidence is not None:
            duplicates.append(
                Detection(
                    tenant_id=run.tenant_id,
                    run_id=run.pk,
                    seq=call.seq,
                    kind="duplicate_side_effect",
                    action=Detection.Action.HANDOFF,
                    signature=evidence["operation_key"][:64],
                    tool=call.tool,
                    count=evidence["executions"],
                    at_round=call.round,
                    backend=run.backend,
                    model=run.model,
                    task_type=run.task_type,
                    agent=run.agent,
                    evidence=evidence,
                    hint=(
                        f"{call.tool} ran again for operation {evidence['operation_key']} "
                        f"(it was {evidence['previous_status']}): the effect may now exist twice. "
                        "Check it downstream and compensate if needed."
                    ),
                    ts=call.ts,
                )
            )
    for call in [*new_calls, *answered]:
        if call.kind == ToolCall.Kind.WRITE and call.result_seq is not None:
            trace_write_finished(run=run, call=call)
    return duplicates


RESULT_FIELDS = [
    "result_seq",
    "result_status",
    "result",
    "result_truncated",
    "result_sha256",
    "error_class",
    "latency_ms",
    "external_request_id",
    "result_ts",
]


def _result_join(call: ToolCall, seq: int, body: dict[str, Any]) -> None:
    call.result_seq = seq
    call.result_status = body["status"]
    call.result = body.get("result")
    call.result_truncated = body.get("result_truncated", False)
    call.result_sha256 = body.get("result_sha256", "")
    call.error_class = body.get("error_class", "")
    call.latency_ms = body.get("latency_ms")
    call.external_request_id = body.get("external_request_id", "")
    call.result_ts = parse_ts(body["ts"])
