"""Writes: tenants and keys, event ingestion, and the per-run processing of stored events."""

from __future__ import annotations

import contextlib
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
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NotRequired, TypedDict

import orjson
from celery.exceptions import SoftTimeLimitExceeded
from django.db import InterfaceError, OperationalError, connection, models, transaction
from django.db.models.functions import Least, RowNumber
from django.utils import timezone
from psycopg.errors import LockNotAvailable

from ingest import metrics
from ingest.bulk import dumps_bounded, insert_statement, statements_run, update_statement
from ingest.detection import ACTIONS, Config, Engine, RunState
from ingest.detection.bounds import MAX_TOTAL_USD
from ingest.events import ALERT_MESSAGE, alerts_group
from ingest.ledger import TRACE_FINISHED, TRACE_STARTED, trace_writes_record
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
from ingest.otlp.rounds import START as ROUND_START
from ingest.otlp.rounds import Numbering, rounds_number
from ingest.pending import TAKE, TASK_BUDGET_S, enqueue_timeout_s, pending_add, pending_count, pending_take
from ingest.pricing import Price, PriceBook
from ingest.schema import MAX_COST_USD, EventError, find_nul, parse_ts, validate_event
from ingest.selectors import Scope, configs_for

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


def events_ingest(
    *, tenant: Tenant, events: list[Any], max_event_bytes: int, ledger_scope: bool = True
) -> IngestResult:
    """Validate a batch, store its valid events in one transaction, queue detection per run.

    ledger_scope: whether the sender may give the ledger verdicts (an API key with the `ledger`
    scope; offline tools may). Without it, the runs remember the first event it stored
    (Run.unverified_from_seq): traced writes' results from there on are evidence, not verdicts.

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
        runs_touched = _store_atomic(tenant, valid, verdicts, ledger_scope)
        transaction.on_commit(lambda: detection_enqueue(runs_touched), robust=True)
    return IngestResult(verdicts=[v for v in verdicts if v is not None], runs_touched=runs_touched)


# The unique index that finds an event_id already stored for its run (ingest.models.Event).
EVENT_ID_CONSTRAINT = "event_run_event_id_uniq"


def _store_atomic(
    tenant: Tenant, valid: list[_Valid], verdicts: list[Verdict | None], ledger_scope: bool
) -> list[int]:
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
                return _store(tenant, valid, verdicts, check_stored=False, ledger_scope=ledger_scope)
        except Exception as exc:
            if not _is_event_id_conflict(exc):
                raise
    with transaction.atomic():
        return _store(tenant, valid, verdicts, check_stored=True, ledger_scope=ledger_scope)


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
    "unverified_from_seq",
]
# What only run_started (agent ... labels) and run_finished (status ... finished_at) set.
STARTED_FIGURES = ("agent", "task_type", "backend", "model", "budgets", "labels")
FINISHED_FIGURES = ("status", "terminated_by", "budget_type", "reason", "finished_at")


def _set_based() -> bool:
    """Whether a batch is stored with PostgreSQL's own statements, each one for all the batch's runs
    (_store_set), rather than through the ORM (_store_orm: SQLite; the parity test runs it on
    PostgreSQL too and compares the rows)."""
    return connection.vendor == "postgresql"


def _store(
    tenant: Tenant,
    valid: list[_Valid],
    verdicts: list[Verdict | None],
    *,
    check_stored: bool,
    ledger_scope: bool = True,
) -> list[int]:
    """Store the valid events in the caller's transaction: create the runs that are new, lock every
    touched run (in pk order), drop events already stored (check_stored), number the rest per run,
    insert them, update the runs' figures and create the new runs' detection cursors. Returns the
    pks of the runs that got events."""
    store = _store_set if _set_based() else _store_orm
    return store(tenant, valid, verdicts, check_stored=check_stored, ledger_scope=ledger_scope)


# --- storing a batch on PostgreSQL: one statement per step for all the batch's runs -------------
#
# The cost of a batch was per run it touched: a batch of 1,000 events over 1,000 runs reached a
# quarter of a raw COPY of its rows, one over 20 runs two thirds. Per run the database probed the
# run's unique index in an INSERT ... ON CONFLICT (a sequence value spent on each), locked and read
# twenty columns, and wrote the whole row back, usually not as a HOT update (a page full of runs
# all updated by the same statement had no room for their new versions: the table's fillfactor,
# migration 0013, leaves it). Now one round trip creates only the missing runs and locks them all,
# reading the six columns numbering and pricing need; the UPDATE merges the batch's own figures
# (counts added, earliest start, latest event, description set only by run_started and
# run_finished) into the stored ones.


class _RunBatch:
    """A locked run (pk, the events it holds, its cost, backend and model) and what this batch adds
    to it. The counts are the batch's own (the UPDATE adds them); cost_usd is the new total, summed
    event by event from the stored one as _run_apply sums it, so both paths store the same float.
    `described` holds the description fields the batch's run_started / run_finished set."""

    __slots__ = (
        "backend",
        "cost_usd",
        "described",
        "events_count",
        "input_tokens",
        "last_event_at",
        "model",
        "output_tokens",
        "pk",
        "rounds",
        "started_at",
        "tool_calls",
        "tool_errors",
        "unverified_from_seq",
    )

    def __init__(self, pk: int, events_count: int, cost_usd: float, backend: str, model: str) -> None:
        self.pk = pk
        self.events_count = events_count
        self.cost_usd = cost_usd
        self.backend = backend
        self.model = model
        self.started_at = self.last_event_at = self.unverified_from_seq = None
        self.rounds = self.tool_calls = self.tool_errors = self.input_tokens = self.output_tokens = 0
        self.described: dict[str, Any] | None = None


def _batch_apply(run: _RunBatch, event: dict[str, Any], ts: datetime) -> bool:
    """Fold one event into what the batch adds to its run, as _run_apply folds it into a Run. True
    when it is a model round whose cost must be priced."""
    kind = event["type"]
    if run.started_at is None or ts < run.started_at:
        run.started_at = ts
    if run.last_event_at is None or ts > run.last_event_at:
        run.last_event_at = ts
    if kind == "model_round":
        if event["round"] > run.rounds:
            run.rounds = event["round"]
        run.input_tokens += event.get("input_tokens", 0)
        run.output_tokens += event.get("output_tokens", 0)
        if "cost_usd" in event:
            run.cost_usd = min(run.cost_usd + event["cost_usd"], MAX_TOTAL_USD)
            return False
        return True
    if kind == "tool_call":
        run.tool_calls += 1
    elif kind == "tool_result":
        if event["status"] != "ok":
            run.tool_errors += 1
    elif kind == "run_started":
        described = run.described if run.described is not None else {}
        for name in STARTED_FIGURES:
            if name in event:
                described[name] = event[name]
        run.backend = event.get("backend", run.backend)
        run.model = event.get("model", run.model)
        run.described = described
    elif kind == "run_finished":
        described = run.described if run.described is not None else {}
        described["status"] = event["status"]
        described["terminated_by"] = event.get("terminated_by", "")
        described["budget_type"] = event.get("budget_type", "")
        described["reason"] = event.get("reason", "")
        described["finished_at"] = ts
        run.described = described
    return False


