"""Detection's pipeline: queueing the runs a batch touched (Redis, Celery), then processing their
stored events in passes: engine, detections, runs' figures, cursors, alerts."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import orjson
import psycopg
from celery import Task, current_app
from celery.exceptions import SoftTimeLimitExceeded
from django.db import InterfaceError, OperationalError, connection, models, transaction
from django.db.models.functions import Coalesce, Greatest, Least, RowNumber
from django.utils import timezone
from psycopg.errors import LockNotAvailable

from ingest import metrics
from ingest.bulk import dumps_bounded, insert_statement, postgres_statements, statements_run
from ingest.detection import ACTIONS, Config, Engine, RunState
from ingest.detection.bounds import MAX_TOTAL_USD
from ingest.events import TASK_DETECT_PENDING, TASK_DETECT_RUNS
from ingest.incidents import (
    incident_payload,
    incidents_from_rows,
    incidents_refresh,
    incidents_statement,
    problem_keys,
)
from ingest.models import (
    Detection,
    Event,
    Incident,
    ModelRound,
    PendingResult,
    Run,
    RunCursor,
    ToolCall,
)
from ingest.notify import incidents_notify_enqueue
from ingest.otlp.rounds import Numbering, rounds_number
from ingest.pending import TAKE, TASK_BUDGET_S, enqueue_timeout_s, pending_add, pending_count, pending_take
from ingest.pricing import Price, PriceBook
from ingest.selectors import Scope, configs_for
from ingest.services.alerts import alert_payload, alerts_publish_all
from ingest.services.materialise import _materialize, _run_detection, round_cost
from ingest.services.postgres import (
    _CURSORS_LOCK_SQL,
    _EVENTS_AFTER_SQL,
    _LOCK_TIMEOUT_SQL,
    _POSITIONS_SQL,
    _PROGRESS_SQL,
    _RUN_COLUMNS,
    _RUNS_SQL,
    RUN_FIELDS,
    _PriceBook,
)

logger = logging.getLogger(__name__)


def _task(name: str) -> Task:
    """A task of ingest.tasks by its registered name, looked up as its @shared_task proxy looks it up
    (the current app's registry; IngestConfig.ready() imports ingest.tasks, which registers them):
    the tasks call these services, so the services do not import the tasks."""
    return current_app.tasks[name]


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

    detect_runs = _task(TASK_DETECT_RUNS)
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
    detect_pending = _task(TASK_DETECT_PENDING)
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
        detect_pending = _task(TASK_DETECT_PENDING)
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
    started = time.perf_counter()
    with transaction.atomic():
        if lock_wait_s is not None and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(_LOCK_TIMEOUT_SQL, [f"{max(1, int(lock_wait_s * 1000))}ms"])
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
    metrics.detection_pass(seconds=time.perf_counter() - started, runs=len(runs), events=processed)
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
    """Mark the run's cursor failed once more, with why and when to try again (doubling waits).

    Once a try: a run another task quarantined meanwhile (retry_at still ahead) is left as it is.
    The failed pass's savepoint lets go of the cursor's lock before this takes it again, and a
    second worker, queued for the same run, can take the run in between, fail the same way and
    get here too: counted twice, the run waited twice as long before its next try."""
    reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:QUARANTINE_ERROR_CHARS]
    now = timezone.now()
    row = (
        RunCursor.objects.select_for_update()
        .filter(run_id=run_pk)
        .values_list("failures", "retry_at")
        .first()
    )
    if row is None:
        return
    failures, retry_at = row
    if retry_at is not None and retry_at > now:  # set only with failures, cleared with them
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
    _figures_catch_up(run_pk)


def _figures_catch_up(run_pk: int) -> None:
    """Count a quarantined run's events into its figures without detecting them: a run whose
    detection fails still shows its rounds, calls, tokens and cost (what ingest used to count),
    up to PROCESS_CHUNK events at each failed try. The pass that succeeds later counts only what
    this left (RunCursor.figures_seq). In a savepoint of its own: when the events cannot be read
    either (what quarantined the run, say), the figures stay where they were."""
    try:
        with transaction.atomic():
            counted = (
                RunCursor.objects.select_for_update()
                .filter(run_id=run_pk)
                .values_list("figures_seq", flat=True)
                .first()
            )
            if counted is None:
                return
            run = Run.objects.only("backend", "model").get(pk=run_pk)
            events: _Events = list(
                Event.objects.filter(run_id=run_pk, seq__gt=counted)
                .order_by("seq")
                .values_list("seq", "type", "ts", "body")[:PROCESS_CHUNK]
            )
            if not events:
                return
            price = PriceBook({(run.backend, run.model)}).price(run.backend, run.model)
            for _, kind, _, body in events:
                if kind == "model_round" and "cost_usd" not in body:  # as _materialize prices it
                    body["cost_usd"] = price.cost(body.get("input_tokens", 0), body.get("output_tokens", 0))
            _figures_save(run_pk, _figures(run_pk, events, counted, Numbering()))
            RunCursor.objects.filter(run_id=run_pk).update(
                figures_seq=events[-1][0], updated_at=timezone.now()
            )
    except _NOT_THE_RUNS:
        raise
    except Exception as exc:
        logger.warning(
            "run %s: its figures could not be counted either: %s: %s", run_pk, type(exc).__name__, exc
        )


@dataclass(slots=True)
class _CursorRow:
    """A locked cursor as a pass reads it (PostgreSQL; elsewhere RunCursor instances)."""

    position: int
    processed: int
    figures_seq: int
    engine_state: dict | None


def _pass_read(
    order: list[int], limit: int, skip_locked: bool, cache: _PassCache
) -> tuple[dict[int, _CursorRow | RunCursor], dict[int, _Events], dict[int, Run]]:
    """Lock the runs' cursors, read their events after them (at most `limit` each) and the runs:
    ({run pk: cursor}, {run pk: events in seq order}, {run pk: run}). On PostgreSQL in one round
    trip, with the prices of the runs' backends the first time."""
    now = timezone.now()
    cursors: dict[int, _CursorRow | RunCursor]
    events: dict[int, _Events]
    if not postgres_statements():
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
        pk: _CursorRow(
            position, processed, counted, loads(state) if isinstance(state, str | bytes) else state
        )
        for pk, position, processed, counted, state in locked or ()
    }
    events = defaultdict(list)
    for run_pk, seq, kind, ts, body in rows or ():
        # A run let go between the two statements is locked by the second only: left for later.
        if run_pk in cursors:
            events[run_pk].append((seq, kind, ts, loads(body) if isinstance(body, str | bytes) else body))

    if prices is not None:
        cache.book = _PriceBook(rows=prices)
    return cursors, events, {row[0]: Run.from_db(connection.alias, _RUN_COLUMNS, row) for row in runs or ()}


