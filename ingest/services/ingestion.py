"""Event ingestion: validate a batch, store its valid events in one transaction (numbered per run,
with what run_started and run_finished describe of their runs), then queue detection of the runs
it touched, which counts the rest of the runs' figures."""

from __future__ import annotations

import copy
import functools
import itertools
import operator
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict, cast

import orjson
from django.db import connection, models, transaction

from ingest.bulk import concrete_field, db_column, postgres_statements, statements_run
from ingest.models import (
    Event,
    Run,
    RunCursor,
    Tenant,
)
from ingest.schema import EventError, find_nul, validate_event
from ingest.services.pipeline import detection_enqueue
from ingest.services.postgres import (
    _EVENTS_STORED_SQL,
    _RUNS_DROP_EMPTY_SQL,
    DESCRIBED,
    STARTED_FIGURES,
    _cursor_fields,
    _describe_sql,
    _events_copy,
    _insert_missing_sql,
    _take_fields,
    _take_sql,
    insert_defaults,
    json_array,
    text_array,
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
       (`seq`), store them in one COPY, write what run_started / run_finished describe.
    3. After the commit, queue detection of the runs; its pass counts their other figures
       (rounds, calls, errors, tokens, cost, first and last event).
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


# The unique index that finds an event_id already stored for its run (ingest.models.Event). The table
# is partitioned on PostgreSQL (ingest.retention): a conflict names the partition's own index, which
# PostgreSQL names after the partition, e.g. ingest_event_d20261202_run_id_event_id_idx.
EVENT_ID_CONSTRAINT = "event_run_event_id_uniq"
EVENT_ID_PARTITION_INDEX = "_run_id_event_id_idx"


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
            name = diag.constraint_name or ""
            return name == EVENT_ID_CONSTRAINT or (
                name.startswith(Event._meta.db_table) and name.endswith(EVENT_ID_PARTITION_INDEX)
            )
    return False


def _set_based() -> bool:
    """Whether a batch is stored with PostgreSQL's own statements, each one for all the batch's runs
    (_store_set), rather than through the ORM (_store_orm: SQLite; the parity test runs it on
    PostgreSQL too and compares the rows). The storage switch of every such write (bulk)."""
    return postgres_statements()


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
    insert them, write the runs' descriptions and create the new runs' detection cursors. Returns
    the pks of the runs that got events."""
    store = _store_set if _set_based() else _store_orm
    return store(tenant, valid, verdicts, check_stored=check_stored, ledger_scope=ledger_scope)


# --- storing a batch on PostgreSQL: one statement per step for all the batch's runs -------------
#
# The cost of a batch was per run it touched: a batch of 1,000 events over 1,000 runs reached a
# quarter of a raw COPY of its rows, one over 20 runs two thirds. Per run the database locked and
# read the run, then merged twenty figures into its row. Now one statement locks the batch's runs in
# pk order and numbers them (each run's events_count raised by its events in the batch, the count
# before returned: the first seq), and creates the detection cursors of the runs that had none;
# the COPY stores the events; a small UPDATE writes what run_started and run_finished describe, for
# the few runs whose batch holds one. The other figures (rounds, calls, errors, tokens, cost, first
# and last event) are counted by the detection pass, which reads every event anyway and writes each
# run it processes (pipeline._detect).


def _store_set(
    tenant: Tenant,
    valid: list[_Valid],
    verdicts: list[Verdict | None],
    *,
    check_stored: bool,
    ledger_scope: bool,
) -> list[int]:
    """_store on PostgreSQL: whatever the number of runs, one round trip creates, locks and numbers
    them, one COPY stores the events, and one UPDATE the description of the runs whose batch holds a
    run_started or run_finished (if any).

    Without check_stored every valid event is stored (the unique index refuses a duplicate: the
    caller then stores the batch again with check_stored). With it, the runs are locked first, the
    events already stored dropped, and the rest numbered."""
    run_ids = sorted({item[1]["run_id"] for item in valid})
    stored: set[tuple[int, str]] = set()
    if check_stored:
        locked = _runs_take(tenant.pk, run_ids)[1]
        pks = {run_id: pk for run_id, pk, *_ in locked}
        # Only runs that already hold events can hold a duplicate of this batch's events.
        older = {pk for _, pk, events_count, *_ in locked if events_count}
        event_ids = {
            event["event_id"]
            for _, event, _, _ in valid
            if "event_id" in event and pks[event["run_id"]] in older
        }
        stored = _events_stored(older, event_ids) if event_ids else set()
    counts: dict[str, int] = defaultdict(int)
    kept: list[_Valid] = []
    for item in valid:
        index, event = item[0], item[1]
        if stored:
            event_id = event.get("event_id")
            if event_id is not None and (pks[event["run_id"]], event_id) in stored:
                verdicts[index] = {"index": index, "status": "duplicate"}
                continue
        counts[event["run_id"]] += 1
        kept.append(item)
    if check_stored:
        # Locked already: numbered (and the runs left without an event given their cursor) as the
        # first try numbers them.
        numbered = _runs_number(tenant.pk, [(pks[r], counts.get(r, 0)) for r in run_ids], ledger_scope)
    else:
        numbered = _runs_take(tenant.pk, run_ids, counts=counts, ledger_scope=ledger_scope)[1]
    runs = {run_id: [pk, before] for run_id, pk, before, *_ in numbered}
    rows: list[tuple] = []
    described: dict[int, dict[str, Any]] = {}
    for index, event, ts, body in kept:
        run = runs[event["run_id"]]
        run_pk = run[0]
        seq = run[1] = run[1] + 1
        kind = event["type"]
        rows.append((run_pk, seq, event.get("event_id"), kind, ts, body))
        if kind == "run_started" or kind == "run_finished":
            _describe(described.setdefault(run_pk, {"id": run_pk}), event, ts)
        verdicts[index] = {"index": index, "status": "accepted"}
    if not rows:
        return []
    # Each run's rows together (in seq order: the sort is stable), as its index entries lie.
    rows.sort(key=_BY_RUN)
    _events_copy(tenant.pk, rows)
    if described:
        with connection.cursor() as cursor:
            cursor.execute(_describe_sql(), [orjson.dumps(list(described.values())).decode()])
    return list(dict.fromkeys(row[0] for row in rows))


def _describe(into: dict[str, Any], event: dict[str, Any], ts: datetime) -> None:
    """What a run_started or run_finished says of its run, as columns (postgres.DESCRIBED): a later
    event of the batch overrides an earlier one field by field; started_at is the earliest
    run_started's ts."""
    if event["type"] == "run_started":
        for name in STARTED_FIGURES:
            if name in event:
                into[name] = event[name]
        if "started_at" not in into or ts < into["started_at"]:
            into["started_at"] = ts
    else:
        into["status"] = event["status"]
        into["terminated_by"] = event.get("terminated_by", "")
        into["budget_type"] = event.get("budget_type", "")
        into["reason"] = event.get("reason", "")
        into["finished_at"] = ts


class _RunPks:
    """The pks of runs this process has stored or read, by (tenant pk, run_id): a batch locks its
    runs by pk, and looks up by run_id only those it has not seen. Bounded: past `size` entries the
    oldest quarter goes. A run deleted since (retention, an empty run dropped) is found missing by
    the lock, forgotten and looked up again."""

    def __init__(self, size: int = 200_000) -> None:
        self.size = size
        self.pks: dict[tuple[int, str], int] = {}
        # Requests run on several threads: changes under the lock (a read is one dict lookup).
        self._lock = threading.Lock()

    def learn(self, tenant_pk: int, pairs: Iterable[tuple[str, int]]) -> None:
        with self._lock:
            pks = self.pks
            for run_id, pk in pairs:
                pks[(tenant_pk, run_id)] = pk
            if len(pks) > self.size:
                for key in list(itertools.islice(pks, len(pks) - self.size * 3 // 4)):
                    del pks[key]

    def forget(self, tenant_pk: int, run_ids: Iterable[str]) -> None:
        with self._lock:
            for run_id in run_ids:
                self.pks.pop((tenant_pk, run_id), None)


_RUN_PKS = _RunPks()


class _StalePks(Exception):
    """Runs this process knew by pk that the lock did not find (_runs_take_once)."""

    def __init__(self, run_ids: set[str]) -> None:
        super().__init__(sorted(run_ids)[:5])
        self.run_ids = run_ids


def _runs_take(
    tenant_pk: int, run_ids: list[str], *, counts: dict[str, int] | None = None, ledger_scope: bool = True
) -> tuple[list[int], list[tuple]]:
    """Create the runs among these (sorted) that are not stored, then lock them all in pk order
    (PostgreSQL): (pks created, [(run_id, pk, events_count, tenant_id)]). With `counts` (events the
    batch adds, by run_id) the same statement numbers them (_take_sql's `number`): events_count is
    then the count before the batch's.

    Inserts first, then locks: a batch waits on another's new run only while it holds no lock, and
    locks in pk order, so concurrent batches sharing runs cannot deadlock. Row locks take no slot of
    PostgreSQL's shared lock table, whatever the number of runs. The runs this process knows are
    locked by pk in one round trip; the others first cost one more (insert and look up).

    A known pk the lock does not find (the run was deleted since: retention, an empty run dropped;
    or the pk is another run's after a restore) is forgotten and the whole take starts again from
    its savepoint, which lets go of the rows it had locked. Taking only the missing runs while
    holding the others would insert, and wait on another batch's new run, with locks held: out of
    order, and that batch, waiting for one of them, deadlocked with it (CI saw it with OTLP exports,
    whose runs created for a waiting span are dropped again)."""
    for _ in range(3):
        try:
            with transaction.atomic():
                return _runs_take_once(tenant_pk, run_ids, counts, ledger_scope)
        except _StalePks as stale:
            _RUN_PKS.forget(tenant_pk, stale.run_ids)
    # Forgotten, they are inserted or found by run id the next time: only runs deleted while this
    # was taking them, three times over, get here.
    raise RuntimeError(f"runs {sorted(run_ids)[:5]} deleted while being taken")


def _runs_take_once(
    tenant_pk: int, run_ids: list[str], counts: dict[str, int] | None, ledger_scope: bool
) -> tuple[list[int], list[tuple]]:
    """One try of _runs_take: raises _StalePks if a pk it knew names no longer the run (what the
    try wrote is rolled back with its savepoint)."""
    insert, find, lock, _ = _take_sql()
    known = _RUN_PKS.pks
    pks: dict[str, int] = {}
    unknown: list[str] = []
    for run_id in run_ids:
        pk = known.get((tenant_pk, run_id))
        if pk is None:
            unknown.append(run_id)
        else:
            pks[run_id] = pk
    created: list[int] = []
    if unknown:
        defaults = insert_defaults(Run(tenant_id=tenant_pk), _take_fields())
        inserted, found = statements_run(
            [
                (insert, [*defaults, orjson.dumps(unknown).decode()]),
                (find, [tenant_pk, text_array(unknown)]),
            ]
        )
        created = [pk for pk, _ in inserted or ()]
        pks.update(found or ())
        # Learnt when the transaction commits: a batch rolled back leaves no pk of a run never stored.
        transaction.on_commit(lambda: _RUN_PKS.learn(tenant_pk, found or ()), robust=True)
    if counts is None:
        with connection.cursor() as cursor:
            cursor.execute(lock, [json_array(sorted(pks.values()))])
            rows = cursor.fetchall()
    else:
        rows = _runs_number(
            tenant_pk, [(pks[run_id], counts.get(run_id, 0)) for run_id in run_ids], ledger_scope
        )
    # The pk still names this run of this tenant (_StalePks otherwise).
    locked = [row for row in rows if pks.get(row[0]) == row[1] and row[-1] == tenant_pk]
    if len(locked) < len(run_ids):
        gone = set(run_ids).difference(row[0] for row in locked)
        if gone.issubset(unknown):
            raise RuntimeError(f"runs {sorted(gone)[:5]} neither inserted nor found")  # deleted meanwhile
        raise _StalePks(gone.difference(unknown))
    return created, locked


def _runs_number(tenant_pk: int, counts: list[tuple[int, int]], ledger_scope: bool) -> list[tuple]:
    """Lock these runs (pks) in pk order and raise each one's events_count by its count, in one
    statement (_take_sql's `number`): [(run_id, pk, events_count before, tenant_id)] in pk order.
    Without the ledger scope a run's first unverified seq is set (if it was not). A run that had no
    event gets its detection cursor."""
    counts = sorted(counts)
    pks = json_array([pk for pk, _ in counts])
    defaults = insert_defaults(RunCursor(), _cursor_fields())
    params = [pks, not ledger_scope, pks, json_array([k for _, k in counts]), *defaults]
    with connection.cursor() as cursor:
        cursor.execute(_take_sql()[3], params)
        return cursor.fetchall()


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
    if not run_pks:
        return
    with connection.cursor() as cursor:
        cursor.execute(_RUNS_DROP_EMPTY_SQL, [run_pks])
        dropped = cursor.fetchall()
    if dropped:
        # Learnt at the commit by the take that created them: forgotten after it.
        by_tenant: dict[int, list[str]] = {}
        for tenant_pk, run_id in dropped:
            by_tenant.setdefault(tenant_pk, []).append(run_id)
        for tenant_pk, run_ids in by_tenant.items():
            transaction.on_commit(functools.partial(_RUN_PKS.forget, tenant_pk, run_ids), robust=True)


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
    transaction is the lock) and read whole, numbered and described event by event, written back
    with one UPDATE per run. What _store_set writes, no more: the other figures are the detection
    pass's."""
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
        _run_describe(run, event, ts)
        changed[run.pk] = run
        verdicts[index] = {"index": index, "status": "accepted"}
    if fresh:
        _insert_missing(RunCursor, RunCursor(), "run_id", fresh)
    if not rows:
        return []
    Event.objects.bulk_create(
        [
            Event(tenant_id=tenant.pk, run_id=r, seq=s, event_id=e, type=k, ts=ts, body=orjson.loads(b))
            for r, s, e, k, ts, b in rows
        ],
        batch_size=500,
    )
    # One UPDATE per run (executemany), not bulk_update(): its CASE ... WHEN expressions cost Django
    # ~2 ms of CPU per run, most of a batch.
    fields = [concrete_field(Run, name) for name in INGEST_FIGURES]
    assignments = ", ".join(f"{connection.ops.quote_name(db_column(f))} = %s" for f in fields)
    sql = f"UPDATE {connection.ops.quote_name(Run._meta.db_table)} SET {assignments} WHERE id = %s"
    params = [[_db_value(f, getattr(run, f.attname)) for f in fields] + [run.pk] for run in changed.values()]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
    return list(changed)


# What ingest writes of a run: the count that numbers its events, where its unverified events
# start, and what run_started / run_finished describe (the rest: pipeline._figures).
INGEST_FIGURES = ("events_count", "unverified_from_seq", *DESCRIBED)


_BY_RUN = operator.itemgetter(0)


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
        model._default_manager.bulk_create(rows, ignore_conflicts=True)
        return
    sql, params = _insert_missing_sql(model, template, key, values)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _events_stored(run_pks: set[int], event_ids: set[str]) -> set[tuple[int, str]]:
    """The (run pk, event_id) pairs among these already stored."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_EVENTS_STORED_SQL, [list(run_pks), list(event_ids)])
            return set(cursor.fetchall())
    stored = Event.objects.filter(run_id__in=run_pks, event_id__in=event_ids).values_list(
        "run_id", "event_id"
    )
    return set(cast(Iterable[tuple[int, str]], stored))  # event_id__in leaves NULL out


def _db_value(field, value: Any) -> Any:
    kind = field.get_internal_type()
    if kind == "JSONField":
        return orjson.dumps(value).decode()
    if kind == "DateTimeField":
        return connection.ops.adapt_datetimefield_value(value)
    return value


def _run_describe(run: Run, event: dict[str, Any], ts: datetime) -> None:
    """What a run_started or run_finished says of the run, on the Run (as _describe says it)."""
    kind = event["type"]
    if kind == "run_started":
        run.agent = event.get("agent", run.agent)
        run.task_type = event.get("task_type", run.task_type)
        run.backend = event.get("backend", run.backend)
        run.model = event.get("model", run.model)
        run.budgets = event.get("budgets", run.budgets)
        run.labels = event.get("labels", run.labels)
        if run.started_at is None or ts < run.started_at:
            run.started_at = ts
    elif kind == "run_finished":
        run.status = event["status"]
        run.terminated_by = event.get("terminated_by", "")
        run.budget_type = event.get("budget_type", "")
        run.reason = event.get("reason", "")
        run.finished_at = ts