def _store_set(
    tenant: Tenant,
    valid: list[_Valid],
    verdicts: list[Verdict | None],
    *,
    check_stored: bool,
    ledger_scope: bool,
) -> list[int]:
    """_store on PostgreSQL: whatever the number of runs, one round trip creates and locks them, one
    reads the prices the batch needs (if any), one COPY stores the events and one UPDATE writes the
    figures (with the new runs' cursors)."""
    locked = _runs_take(tenant.pk, sorted({item[1]["run_id"] for item in valid}))[1]
    runs = {run_id: _RunBatch(*figures) for run_id, *figures in locked}
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
    changed: dict[int, _RunBatch] = {}
    for index, event, ts, body in valid:
        run = runs[event["run_id"]]
        run_pk = run.pk
        event_id = event.get("event_id")
        if stored and event_id is not None and (run_pk, event_id) in stored:
            verdicts[index] = {"index": index, "status": "duplicate"}
            continue
        seq = run.events_count = run.events_count + 1
        if not ledger_scope and run.unverified_from_seq is None:
            run.unverified_from_seq = seq
        rows.append((run_pk, seq, event_id, event["type"], ts, body))
        if _batch_apply(run, event, ts):
            unpriced[run_pk].append((event.get("input_tokens", 0), event.get("output_tokens", 0)))
        changed[run_pk] = run
        verdicts[index] = {"index": index, "status": "accepted"}
    if not rows:
        if fresh:
            _insert_missing(RunCursor, RunCursor(), "run_id", fresh)
        return []
    if unpriced:
        _price(changed, unpriced, _PriceBook)
    # Each run's rows together (in seq order: the sort is stable), as its index entries lie.
    rows.sort(key=_BY_RUN)
    _events_insert(tenant.pk, rows)
    _runs_merge(list(changed.values()), fresh)
    return list(changed)


def _price(changed: dict, unpriced: dict[int, list[tuple[int, int]]], book_class: type[PriceBook]) -> None:
    """Add the cost of the model rounds that came without one, from the price table."""
    book = book_class({(changed[pk].backend, changed[pk].model) for pk in unpriced})
    for pk, usage in unpriced.items():
        run = changed[pk]
        price = book.price(run.backend, run.model)
        run.cost_usd = min(run.cost_usd + sum(price.cost(i, o) for i, o in usage), MAX_TOTAL_USD)


@functools.cache
def _take_sql() -> tuple[str, str]:
    """The INSERT of a batch's missing runs (RETURNING their pks) and the lock of all its runs, which
    reads what numbering and pricing need: (pk, events_count, cost_usd, backend, model) by run_id."""
    quote = connection.ops.quote_name
    table = quote(Run._meta.db_table)
    fields = [f for f in Run._meta.concrete_fields if f.attname != "run_id" and f is not Run._meta.auto_field]
    columns = ", ".join(quote(f.column) for f in fields)
    # The ids go as one JSON array (orjson writes it in microseconds; psycopg quoted an array
    # parameter element by element). WITH ORDINALITY ... ORDER BY: the rows go in in the order
    # given (sorted), whatever the plan, so two batches creating the same runs wait, not deadlock.
    # NOT EXISTS first: a run that exists costs one probe of its index, not a speculative insert
    # (and a sequence value).
    insert = (
        f"INSERT INTO {table} ({columns}, run_id) SELECT {'%s, ' * len(fields)}u.k "
        "FROM json_array_elements_text(%s::json) WITH ORDINALITY AS u(k, n) "
        f"WHERE NOT EXISTS (SELECT FROM {table} r WHERE r.tenant_id = %s AND r.run_id = u.k) "
        "ORDER BY u.n ON CONFLICT DO NOTHING RETURNING id"
    )
    lock = (
        f"SELECT run_id, id, events_count, cost_usd, backend, model FROM {table} "
        "WHERE tenant_id = %s AND run_id IN (SELECT json_array_elements_text(%s::json)) "
        "ORDER BY id FOR NO KEY UPDATE"
    )
    return insert, lock


def _runs_take(tenant_pk: int, run_ids: list[str]) -> tuple[list[int], list[tuple]]:
    """Create the runs among these (sorted) that are not stored, then lock them all in pk order, in
    one round trip (PostgreSQL): (pks created, [(run_id, pk, events_count, cost_usd, backend, model)]).

    Inserts first, then locks: a batch waits on another's new run only while it holds no lock, and
    locks in pk order, so concurrent batches sharing runs cannot deadlock. Row locks take no slot of
    PostgreSQL's shared lock table, whatever the number of runs."""
    insert, lock = _take_sql()
    template = Run(tenant_id=tenant_pk)
    fields = [f for f in Run._meta.concrete_fields if f.attname != "run_id" and f is not Run._meta.auto_field]
    defaults = [f.get_db_prep_save(f.pre_save(template, add=True), connection) for f in fields]
    ids = orjson.dumps(run_ids).decode()
    created, locked = statements_run([(insert, [*defaults, ids, tenant_pk]), (lock, [tenant_pk, ids])])
    return [row[0] for row in created or ()], locked or []


@functools.cache
def _merge_sql() -> str:
    """The UPDATE that merges a batch's figures (one JSON object per run) into the stored ones."""
    quote = connection.ops.quote_name
    types = {f.attname: f.db_type(connection) for f in Run._meta.concrete_fields}
    added = ("tool_calls", "tool_errors", "input_tokens", "output_tokens")
    merge = {
        "events_count": "v.{0}",
        "cost_usd": "v.{0}",
        "rounds": "GREATEST(r.{0}, v.{0})",
        "started_at": "LEAST(r.{0}, v.{0})",  # NULLs are ignored: a new run takes the batch's
        "last_event_at": "GREATEST(r.{0}, v.{0})",
        # The first seq a key without the ledger scope stored: the stored one when set.
        "unverified_from_seq": "COALESCE(r.{0}, v.{0})",
        **{name: "r.{0} + v.{0}" for name in added},
        # Set only by run_started / run_finished: the stored value when the batch sends none.
        **{name: "COALESCE(v.{0}, r.{0})" for name in (*STARTED_FIGURES, *FINISHED_FIGURES)},
    }
    assert set(merge) == set(RUN_FIGURES)
    assignments = ", ".join(f"{quote(name)} = " + merge[name].format(quote(name)) for name in RUN_FIGURES)
    record = ", ".join(f"{quote(name)} {types[name]}" for name in ("id", *RUN_FIGURES))
    return (
        f"UPDATE {quote(Run._meta.db_table)} AS r SET {assignments} "
        f"FROM json_to_recordset(%s::json) AS v({record}) WHERE r.id = v.id"
    )