def _events_after(cursors: dict[int, _CursorRow | RunCursor], limit: int) -> dict[int, _Events]:
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

    Rounds and calls are rebuilt; detections already stored are kept and not stored twice; the
    run's figures are not counted again (RunCursor.figures_seq).
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
                state = RunState.from_dict(cast(dict, cursor.engine_state))  # JSONText: a dict
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
        figure.update(_figures(run.pk, run_events, cursor.figures_seq, numbering))
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
    saved, incidents = _progress_save(rows, figures, positions, published, numbering)
    for detection in saved:
        stored[detection.run_id].append(detection)
    # An incident whose action rose since it last notified: its rules are told once it has committed.
    escalated = [
        i.pk for i in incidents if i.action != Detection.Action.OBSERVE and i.action != i.notified_action
    ]
    if escalated:
        transaction.on_commit(lambda: incidents_notify_enqueue(incident_ids=escalated))
    if not stored:
        return []
    by_run = {run.pk: run for run in runs}
    by_problem = {
        (i.run_id, i.kind, i.signature): incident_payload(i, run=by_run[i.run_id])
        for i in incidents
        if i.run_id in by_run
    }
    return [
        (
            run.tenant_id,
            {
                **alert_payload(detection, run=run),
                "incident": by_problem.get((detection.run_id, detection.kind, detection.signature)),
            },
        )
        for run in runs
        for detection in stored[run.pk]
    ]


