"""Event ingestion: validate a batch, store its valid events and the runs' figures in one
transaction, then queue detection of the runs it touched."""

from __future__ import annotations

import copy
import math
import operator
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict

import orjson
from django.db import connection, models, transaction

from ingest.detection.bounds import MAX_TOTAL_USD
from ingest.models import (
    Event,
    Run,
    RunCursor,
    Tenant,
)
from ingest.pricing import PriceBook
from ingest.schema import EventError, find_nul, validate_event
from ingest.services.pipeline import detection_enqueue
from ingest.services.postgres import (
    _EVENTS_STORED_SQL,
    _RUNS_DROP_EMPTY_SQL,
    DESCRIPTION_FIGURES,
    RUN_FIGURES,
    _events_copy,
    _insert_missing_sql,
    _PriceBook,
    _run_statements,
    _RunRow,
)


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


def runs_hold(*, tenant: Tenant, run_ids: list[str]) -> list[int]:
    """Hold these runs of the tenant for the caller's transaction, as a batch's ingest holds them:
    the runs not stored yet are created (empty) and every one is locked by its row. A run that does
    not exist yet is held too (its row, inserted, is locked until the commit); another transaction
    holding the same runs, an export or a REST batch, waits, and none can deadlock (insert in run_id
    order, lock in pk order). Row locks take no slot of PostgreSQL's shared lock table, whatever the
    number of runs. Returns the pks of the runs it created: the caller drops those it left empty
    (runs_drop_empty). On SQLite the transaction itself is the lock (IMMEDIATE): nothing to do."""
    if connection.vendor != "postgresql" or not run_ids:
        return []
    ordered = sorted(set(run_ids))
    sql, params = _insert_missing_sql(Run, Run(tenant=tenant), "run_id", ordered)
    with connection.cursor() as cursor:
        cursor.execute(sql + f" RETURNING {connection.ops.quote_name(Run._meta.pk.column)}", params)
        created = [row[0] for row in cursor.fetchall()]
        cursor.execute(_run_statements()[0], [tenant.pk, ordered])
    return created


def runs_drop_empty(*, run_pks: list[int]) -> None:
    """Delete the runs among these that hold no event (created by runs_hold and left empty)."""
    if run_pks:
        with connection.cursor() as cursor:
            cursor.execute(_RUNS_DROP_EMPTY_SQL, [run_pks])


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
    tenant: Tenant,
    valid: list[_Valid],
    verdicts: list[Verdict | None],
    *,
    check_stored: bool,
    ledger_scope: bool = True,
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
        if not ledger_scope and run.unverified_from_seq is None:
            run.unverified_from_seq = seq
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
            cost = changed[pk].cost_usd + sum(price.cost(i, o) for i, o in usage)
            changed[pk].cost_usd = min(cost, MAX_TOTAL_USD)
    # Each run's rows together (in seq order: the sort is stable), as its index entries lie.
    rows.sort(key=_BY_RUN)
    _events_insert(tenant.pk, rows)
    _runs_update(list(changed.values()), fresh, described)
    return list(changed)


_BY_RUN = operator.itemgetter(0)


def _events_stored(run_pks: set[int], event_ids: set[str]) -> set[tuple[int, str]]:
    """The (run pk, event_id) pairs among these already stored."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_EVENTS_STORED_SQL, [list(run_pks), list(event_ids)])
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


def _events_insert(tenant_pk: int, rows: list[tuple]) -> None:
    """One binary COPY on PostgreSQL (the hot path); a bulk insert elsewhere.

    rows: (run pk, seq, event_id, type, ts, body). The binary rows are built here rather than by
    copy.write_row(): that formatted and escaped every value, and PostgreSQL then parsed the text
    back; binary spares both sides most of it (the body is JSON text either way).
    """
    if connection.vendor == "postgresql":
        _events_copy(tenant_pk, rows)
        return
    Event.objects.bulk_create(
        [
            Event(tenant_id=tenant_pk, run_id=r, seq=s, event_id=e, type=k, ts=ts, body=orjson.loads(b))
            for r, s, e, k, ts, b in rows
        ],
        batch_size=500,
    )