_FLOAT_TEXT = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _runs_merge(runs: list[_RunBatch], fresh: list[int]) -> None:
    """Write the batch's figures into its runs with one UPDATE, and create the fresh runs' detection
    cursors in its WITH clause (PostgreSQL)."""
    data = []
    for run in runs:
        cost = run.cost_usd
        row = {
            "id": run.pk,
            "events_count": run.events_count,
            "cost_usd": cost if math.isfinite(cost) else _FLOAT_TEXT.get(cost, "NaN"),  # JSON has none
            "started_at": run.started_at,
            "last_event_at": run.last_event_at,
            "rounds": run.rounds,
            "tool_calls": run.tool_calls,
            "tool_errors": run.tool_errors,
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
        }
        if run.unverified_from_seq is not None:
            row["unverified_from_seq"] = run.unverified_from_seq
        if run.described is not None:
            row.update(run.described)
        data.append(row)
    sql = _merge_sql()
    params: list = [orjson.dumps(data).decode()]
    if fresh:
        cursor_sql, cursor_params = _insert_missing_sql(RunCursor, RunCursor(), "run_id", fresh)
        sql = f"WITH cursors AS ({cursor_sql}) {sql}"
        params = [*cursor_params, *params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def runs_hold(*, tenant: Tenant, run_ids: list[str]) -> list[int]:
    """Hold these runs of the tenant for the caller's transaction, as a batch's ingest holds them:
    the runs not stored yet are created (empty) and every one is locked by its row. A run that does
    not exist yet is held too (its row, inserted, is locked until the commit); another transaction
    holding the same runs, an export or a REST batch, waits, and none can deadlock (_runs_take).
    Returns the pks of the runs it created: the caller drops those it left empty
    (runs_drop_empty). On SQLite the transaction itself is the lock (IMMEDIATE): nothing to do."""
    if connection.vendor != "postgresql" or not run_ids:
        return []
    return _runs_take(tenant.pk, sorted(set(run_ids)))[0]


def runs_drop_empty(*, run_pks: list[int]) -> None:
    """Delete the runs among these that hold no event (created by runs_hold and left empty)."""
    if run_pks:
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {Run._meta.db_table} WHERE id = ANY(%s) AND events_count = 0", [run_pks]
            )


# --- storing a batch through the ORM (SQLite) ----------------------------------------------------


def _store_orm(
    tenant: Tenant,
    valid: list[_Valid],
    verdicts: list[Verdict | None],
    *,
    check_stored: bool,
    ledger_scope: bool,
) -> list[int]:
    """_store with model instances: the runs created by one INSERT, locked (on SQLite the
    transaction is the lock) and read whole, folded event by event (_run_apply), written back
    with one UPDATE per run."""
    run_ids = sorted({item[1]["run_id"] for item in valid})
    # Inserts in run_id order, then locks in pk order: two batches touching the same runs never deadlock.
    _insert_missing(Run, Run(tenant=tenant), "run_id", run_ids)
    runs = {
        run.run_id: run
        for run in Run.objects.select_for_update().filter(tenant=tenant, run_id__in=run_ids).order_by("pk")
    }
    fresh = [run.pk for run in runs.values() if run.events_count == 0]
    stored: set[tuple[int, str]] = set()
    if check_stored:
        older = {run.pk for run in runs.values() if run.events_count}
        event_ids = {
            event["event_id"]
            for _, event, _, _ in valid
            if "event_id" in event and runs[event["run_id"]].pk in older
        }
        stored = _events_stored(older, event_ids) if event_ids else set()
    rows: list[tuple] = []
    unpriced: dict[int, list[tuple[int, int]]] = defaultdict(list)
    changed: dict[int, Run] = {}
    for index, event, ts, body in valid:
        run = runs[event["run_id"]]
        event_id = event.get("event_id")
        if stored and event_id is not None and (run.pk, event_id) in stored:
            verdicts[index] = {"index": index, "status": "duplicate"}
            continue
        seq = run.events_count = run.events_count + 1
        if not ledger_scope and run.unverified_from_seq is None:
            run.unverified_from_seq = seq
        rows.append((run.pk, seq, event_id, event["type"], ts, body))
        if _run_apply(run, event, ts):
            unpriced[run.pk].append((event.get("input_tokens", 0), event.get("output_tokens", 0)))
        changed[run.pk] = run
        verdicts[index] = {"index": index, "status": "accepted"}
    if fresh:
        _insert_missing(RunCursor, RunCursor(), "run_id", fresh)
    if not rows:
        return []
    if unpriced:
        _price(changed, unpriced, PriceBook)
    Event.objects.bulk_create(
        [
            Event(tenant_id=tenant.pk, run_id=r, seq=s, event_id=e, type=k, ts=ts, body=orjson.loads(b))
            for r, s, e, k, ts, b in rows
        ],
        batch_size=500,
    )
    # One UPDATE per run (executemany), not bulk_update(): its CASE ... WHEN expressions cost Django
    # ~2 ms of CPU per run, most of a batch.
    fields = [Run._meta.get_field(name) for name in RUN_FIGURES]
    assignments = ", ".join(f"{connection.ops.quote_name(f.column)} = %s" for f in fields)
    sql = f"UPDATE {connection.ops.quote_name(Run._meta.db_table)} SET {assignments} WHERE id = %s"
    params = [[_db_value(f, getattr(run, f.attname)) for f in fields] + [run.pk] for run in changed.values()]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
    return list(changed)


_BY_RUN = operator.itemgetter(0)


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


def _db_value(field, value: Any) -> Any:
    kind = field.get_internal_type()
    if kind == "JSONField":
        return orjson.dumps(value).decode()
    if kind == "DateTimeField":
        return connection.ops.adapt_datetimefield_value(value)
    return value


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
            run.cost_usd = min(run.cost_usd + event["cost_usd"], MAX_TOTAL_USD)
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
    """One binary COPY (PostgreSQL; _store_orm uses bulk_create).

    rows: (run pk, seq, event_id, type, ts, body). The binary rows are built here rather than by
    copy.write_row(): that formatted and escaped every value, and PostgreSQL then parsed the text
    back; binary spares both sides most of it (the body is JSON text either way).
    """
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


def detection_enqueue(run_pks: list[int], *, force: bool = False, delay_s: float = 0) -> None:
    """Queue detection for the runs a batch touched: they join the runs waiting in Redis, and a
    detect_pending task is queued when none is (ingest.pending says why), or always with `force`
    (the sweep: a flag may be left by a command that timed out, or by a process that died), to run
    after `delay_s`.

    Called in the request's thread after the commit, it holds the request at most about
    enqueue_timeout_s: Redis not answering in time, the runs are handed to this process's requeue
    thread, which adds them again (and queues a task) once Redis answers. The message is sent from
    one long-lived thread per process: under ASGI each request runs in a new thread, and Celery
    builds its result backend once per thread, a quarter of the CPU of a send. The request waits
    for the send at most enqueue_timeout_s too; a send that fails hands its runs to the requeue.
    Eager (no broker), the task runs here, in the request's thread, for these runs.
    """
    from redis import RedisError

    from ingest.tasks import detect_runs

    if detect_runs.app.conf.task_always_eager:
        if run_pks:
            detect_runs.delay(run_pks)
        return
    try:
        if not pending_add(run_pks, force=force):
            return  # a task is queued and will take them
    except RedisError as exc:
        if _requeue.add(run_pks):  # the first of an outage: the requeue says when it is over
            logger.warning("enqueueing runs: Redis did not answer (%s); adding them again later", exc)
        return
    sent = _publisher().submit(_detect_pending_send, run_pks, delay_s)
    with contextlib.suppress(FuturesTimeout):
        sent.result(timeout=enqueue_timeout_s())  # else still sending; the requeue has it if it fails