def _figures(run_pk: int, events: _Events, counted: int, numbering: Numbering) -> dict[str, Any]:
    """What the pass's events of a run not counted before (seq > counted: RunCursor.figures_seq)
    add to its figures (postgres.COUNTED_FIGURES): counts and tokens and cost to add, the earliest
    and latest ts, the greatest round number (OTLP's rounds numbered by start time: the greatest
    the pass gave, its stored rounds it moved too). Each model round's cost is the one
    _materialize gave it (priced when the event had none)."""
    first: datetime | None = None
    last: datetime | None = None
    rounds = numbering.highest.get(run_pk, 0)
    tool_calls = tool_errors = input_tokens = output_tokens = 0
    costs: list[float] = []
    for seq, kind, ts, body in events:
        if seq <= counted:
            continue
        if first is None or ts < first:
            first = ts
        if last is None or ts > last:
            last = ts
        if kind == "model_round":
            rounds = max(rounds, numbering.of(run_pk, seq, body))
            input_tokens += body.get("input_tokens", 0)
            output_tokens += body.get("output_tokens", 0)
            costs.append(round_cost(body.get("cost_usd")))
        elif kind == "tool_call":
            tool_calls += 1
        elif kind == "tool_result" and body["status"] != "ok":
            tool_errors += 1
    if first is None:
        return {"rounds": rounds} if rounds else {}
    return {
        "rounds": rounds,
        "tool_calls": tool_calls,
        "tool_errors": tool_errors,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost_usd": min(math.fsum(costs), MAX_TOTAL_USD),
        "started_at": first,
        "last_event_at": last,
    }


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


def _positions_save(now: datetime, positions: list[dict[str, Any]]) -> None:
    """Move the pass's cursors and store the runs' engine states (PostgreSQL): one statement with
    server-side binding, its parameters in binary, the states as JSON text (ingest.models.JSONText),
    in the pass's transaction. Its cursors are locked since the pass began."""
    if not positions:
        return
    encode = RunCursor._meta.get_field("engine_state").get_prep_value  # as the ORM writes it
    params = [
        now,
        [p["run_id"] for p in positions],
        [p["position"] for p in positions],
        [p["processed"] for p in positions],
        [encode(p["engine_state"]) for p in positions],
    ]
    # Errors as Django's (a database gone is OperationalError, not the runs' fault: _NOT_THE_RUNS).
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(_POSITIONS_SQL, params)


def _progress_save(
    rows: list[Detection],
    figures: list[dict[str, Any]],
    positions: list[dict[str, Any]],
    published: models.QuerySet[Detection] | None,
    numbering: Numbering,
) -> tuple[list[Detection], list[Incident]]:
    """Store the detections (a run processed again stores none twice) and refresh the incidents of
    their problems, write the runs' figures (as _detect gathered them), move their cursors, then
    read the `published` detections; on PostgreSQL in one round trip."""
    now = timezone.now()
    keys = problem_keys(rows)
    if postgres_statements():
        _positions_save(now, positions)
        pks = sorted(figure["id"] for figure in figures)
        progress = [pks, dumps_bounded(figures).decode()]
        _, incident_rows, *_, found = statements_run(
            [
                insert_statement(Detection, rows, ignore_conflicts=True),
                incidents_statement(keys),
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
        return stored, incidents_from_rows(incident_rows)
    Detection.objects.bulk_create(rows, ignore_conflicts=True)
    incidents = incidents_refresh(keys=keys)
    numbering.bodies_save()
    for position in positions:
        RunCursor.objects.filter(run_id=position["run_id"]).update(
            figures_seq=Greatest(models.F("figures_seq"), models.Value(position["position"])),
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
        _figures_save(pk, figure)
    return (list(published) if published is not None else []), incidents


def _figures_save(pk: int, figure: dict[str, Any]) -> None:
    """The counted figures of _figures, into the run (elsewhere than PostgreSQL: _PROGRESS_SQL)."""
    values: dict[str, Any] = {}
    if figure.get("rounds"):
        values["rounds"] = Greatest(models.F("rounds"), models.Value(figure["rounds"]))
    for name in ("tool_calls", "tool_errors", "input_tokens", "output_tokens"):
        if figure.get(name):
            values[name] = models.F(name) + figure[name]
    if figure.get("cost_usd"):
        values["cost_usd"] = Least(models.F("cost_usd") + figure["cost_usd"], models.Value(MAX_TOTAL_USD))
    if "started_at" in figure:
        # Least / Greatest of a NULL are NULL on SQLite: a run not counted yet takes the pass's.
        first, last = models.Value(figure["started_at"]), models.Value(figure["last_event_at"])
        values["started_at"] = Least(Coalesce(models.F("started_at"), first), first)
        values["last_event_at"] = Greatest(Coalesce(models.F("last_event_at"), last), last)
    if values:
        Run.objects.filter(pk=pk).update(**values)