def _detect_pending_send(run_pks: list[int], delay_s: float = 0) -> None:
    from ingest.tasks import detect_pending

    try:
        if delay_s:
            detect_pending.apply_async(countdown=delay_s)
        else:
            detect_pending.delay()
    except Exception as exc:  # the broker is away: our flag is set and no task queued
        logger.warning("queueing detection of %d runs failed (%s); trying again later", len(run_pks), exc)
        _requeue.add(run_pks)


class _Requeue:
    """Runs whose enqueue got no answer from Redis, added again by a thread of this process.

    1. `add` keeps the runs (up to HELD_MAX; past that the sweep finds them from their cursors)
       and wakes the thread.
    2. The thread adds them all with the flag forced and queues a task; Redis still away, it tries
       again every RETRY_S, for at most GIVE_UP_S (the sweep has them then too).
    """

    HELD_MAX = 100_000
    RETRY_S = 0.5
    GIVE_UP_S = 300.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: set[int] = set()
        self._since = 0.0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, run_pks: list[int]) -> bool:
        """Keep the runs; True when none were kept before."""
        with self._lock:
            first = not self._runs
            if first:
                self._since = time.monotonic()
            room = self.HELD_MAX - len(self._runs)
            self._runs.update(run_pks[: max(0, room)])
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="detection-requeue", daemon=True)
                self._thread.start()
        self._wake.set()
        return first

    def held(self) -> int:
        with self._lock:
            return len(self._runs)

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()

    def _loop(self) -> None:
        from ingest.tasks import detect_pending

        failing = False
        while True:
            self._wake.wait()
            with self._lock:  # cleared under the lock: an `add` after this wakes the loop again
                runs, since = sorted(self._runs), self._since
                if not runs:
                    self._wake.clear()
            if not runs:
                continue
            try:
                pending_add(runs, force=True)
                detect_pending.delay()
            except Exception as exc:  # Redis still away (redis-py's or kombu's errors, or OSError)
                if not failing:
                    logger.warning(
                        "adding %d runs again: %s: %s; trying every %s s",
                        len(runs),
                        type(exc).__name__,
                        exc,
                        self.RETRY_S,
                    )
                failing = True
                if time.monotonic() - since > self.GIVE_UP_S:
                    logger.warning("gave up adding %d runs again; the sweep finds them", len(runs))
                    with self._lock:
                        self._runs.difference_update(runs)
                time.sleep(self.RETRY_S)
                continue
            logger.log(logging.WARNING if failing else logging.INFO, "added %d runs again", len(runs))
            failing = False
            with self._lock:
                self._runs.difference_update(runs)


_requeue = _Requeue()
_publisher_pool: ThreadPoolExecutor | None = None
_publisher_lock = threading.Lock()


RETRY_AFTER_FAILURE_S = 10  # a detect_pending task that failed so is queued again this much later


def runs_pending_process(*, budget_s: float = TASK_BUDGET_S, take: int = TAKE) -> int:
    """The detect_pending task: take the runs waiting in Redis and process them, pass after pass,
    until none is left or `budget_s` has passed; then queue the next task if runs are left.

    Runs taken by a pass that fails go back into the set before the error goes on, with the next
    task RETRY_AFTER_FAILURE_S later: a run's own failure is quarantined inside the pass, so what
    comes out here is everyone's (the database gone, the time limit), and at once would loop hot.
    """
    started = time.monotonic()
    total = 0
    run_pks = pending_take(limit=take, starting=True)
    while run_pks:
        try:
            total += runs_process(run_pks=run_pks, skip_locked=True)
        except BaseException:
            detection_enqueue(run_pks, delay_s=RETRY_AFTER_FAILURE_S)
            raise
        if time.monotonic() - started > budget_s:
            if pending_count():
                detection_enqueue([])
            break
        run_pks = pending_take(limit=take)
    return total


def _publisher() -> ThreadPoolExecutor:
    global _publisher_pool
    if _publisher_pool is None:
        with _publisher_lock:
            if _publisher_pool is None:
                _publisher_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="detection-publisher")
    return _publisher_pool


def _publisher_forget() -> None:
    """In a forked child the parent's threads do not exist: start new ones when needed."""
    global _publisher_pool, _publisher_lock, _requeue
    _publisher_pool, _publisher_lock, _requeue = None, threading.Lock(), _Requeue()


os.register_at_fork(after_in_child=_publisher_forget)


# --- per-run processing ---------------------------------------------------------------------

SHADOW = "shadow"  # among the actions to publish of a run: its detections of kinds in shadow
PROCESS_CHUNK = 2000  # events per pass: bounds a task's memory and lock time on a huge backlog
# A pass of several runs gives each chunk // runs events, but at least this many: fifty runs behind
# still go 200 events a pass each, not 40.
RUN_CHUNK_MIN = 200
RUN_FIELDS = (
    *("tenant_id", "backend", "model", "task_type", "run_id", "agent", "first_loop_seq"),
    "unverified_from_seq",
)

_Events = list[tuple[int, str, datetime, dict]]


def run_process(*, run_pk: int, chunk: int = PROCESS_CHUNK, deadline: float | None = None) -> int:
    """Process a run's events after its cursor, once and in order: runs_process of this one run
    (which waits for the run's lock, unless a deadline is given). Returns how many it processed."""
    return runs_process(run_pks=[run_pk], chunk=chunk, skip_locked=deadline is not None, deadline=deadline)


def runs_process(
    *,
    run_pks: Iterable[int],
    chunk: int = PROCESS_CHUNK,
    skip_locked: bool = False,
    deadline: float | None = None,
) -> int:
    """Process the events after the cursors of several runs, each once and in order, in passes that
    take the runs together: a pass costs the same dozen queries for one run as for fifty (a task
    of interleaved traffic brings a few events of each of ~50 runs). Returns how many it processed.

    1. Lock the runs' cursor rows with one statement, in pk order (two tasks cannot deadlock; a
       second task for the same run waits here, then finds nothing). With skip_locked, runs that
       another task holds are passed over and taken at the end with a lock that waits: that task
       may have read its events before those this task was queued for were stored.
    2. Read the runs' events after their cursors, in seq order, at most `chunk` in all (but
       RUN_CHUNK_MIN of each run at least), with one query, and the runs with another.
    3. Build model rounds and tool calls (_materialize), joining each result to the most recent
       unanswered call with its call_id; a result without a call is kept and joined when the call
       comes. The pass's traced writes go to the ledger together.
    4. Feed each run's events to the engine from where it stopped; store the detections, then the
       runs' figures and cursors, one statement each for all the runs (_detect); commit; publish
       the alerts.
    5. Again for the runs that had more events than their share, until every run is caught up.

    deadline (time.monotonic()): no pass starts after it, and runs another task holds are waited for
    only until it (a lock_timeout): the work left is the Celery task's, and the guard answers within
    its time budget this way. A task holding the run is usually in the middle of a pass of the very
    events the check needs, so the check waits for that pass rather than answer without them.
    """
    order = list(dict.fromkeys(run_pks))
    cache = _PassCache()
    total = 0
    passed_over: list[int] = []
    lock_wait_s: float | None = None
    while order:
        try:
            processed, order, skipped = _runs_pass(order, chunk, skip_locked, cache, lock_wait_s=lock_wait_s)
        except OperationalError as exc:
            if lock_wait_s is None or not isinstance(exc.__cause__, LockNotAvailable):
                raise
            break  # still held at the deadline: answered from the state the other task left
        total += processed
        passed_over += skipped
        if deadline is not None and time.monotonic() >= deadline:
            break
        if not order:
            order, passed_over, skip_locked = passed_over, [], False
            if deadline is not None:
                lock_wait_s = deadline - time.monotonic()
    return total


class _PassCache:
    """What one runs_process call reads once for all its passes: thresholds and tools per scope
    (so a change in the admin applies from the next task on), prices per (backend, model)."""

    def __init__(self, pairs: set[tuple[str, str]] | None = None) -> None:
        self.pairs = pairs or set()
        self.configs: dict[Scope, Config] = {}
        self.book: PriceBook | None = None  # on PostgreSQL read with the first pass's runs

    def config(self, run: Run) -> Config:
        return self.configs[(run.tenant_id, run.backend, run.model, run.task_type)]

    def load_configs(self, runs: list[Run]) -> None:
        self.pairs |= {(run.backend, run.model) for run in runs}
        missing = {
            (run.tenant_id, run.backend, run.model, run.task_type) for run in runs
        } - self.configs.keys()
        if missing:
            self.configs.update(configs_for(scopes=missing))

    def price(self, backend: str, model: str) -> Price:
        if self.book is None:  # elsewhere than PostgreSQL: the backends of all the task's runs
            self.book = PriceBook(self.pairs)
        return self.book.price(backend, model)


# A run whose processing raises is quarantined: passed over until its next try, QUARANTINE_FIRST_S
# later, then twice as long after each further failure, at most QUARANTINE_MAX_S. detect_sweep (Celery
# beat, every minute) and the run's next batch queue it again once it is due. Long enough that a run
# that always fails costs a pass now and then, not a pass a second; short enough that a run broken
# by a passing fault (a bug fixed by a deploy) is back within minutes.
QUARANTINE_FIRST_S = 60
QUARANTINE_MAX_S = 6 * 3600
QUARANTINE_ERROR_CHARS = 500

# Failures that are not a run's fault: the task's time limit, the database gone. They go on up (the
# task fails, its runs are queued again) rather than quarantining every run of the pass.
_NOT_THE_RUNS = (SoftTimeLimitExceeded, OperationalError, InterfaceError)


@dataclass
class _PassOutcome:
    runs: list[Run] = field(default_factory=list)
    events: dict[int, _Events] = field(default_factory=dict)
    alerts: list[tuple[int, dict]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


def _runs_pass(
    order: list[int], chunk: int, skip_locked: bool, cache: _PassCache, *, lock_wait_s: float | None = None
) -> tuple[int, list[int], list[int]]:
    """One pass of runs_process: (events processed, runs with more to do, runs passed over).

    All the runs together in one savepoint, the fast way. When that raises, its work is rolled back
    and the runs are taken again one at a time, each in a savepoint of its own: a run that raises
    alone is quarantined (_quarantine), the others are processed as if it had not been there. One
    run's bad data thus costs one wasted pass, not every run's detection.

    lock_wait_s: on PostgreSQL, waiting for a lock longer than this raises (LockNotAvailable).
    """
    limit = chunk if len(order) <= 1 else max(chunk // len(order), RUN_CHUNK_MIN)
    with transaction.atomic():
        if lock_wait_s is not None and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('lock_timeout', %s, true)", [f"{max(1, int(lock_wait_s * 1000))}ms"]
                )
        try:
            with transaction.atomic():
                outcome = _pass_run(order, limit, skip_locked, cache)
        except _NOT_THE_RUNS:
            raise
        except Exception as exc:
            outcome = _PassOutcome()
            if len(order) == 1:
                _quarantine(order[0], exc)
            else:
                for run_pk in order:
                    try:
                        with transaction.atomic():
                            alone = _pass_run([run_pk], limit, skip_locked, cache)
                    except _NOT_THE_RUNS:
                        raise
                    except Exception as run_exc:
                        _quarantine(run_pk, run_exc)
                        continue
                    outcome.runs += alone.runs
                    outcome.events.update(alone.events)
                    outcome.alerts += alone.alerts
                    outcome.skipped += alone.skipped
    if outcome.alerts:
        alerts_publish_all(alerts=outcome.alerts)
    runs, events = outcome.runs, outcome.events
    processed = sum(len(events[run.pk]) for run in runs)
    return processed, [run.pk for run in runs if len(events[run.pk]) >= limit], outcome.skipped


def _pass_run(order: list[int], limit: int, skip_locked: bool, cache: _PassCache) -> _PassOutcome:
    """Steps 1 to 4 of runs_process for these runs, in the caller's transaction."""
    cursors, events, found = _pass_read(order, limit, skip_locked, cache)
    skipped = [pk for pk in order if pk not in cursors] if skip_locked else []
    runs = [found[pk] for pk in order if pk in cursors and pk in events and pk in found]
    if not runs:
        return _PassOutcome(skipped=skipped)
    cache.load_configs(runs)
    # OTLP rounds and calls are numbered by their spans' start times (ingest.otlp.rounds).
    numbering = rounds_number(
        {run.pk: events[run.pk] for run in runs},
        fresh={run.pk for run in runs if not cursors[run.pk].position},
    )
    duplicates = _materialize(runs, events, cache, numbering)
    alerts = _detect(runs, cursors, events, duplicates, cache, numbering)
    return _PassOutcome(runs=runs, events=events, alerts=alerts, skipped=skipped)


def _quarantine(run_pk: int, exc: BaseException) -> None:
    """Mark the run's cursor failed once more, with why and when to try again (doubling waits)."""
    reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:QUARANTINE_ERROR_CHARS]
    now = timezone.now()
    failures = (
        RunCursor.objects.select_for_update().filter(run_id=run_pk).values_list("failures", flat=True).first()
    )
    if failures is None:
        return
    failures += 1
    wait = min(QUARANTINE_FIRST_S * 2 ** min(failures - 1, 20), QUARANTINE_MAX_S)
    retry_at = now + timedelta(seconds=wait)
    RunCursor.objects.filter(run_id=run_pk).update(
        failures=failures, error=reason, failed_at=now, retry_at=retry_at, updated_at=now
    )
    metrics.detection_quarantined()
    logger.warning(
        "run %s: detection failed (%d in a row), quarantined until %s: %s",
        run_pk,
        failures,
        retry_at.isoformat(),
        reason,
        exc_info=exc,
    )


@dataclass(slots=True)
class _CursorRow:
    """A locked cursor as a pass reads it (PostgreSQL; elsewhere RunCursor instances)."""

    position: int
    processed: int
    engine_state: dict | None


# PostgreSQL: the cursors locked in pk order (the engine state, the biggest value a pass reads, is
# decoded by orjson, several times faster than the JSONField's json.loads: jsonb arrives as text),
# then each run's next events after its cursor, `limit` at most, by the (run, seq) index (the
# subquery takes the rows the first statement locked), then the runs.
# Runs quarantined and not yet due are left out (failures > 0 and retry_at after now).
_CURSORS_LOCK_SQL = (
    f"SELECT run_id, position, processed, engine_state FROM {RunCursor._meta.db_table} "
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


def _pass_read(
    order: list[int], limit: int, skip_locked: bool, cache: _PassCache
) -> tuple[dict[int, _CursorRow | RunCursor], dict[int, _Events], dict[int, Run]]:
    """Lock the runs' cursors, read their events after them (at most `limit` each) and the runs:
    ({run pk: cursor}, {run pk: events in seq order}, {run pk: run}). On PostgreSQL in one round
    trip, with the prices of the runs' backends the first time."""
    now = timezone.now()
    if connection.vendor != "postgresql":
        due = models.Q(failures=0) | models.Q(retry_at__lte=now)
        cursors = {
            cursor.run_id: cursor
            for cursor in RunCursor.objects.select_for_update()
            .filter(due, run_id__in=order)
            .order_by("run_id")
        }
        events = _events_after(cursors, limit) if cursors else {}
        return cursors, events, Run.objects.only(*RUN_FIELDS).in_bulk(list(events))
    skip = " SKIP LOCKED" if skip_locked else ""
    locked, rows, runs, prices = statements_run(
        [
            (_CURSORS_LOCK_SQL.format(skip=skip), [order, now]),
            (_EVENTS_AFTER_SQL.format(skip=skip), [order, now, limit]),
            (_RUNS_SQL, [order]),
            None if cache.book is not None else (_PriceBook.RUNS_SQL, [order]),
        ]
    )
    loads = orjson.loads
    cursors = {
        pk: _CursorRow(position, processed, loads(state) if isinstance(state, str | bytes) else state)
        for pk, position, processed, state in locked or ()
    }
    events: dict[int, _Events] = defaultdict(list)
    for run_pk, seq, kind, ts, body in rows or ():
        # A run let go between the two statements is locked by the second only: left for later.
        if run_pk in cursors:
            events[run_pk].append((seq, kind, ts, loads(body) if isinstance(body, str | bytes) else body))

    if prices is not None:
        cache.book = _PriceBook(rows=prices)
    return cursors, events, {row[0]: Run.from_db(connection.alias, _RUN_COLUMNS, row) for row in runs or ()}


def _events_after(cursors: dict[int, RunCursor], limit: int) -> dict[int, _Events]:
    """Each run's events after its cursor, in seq order, at most `limit` of each, in one query
    (elsewhere than PostgreSQL)."""
    found: dict[int, _Events] = defaultdict(list)
    after = functools.reduce(
        operator.or_, (models.Q(run_id=pk, seq__gt=c.position) for pk, c in cursors.items())
    )
    rank = models.Window(RowNumber(), partition_by="run_id", order_by="seq")
    rows = (
        Event.objects.filter(after)
        .annotate(rank=rank)
        .filter(rank__lte=limit)
        .order_by("run_id", "seq")
        .values_list("run_id", "seq", "type", "ts", "body")
    )
    for run_pk, seq, kind, ts, body in rows:
        found[run_pk].append((seq, kind, ts, body))
    return found


def run_reprocess(*, run_pk: int) -> int:
    """Process a run again from its first event (after a fix or a threshold change).

    Rounds and calls are rebuilt; detections already stored are kept and not stored twice.
    """
    with transaction.atomic():
        cursor = RunCursor.objects.select_for_update().get(run_id=run_pk)
        ModelRound.objects.filter(run_id=run_pk).delete()
        ToolCall.objects.filter(run_id=run_pk).delete()
        PendingResult.objects.filter(run_id=run_pk).delete()
        # An operator's "process again" is also the try a quarantined run waits for: due now.
        cursor.position, cursor.engine_state, cursor.failures, cursor.retry_at = 0, None, 0, None
        cursor.save(update_fields=["position", "engine_state", "failures", "retry_at", "updated_at"])
        Run.objects.filter(pk=run_pk).update(cost_after_loop_usd=0)  # every round is counted again
    return run_process(run_pk=run_pk)


def _detect(
    runs: list[Run],
    cursors: dict[int, _CursorRow | RunCursor],
    events: dict[int, _Events],
    found_elsewhere: dict[int, list[Detection]],
    cache: _PassCache,
    numbering: Numbering,
) -> list[tuple[int, dict]]:
    """Feed each run's events to the engine from where it stopped; store what it finds, the runs'
    figures and the cursors, and the renumbered rounds of stored events (`numbering`).

    Returns the alerts to publish (interventions) once the transaction has committed, as
    (tenant_id, alert) in the runs' order.
    """
    rows: list[Detection] = []
    figures: list[dict[str, Any]] = []
    positions: list[dict[str, Any]] = []
    spans: dict[int, tuple[int, int, set[str]]] = {}  # run pk -> the seqs and actions to publish
    for run in runs:
        run_events, cursor = events[run.pk], cursors[run.pk]
        state = None
        if cursor.engine_state:
            try:
                state = RunState.from_dict(cursor.engine_state)
            except (TypeError, ValueError, KeyError):
                logger.warning("run %s: engine state unreadable, starting afresh", run.pk)
        state = state or RunState()
        engine = Engine(cache.config(run))
        found: list[Detection] = []
        first_loop_ts: datetime | None = None
        for seq, _kind, ts, body in run_events:
            for finding in engine.feed(state, body):
                found.append(
                    _run_detection(
                        run,
                        seq=seq,
                        kind=finding.kind,
                        action=finding.action,
                        signature=finding.signature,
                        tool=finding.tool,
                        count=finding.count,
                        at_call=finding.at_call,
                        at_round=finding.at_round,
                        evidence=finding.evidence,
                        hint=finding.hint,
                        ts=ts,
                    )
                )
                if finding.action != "observe" and first_loop_ts is None:
                    first_loop_ts = ts
        elsewhere = found_elsewhere.get(run.pk, [])
        found += elsewhere
        if elsewhere and first_loop_ts is None:
            first_loop_ts = elsewhere[0].ts
        rows += found
        figure: dict[str, Any] = {"id": run.pk, "last_progress_step": state.last_progress_step}
        if found:
            figure["counted"] = True
            figure["max_action"] = ACTIONS[state.max_action - 1] if state.max_action else ""
        if first_loop_ts is not None:
            figure["loop_flagged"] = True
            figure["first_loop_at"] = first_loop_ts
        first, burned = _loop_cost(run, run_events, found)
        if first is not None:
            figure["first_loop_seq"] = first
            if burned:
                figure["cost_after_loop_usd"] = burned
        if state.terminated_by:
            # What the engine concluded; the runtime's own run_finished, when it comes, says what happened.
            figure["terminated_by"], figure["budget_type"] = state.terminated_by, state.budget_type
        figures.append(figure)
        positions.append(
            {
                "run_id": run.pk,
                "position": run_events[-1][0],
                "processed": cursor.processed + len(run_events),
                "engine_state": state.to_dict(),
            }
        )
        actions = {row.action for row in found if row.action != "observe"}
        if any(row.action == "observe" and "shadow" in row.evidence for row in found):
            actions.add(SHADOW)  # what a kind in shadow would have done is an alert too
        if actions:
            spans[run.pk] = (run_events[0][0], run_events[-1][0], actions)
    published = None
    if spans:
        # The interventions to publish as stored (with their pks; those stored by an earlier pass
        # over the same events too), read after the INSERT.
        which = functools.reduce(
            operator.or_,
            (
                models.Q(run_id=pk, seq__gte=low, seq__lte=high)
                & (
                    models.Q(action__in=sorted(actions - {SHADOW}))
                    | (models.Q(evidence__has_key="shadow") if SHADOW in actions else models.Q(pk__in=[]))
                )
                for pk, (low, high, actions) in spans.items()
            ),
        )
        published = Detection.objects.filter(which).order_by("pk")
    stored: dict[int, list[Detection]] = defaultdict(list)
    for detection in _progress_save(rows, figures, positions, published, numbering):
        stored[detection.run_id].append(detection)
    if not stored:
        return []
    return [
        (run.tenant_id, alert_payload(detection, run=run)) for run in runs for detection in stored[run.pk]
    ]


def _loop_cost(run: Run, events: _Events, rows: list[Detection]) -> tuple[int | None, float]:
    """Money burned in a loop: the cost of the model rounds after the event that made the first
    intervention fire, whether it fired in this batch or an earlier one (the run's first_loop_seq).
    Each round is counted once, as its batch goes by; _materialize has priced every round's body.
    Returns (the seq of that event or None, the cost of this batch's rounds after it)."""
    first = min((row.seq for row in rows if row.action != Detection.Action.OBSERVE), default=None)
    if run.first_loop_seq is not None and (first is None or run.first_loop_seq < first):
        first = run.first_loop_seq
    if first is None:
        return None, 0.0
    burned = math.fsum(
        round_cost(body.get("cost_usd"))
        for seq, kind, _, body in events
        if kind == "model_round" and seq > first
    )
    return first, burned


def round_cost(value: Any) -> float:
    """A round's cost as the figures count it: within the cap the way in checks (MAX_COST_USD), so
    that no sum of them overflows (math.fsum raised on two rounds of 1e308 stored before the cap)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return 0.0
    return float(min(value, MAX_COST_USD))


# PostgreSQL: the pass's cursors and run figures in one statement. The runs are locked in pk order
# first, as ingest locks them (FOR NO KEY UPDATE: the pass's inserts hold KEY SHARE on them, which
# that lock does not wait for), so a pass and a batch cannot deadlock. A figure absent from a run's
# row keeps its stored value; first_loop_at and terminated_by are only set once.
_PROGRESS_SQL = f"""
WITH positions AS (
    UPDATE {RunCursor._meta.db_table} AS c
    SET position = v.position, processed = v.processed, engine_state = v.engine_state, updated_at = %s,
        failures = 0, error = '', failed_at = NULL, retry_at = NULL
    FROM jsonb_to_recordset(%s::jsonb)
        AS v(run_id bigint, position integer, processed integer, engine_state jsonb)
    WHERE c.run_id = v.run_id
), locked AS (
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
        THEN v.budget_type ELSE r.budget_type END
FROM jsonb_to_recordset(%s::jsonb) AS v(
    id bigint, last_progress_step integer, counted boolean, max_action text, loop_flagged boolean,
    first_loop_at timestamptz, first_loop_seq integer, cost_after_loop_usd double precision,
    terminated_by text, budget_type text
)
WHERE r.id = v.id AND r.id IN (SELECT id FROM locked)
"""


def _progress_save(
    rows: list[Detection],
    figures: list[dict[str, Any]],
    positions: list[dict[str, Any]],
    published: models.QuerySet[Detection] | None,
    numbering: Numbering,
) -> list[Detection]:
    """Store the detections (a run processed again stores none twice), write the runs' figures (as
    _detect gathered them), move their cursors, then read the `published` detections; on
    PostgreSQL in one round trip."""
    now = timezone.now()
    if connection.vendor == "postgresql":
        pks = sorted(figure["id"] for figure in figures)
        progress = [now, dumps_bounded(positions).decode(), pks, dumps_bounded(figures).decode()]
        *_, found = statements_run(
            [
                insert_statement(Detection, rows, ignore_conflicts=True),
                (_PROGRESS_SQL, progress),
                numbering.bodies_statement(),  # with the runs held (Numbering.bodies_statement)
                published.query.sql_with_params() if published is not None else None,
            ]
        )
        names = [f.attname for f in Detection._meta.concrete_fields]
        stored = [Detection.from_db(connection.alias, names, row) for row in found or ()]
        for detection in stored:  # jsonb arrives as text
            if isinstance(detection.evidence, str):
                detection.evidence = orjson.loads(detection.evidence)
        return stored
    Detection.objects.bulk_create(rows, ignore_conflicts=True)
    numbering.bodies_save()
    for position in positions:
        RunCursor.objects.filter(run_id=position["run_id"]).update(
            position=position["position"],
            processed=position["processed"],
            engine_state=position["engine_state"],
            updated_at=now,
            failures=0,
            error="",
            failed_at=None,
            retry_at=None,
        )
    for figure in figures:
        pk = figure["id"]
        values: dict[str, Any] = {"last_progress_step": figure["last_progress_step"]}
        if figure.get("counted"):
            values["detections_count"] = Detection.objects.filter(run_id=pk).count()
            values["max_action"] = figure["max_action"]
        if figure.get("loop_flagged"):
            values["loop_flagged"] = True
        if "first_loop_seq" in figure:
            values["first_loop_seq"] = figure["first_loop_seq"]
        if "cost_after_loop_usd" in figure:
            values["cost_after_loop_usd"] = Least(
                models.F("cost_after_loop_usd") + figure["cost_after_loop_usd"], models.Value(MAX_TOTAL_USD)
            )
        Run.objects.filter(pk=pk).update(**values)
        if "first_loop_at" in figure:
            Run.objects.filter(pk=pk, first_loop_at__isnull=True).update(
                first_loop_at=figure["first_loop_at"]
            )
        if "terminated_by" in figure:
            Run.objects.filter(pk=pk, terminated_by="").update(
                terminated_by=figure["terminated_by"], budget_type=figure["budget_type"]
            )
    return list(published) if published is not None else []


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
        # A kind in shadow: stored as observe, with the action it would have taken.
        "shadow": str(detection.evidence.get("shadow", "")) if isinstance(detection.evidence, dict) else "",
    }


def alerts_publish(*, tenant_id: int, alerts: list[dict]) -> None:
    """Send alerts to the tenant's Channels group. At most once: pages catch up from the database."""
    alerts_publish_all(alerts=[(tenant_id, alert) for alert in alerts])


def alerts_publish_all(*, alerts: list[tuple[int, dict]]) -> None:
    """Send (tenant_id, alert) pairs to their tenants' groups, in order, from one event loop (one
    connection to the channel layer for all of a pass's alerts). At most once, as alerts_publish."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None or not alerts:
        return

    async def send() -> None:
        for tenant_id, alert in alerts:
            await layer.group_send(alerts_group(tenant_id), {"type": ALERT_MESSAGE, "alert": alert})

    try:
        async_to_sync(send)()
    except Exception:  # a broken channel layer must not undo stored detections
        logger.exception("publishing %d alerts failed", len(alerts))


def _materialize(
    runs: list[Run], events: dict[int, _Events], cache: _PassCache, numbering: Numbering
) -> dict[int, list[Detection]]:
    """Model rounds and tool calls of a pass's events, every run's together. Returns the duplicate
    side effects the ledger found, by run pk."""
    result_ids: dict[int, set[str]] = defaultdict(set)
    call_ids: dict[int, set[str]] = defaultdict(set)
    for run in runs:
        for _, kind, _, body in events[run.pk]:
            if kind == "tool_result":
                result_ids[run.pk].add(body["call_id"])
            elif kind == "tool_call":
                call_ids[run.pk].add(body["call_id"])
    # Unanswered calls stored earlier, oldest first: a stack per (run, call_id) (the newest answers
    # first). Read for all the runs' call_ids at once, then kept for the run that asks.
    open_calls: dict[tuple[int, str], list[ToolCall]] = defaultdict(list)
    if result_ids:
        for call in ToolCall.objects.filter(
            run_id__in=list(result_ids),
            call_id__in=sorted(set().union(*result_ids.values())),
            result_seq__isnull=True,
        ).order_by("run_id", "seq"):
            if call.call_id in result_ids[call.run_id]:
                open_calls[(call.run_id, call.call_id)].append(call)
    # Results that came before their call, oldest first: a queue per (run, call_id).
    waiting: dict[tuple[int, str], list[PendingResult]] = defaultdict(list)
    if call_ids:
        for pending in PendingResult.objects.filter(
            run_id__in=list(call_ids), call_id__in=sorted(set().union(*call_ids.values()))
        ).order_by("run_id", "seq"):
            if pending.call_id in call_ids[pending.run_id]:
                waiting[(pending.run_id, pending.call_id)].append(pending)

    new_rounds: list[ModelRound] = []
    new_calls: list[ToolCall] = []
    answered: list[ToolCall] = []
    new_pending: list[PendingResult] = []
    consumed: list[int] = []
    writes: list[tuple[Run, list[ToolCall], list[ToolCall]]] = []  # per run: new calls, answered
    for run in runs:
        run_pk = run.pk
        run_calls: list[ToolCall] = []
        run_answered: list[ToolCall] = []
        for seq, kind, ts, body in events[run_pk]:
            if kind == "model_round":
                cost = body.get("cost_usd")
                if cost is None:
                    cost = cache.price(run.backend, run.model).cost(
                        body.get("input_tokens", 0), body.get("output_tokens", 0)
                    )
                cost = round_cost(cost)
                new_rounds.append(
                    ModelRound(
                        run_id=run_pk,
                        seq=seq,
                        round=numbering.of(run_pk, seq, body),
                        ts=ts,
                        started_at=parse_ts(body[ROUND_START]) if ROUND_START in body else None,
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
                    round=numbering.of(run_pk, seq, body),
                    call_id=body["call_id"],
                    tool=body["tool"],
                    kind=body.get("kind", ToolCall.Kind.OTHER),
                    args=body["args"],
                    step_id=body.get("step_id", ""),
                    operation_key=body.get("operation_key", ""),
                    ts=ts,
                )
                run_calls.append(call)
                queue = waiting.get((run_pk, call.call_id))
                if queue:
                    pending = queue.pop(0)
                    if pending.pk is not None:
                        consumed.append(pending.pk)
                    else:
                        new_pending.remove(pending)
                    _result_join(call, pending.seq, pending.body)
                else:
                    open_calls[(run_pk, call.call_id)].append(call)
            elif kind == "tool_result":
                stack = open_calls.get((run_pk, body["call_id"]))
                if stack:
                    call = stack.pop()
                    _result_join(call, seq, body)
                    if call.pk is not None:
                        run_answered.append(call)
                else:
                    pending = PendingResult(run_id=run_pk, seq=seq, call_id=body["call_id"], body=body)
                    new_pending.append(pending)
                    waiting[(run_pk, pending.call_id)].append(pending)
        new_calls += run_calls
        answered += run_answered
        writes.append((run, run_calls, run_answered))
    if connection.vendor == "postgresql":
        statements_run(
            [
                insert_statement(ModelRound, new_rounds),
                insert_statement(ToolCall, new_calls),
                update_statement(ToolCall, answered, RESULT_FIELDS),
                (_PENDING_DELETE_SQL, [consumed]) if consumed else None,
                insert_statement(PendingResult, new_pending),
                *numbering.rows_statements(),
            ]
        )
    else:
        numbering.rows_save()
        ModelRound.objects.bulk_create(new_rounds)
        ToolCall.objects.bulk_create(new_calls)
        ToolCall.objects.bulk_update(answered, RESULT_FIELDS)
        PendingResult.objects.filter(pk__in=consumed).delete()
        PendingResult.objects.bulk_create(new_pending)
    return _ledger_feed(writes)


_PENDING_DELETE_SQL = f"DELETE FROM {PendingResult._meta.db_table} WHERE id = ANY(%s)"


def _ledger_feed(writes: list[tuple[Run, list[ToolCall], list[ToolCall]]]) -> dict[int, list[Detection]]:
    """Traced writes go into the ledger; a key executed a second time is a duplicate side effect.

    writes: per run, in the pass's order, its new calls and the earlier calls answered now. The
    ledger gets every run's steps in one call, each run's in the order of its events, as they would
    have come one at a time: a retry after a 503 comes after that 503's result, whatever the
    batching. A result stored before its call (joined when the call came) counts from the call on.
    """
    steps: list[tuple[str, Run, ToolCall]] = []
    for run, new_calls, answered in writes:
        ordered: list[tuple[int, int, str, ToolCall]] = [
            (call.seq, 0, TRACE_STARTED, call) for call in new_calls if call.kind == ToolCall.Kind.WRITE
        ]
        ordered += [
            (max(call.seq, call.result_seq), 1, TRACE_FINISHED, call)
            for call in [*new_calls, *answered]
            if call.kind == ToolCall.Kind.WRITE and call.result_seq is not None
        ]
        ordered.sort(key=operator.itemgetter(0, 1))
        steps += [(kind, run, call) for _, _, kind, call in ordered]
    duplicates: dict[int, list[Detection]] = defaultdict(list)
    if not steps:
        return duplicates
    for (kind, run, call), evidence in zip(steps, trace_writes_record(steps=steps), strict=True):
        if kind != TRACE_STARTED or evidence is None:
            continue
        duplicates[run.pk].append(
            _run_detection(
                run,
                seq=call.seq,
                kind="duplicate_side_effect",
                action=Detection.Action.HANDOFF,
                signature=evidence["operation_key"][:64],
                tool=call.tool,
                count=evidence["executions"],
                at_round=call.round,
                evidence=evidence,
                hint=(
                    f"{call.tool} ran again for operation {evidence['operation_key']} "
                    f"(it was {evidence['previous_status']}): the effect may now exist twice. "
                    "Check it downstream and compensate if needed."
                ),
                ts=call.ts,
            )
        )
    return duplicates


def _run_detection(run: Run, **fields: Any) -> Detection:
    """A detection of `run`, with the run's dimensions copied (the overview filters on them)."""
    return Detection(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        backend=run.backend,
        model=run.model,
        task_type=run.task_type,
        agent=run.agent,
        **fields,
    )


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
