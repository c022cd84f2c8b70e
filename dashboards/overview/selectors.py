"""Reads of the overview page: the hourly rollup, stored per-run figures and detection rows, never raw
events.

Runs are taken by when they started (a cohort: "runs started in the range"), detections by the time
of the event that made them fire, UNKNOWN operations as they are now. Every query is scoped to
OverviewFilters.tenant_ids, which the view builds from the user's memberships only.

The cards, the cost and budget charts and the detection figures read the closed hours that were rolled
up (dashboards/overview/rollup.py) from the rollup, and the rest of the range (the open hour, the
range's ragged ends, hours not rolled yet or dirty) from the runs and detections: the same figures
either way. The long tail reads the runs (exact percentiles, and the bars list runs).
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import BigIntegerField, Count, F, Func, Max, Min, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from dashboards.models import ConfigChange, DetectionRollup, RollupHour, RunRollup, TailRollup
from dashboards.overview.filters import FilterOptions, OverviewFilters
from dashboards.queue.selectors import has_reconciler, needs_person_q
from ingest.models import Detection, Operation, Run

FINISHED = (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.TRUNCATED, Run.Status.ABANDONED)


def run_sums() -> dict[str, Any]:
    """The sums of a group of runs, for the rollup's cells and for the live read alike."""
    return {
        "n": Count("*"),
        "flagged_n": Count("pk", filter=Q(loop_flagged=True)),
        "events_n": Coalesce(Sum("events_count"), 0),
        "calls_n": Coalesce(Sum("tool_calls"), 0),
        "cost_sum": Coalesce(Sum("cost_usd"), 0.0),
        "burned_sum": Coalesce(Sum("cost_after_loop_usd"), 0.0),
    }


def run_ended(*, status: str, terminated_by: str, budget_type: str) -> str:
    """The budget a run ended on ("unspecified" when it did not say which), for finished runs only;
    "" for every other run."""
    return (budget_type or "unspecified") if status in FINISHED and terminated_by == "budget" else ""


def run_group_figures(
    *, status: str, n: int, flagged: int, events: int, calls: int, cost: float, burned: float
) -> dict[str, int | float]:
    """What a group of `n` runs of one status (summed by run_sums) adds to the overview's figures:
    the one rule for a rollup cell and for a live line."""
    out: dict[str, int | float] = {
        "runs": n,
        "flagged": flagged,
        "events": events,
        "tool_calls": calls,
        "cost": cost,
        "burned": burned,
    }
    if status == Run.Status.RUNNING:
        out["running"] = n
    if status == Run.Status.SUCCEEDED:
        out["succeeded"] = n
        out["success_cost"] = cost
    if status in FINISHED:
        out["finished"] = n
    return out


REPEAT_KINDS = ("exact_repeat", "interval_loop", "oscillation", "perturbation")  # the same call again
TAIL_RUNS_LIMIT = 50
CHANGES_MARKED = 20  # threshold changes marked on the time axes; the newest when there are more
# Ages of UNKNOWN operations, as the queue works them: reconciliation retries for up to an hour.
UNKNOWN_AGES = (
    ("< 5 min", timedelta(minutes=5)),
    ("5-15 min", timedelta(minutes=15)),
    ("15-60 min", timedelta(hours=1)),
    ("1-6 h", timedelta(hours=6)),
    ("6-24 h", timedelta(days=1)),
    ("> 1 day", None),
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
QUARTER = timedelta(minutes=15)  # the rollup's finest time: steps of 15 and 30 minutes read its quarters
DIMENSIONS = ("backend", "model", "task_type", "agent")


OPTIONS_TTL_S = 60  # new backends and task types show in the filters within a minute


# The planner cannot estimate how many groups the chart's time buckets make and, taking them for one per
# run, sorts on disk instead of hashing a few thousand groups in memory.
WORK_MEM = "32MB"


@contextmanager
def page_reads():
    """The page's reads in one transaction (one snapshot), with memory to group them (PostgreSQL)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL work_mem = '{WORK_MEM}'")
        yield


def filter_options(*, tenant_ids: list[int] | tuple[int, ...], fresh: bool = False) -> FilterOptions:
    """Backends, models, task types and agents that occur in the tenants' runs (an index-only DISTINCT),
    cached for a minute; `fresh` reads them again (a value the cache does not know yet)."""
    key = "overview-options:" + ",".join(map(str, sorted(tenant_ids)))
    options = None if fresh else cache.get(key)
    if options is None:
        options = _filter_options(tenant_ids)
        cache.set(key, options, OPTIONS_TTL_S)
    return options


def _filter_options(tenant_ids) -> FilterOptions:
    combos = (
        Run.objects.filter(tenant_id__in=tenant_ids)
        .values_list("backend", "model", "task_type", "agent")
        .distinct()
        .order_by()
    )
    backends, models, task_types, agents = set(), set(), set(), set()
    for backend, model, task_type, agent in combos:
        backends.add(backend)
        if model:
            models.add((backend, model))
        task_types.add(task_type)
        if agent:
            agents.add(agent)
    return FilterOptions(
        backends=tuple(sorted(backends)),
        models=tuple(sorted(models)),
        task_types=tuple(sorted(task_types)),
        agents=tuple(sorted(agents)),
    )


def runs_in_range(*, f: OverviewFilters) -> QuerySet[Run]:
    return _filtered(
        Run.objects.filter(tenant_id__in=f.tenant_ids, started_at__gte=f.start, started_at__lt=f.end), f
    )


def detections_in_range(*, f: OverviewFilters) -> QuerySet[Detection]:
    # A detection carries its run's dimensions, copied when it was stored.
    return _filtered(Detection.objects.filter(tenant_id__in=f.tenant_ids, ts__gte=f.start, ts__lt=f.end), f)


def bucket_of(when: datetime, step: timedelta) -> datetime:
    """The start of the bucket holding `when`: buckets are aligned on multiples of step since 1970."""
    return _EPOCH + (when - _EPOCH) // step * step


def buckets(*, f: OverviewFilters) -> list[datetime]:
    first, last = bucket_of(f.start, f.step), bucket_of(f.end - timedelta(microseconds=1), f.step)
    count = (last - first) // f.step + 1
    return [first + i * f.step for i in range(count)]


class EpochBucket(Func):
    """The number of the step-long bucket holding a timestamp, counted from 1970: an integer, so the
    database groups by the chart's own step and no timestamp is converted back per row."""

    output_field = BigIntegerField()

    def __init__(self, expression, step: timedelta) -> None:
        super().__init__(expression)
        self.seconds = int(step.total_seconds())

    def as_sql(self, compiler, connection, function=None, template=None, arg_joiner=None, **extra):
        # SQLite and others: whole seconds since 1970.
        sql, params = compiler.compile(self.source_expressions[0])
        return f"(CAST(strftime('%%s', {sql}) AS INTEGER) / %s)", [*params, self.seconds]

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        # date_part() is a float: EXTRACT() computes a numeric, several times slower per row.
        return f"FLOOR(date_part('epoch', {sql}) / %s)::bigint", [*params, self.seconds]


@dataclass(frozen=True)
class Coverage:
    """Where the page reads each part of its range: `rolled`, hours from the rollup; `live`, the rest."""

    rolled: tuple[tuple[datetime, datetime], ...] = ()
    live: tuple[tuple[datetime, datetime], ...] = ()


def coverage(*, f: OverviewFilters) -> Coverage:
    """The clean rolled parts of hours inside the range, as intervals, and the rest of the range. A
    rolled part is a whole closed hour, or the open hour up to where the last pass rolled it."""
    whole = Coverage(live=((f.start, f.end),))
    if f.step % QUARTER:  # minute steps (the hour range): finer than the rollup's quarters
        return whole
    first, last = bucket_of(f.start + HOUR - timedelta(microseconds=1), HOUR), bucket_of(f.end, HOUR)
    if first > last:
        return whole
    hours = RollupHour.objects.filter(hour__gte=first, hour__lte=last, dirty=False).order_by("hour")
    rolled: list[list[datetime]] = []
    for hour, until in hours.values_list("hour", "until"):
        end = min(until, hour + HOUR) if until is not None else hour + HOUR
        if end > f.end:  # rolled past the range's end (a custom range ending in the hour)
            continue
        if rolled and rolled[-1][1] == hour:
            rolled[-1][1] = end
        else:
            rolled.append([hour, end])
    if not rolled:
        return whole
    live, at = [], f.start
    for lo, hi in rolled:
        if at < lo:
            live.append((at, lo))
        at = hi
    if at < f.end:
        live.append((at, f.end))
    return Coverage(rolled=tuple((lo, hi) for lo, hi in rolled), live=tuple(live))


def _within(field: str, intervals: tuple[tuple[datetime, datetime], ...]) -> Q:
    where = Q()
    for lo, hi in intervals:
        where |= Q(**{f"{field}__gte": lo, f"{field}__lt": hi})
    return where


def _filtered(query: QuerySet, f: OverviewFilters) -> QuerySet:
    for name in DIMENSIONS:
        value = getattr(f, name)
        if value:
            query = query.filter(**{name: value})
    return query


def _quarters(at: int, counts, step: timedelta):
    """(bucket, count) of a rolled hour's quarter counts in the chart's step (15 or 30 minutes)."""
    base = bucket_start(at, HOUR)
    for index, n in enumerate(counts):
        if n:
            yield bucket_of(base + index * QUARTER, step), n


def _rows(query: QuerySet) -> list[tuple]:
    """A grouped query's rows as the database sends them. Django's per-row converters (None -> 0 for
    each Count) cost more than the query itself on the thousands of groups of a week."""
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def bucket_start(number: int, step: timedelta) -> datetime:
    return _EPOCH + number * step


def run_figures(*, f: OverviewFilters, cover: Coverage | None = None) -> dict[str, Any]:
    """The cards, the per-backend figures and the budget rows: rolled hours from the rollup, the rest
    from one grouped scan of the runs.

    Returns totals, by_backend (runs, running, finished, budget, succeeded, flagged, events, tool_calls,
    cost, success_cost, burned per backend) and budget_rows (finished runs per time bucket, task type
    and budget type, "" for runs not ended by a budget).
    """
    cover = cover or coverage(f=f)
    zero = dict.fromkeys(("runs", "running", "finished", "budget", "succeeded", "flagged"), 0)
    zero.update(dict.fromkeys(("events", "tool_calls", "cost", "success_cost", "burned"), 0))
    by_backend: dict[str, dict[str, Any]] = {}
    budget: dict[tuple[datetime, str, str], int] = defaultdict(int)
    starts: dict[int, datetime] = {}
    if cover.live:
        rows = (
            runs_in_range(f=f)
            .filter(_within("started_at", cover.live))
            .annotate(at=EpochBucket("started_at", f.step))
            .values_list("backend", "at", "task_type", "status", "terminated_by", "budget_type")
            .annotate(**run_sums())
            .order_by()
        )
        for (
            backend,
            at,
            task_type,
            status,
            terminated_by,
            budget_type,
            n,
            flagged,
            events,
            calls,
            cost,
            burned,
        ) in _rows(rows):
            line = by_backend.setdefault(backend, {"backend": backend, **zero})
            figures = run_group_figures(
                status=status, n=n, flagged=flagged, events=events, calls=calls, cost=cost, burned=burned
            )
            for name, value in figures.items():
                line[name] += value
            if status in FINISHED:
                ended = run_ended(status=status, terminated_by=terminated_by, budget_type=budget_type)
                if ended:
                    line["budget"] += n
                start = starts.get(at) or starts.setdefault(at, bucket_start(at, f.step))
                budget[(start, task_type, ended)] += n
    if cover.rolled:
        grain = max(f.step, HOUR)
        rows = (
            _filtered(RunRollup.objects.filter(tenant_id__in=f.tenant_ids), f)
            .filter(_within("hour", cover.rolled))
            .annotate(at=EpochBucket("hour", grain))
            .values_list("backend", "at", "task_type", "ended")
            .annotate(
                *(
                    Sum(name)
                    for name in (
                        "runs",
                        "running",
                        "succeeded",
                        "finished",
                        "flagged",
                        "events",
                        "tool_calls",
                    )
                ),
                *(Sum(name) for name in ("cost", "success_cost", "burned")),
                *(Sum(f"finished_q{i}") for i in range(4)),
            )
            .order_by()
        )
        for backend, at, task_type, ended, *sums in _rows(rows):
            runs, running, succeeded, finished, flagged, events, calls, cost, success_cost, burned = sums[:10]
            line = by_backend.setdefault(backend, {"backend": backend, **zero})
            line["runs"] += runs
            line["running"] += running
            line["succeeded"] += succeeded
            line["finished"] += finished
            line["flagged"] += flagged
            line["events"] += events
            line["tool_calls"] += calls
            line["cost"] += cost
            line["success_cost"] += success_cost
            line["burned"] += burned
            if ended:
                line["budget"] += finished
            if not finished:
                continue
            if f.step >= HOUR:
                start = starts.get(at) or starts.setdefault(at, bucket_start(at, grain))
                budget[(start, task_type, ended)] += finished
            else:
                for start, n in _quarters(at, sums[10:], f.step):
                    budget[(start, task_type, ended)] += n
    lines = [by_backend[name] for name in sorted(by_backend)]
    totals = {key: sum(line[key] for line in lines) for key in zero}
    return {
        "totals": totals,
        "by_backend": lines,
        "budget_rows": [
            {"bucket": start, "task_type": task_type, "budget_type": ended, "runs": n}
            for (start, task_type, ended), n in sorted(budget.items())
        ],
    }


def tail_histograms(
    *, f: OverviewFilters, cover: Coverage | None = None
) -> dict[str, dict[str, dict[int, int]]]:
    """{metric: {task type: {value: finished runs}}} for rounds and tool calls: rolled hours from the
    rollup's counts per value, the rest from one grouped scan of the runs."""
    cover = cover or coverage(f=f)
    out: dict[str, dict[str, dict[int, int]]] = {"rounds": {}, "tool_calls": {}}
    if cover.live:
        rows = (
            runs_in_range(f=f)
            .filter(_within("started_at", cover.live), status__in=FINISHED)
            .values_list("task_type", "rounds", "tool_calls")
            .annotate(n=Count("*"))
            .order_by()
        )
        for task_type, rounds, calls, n in _rows(rows):
            per_rounds = out["rounds"].setdefault(task_type, {})
            per_rounds[rounds] = per_rounds.get(rounds, 0) + n
            per_calls = out["tool_calls"].setdefault(task_type, {})
            per_calls[calls] = per_calls.get(calls, 0) + n
    if cover.rolled:
        rolled = (
            _filtered(TailRollup.objects.filter(tenant_id__in=f.tenant_ids), f)
            .filter(_within("hour", cover.rolled))
            .values_list("metric", "task_type", "value")
            .annotate(Sum("n"))
            .order_by()
        )
        for metric, task_type, value, n in _rows(rolled):
            per_value = out[metric].setdefault(task_type, {})
            per_value[value] = per_value.get(value, 0) + n
    return out


def tail_runs(*, f: OverviewFilters, limit: int = TAIL_RUNS_LIMIT) -> tuple[list[Run], int]:
    """The finished runs behind a bar of the long-tail chart, longest first, and how many there are."""
    assert f.bin is not None
    metric = f.metric
    runs = (
        runs_in_range(f=f)
        .filter(status__in=FINISHED, task_type=f.bin.task_type)
        .filter(**{f"{metric}__gte": f.bin.lo, f"{metric}__lte": f.bin.hi})
    )
    listed = list(
        runs.select_related("tenant")
        .only(
            *("run_id", "agent", "backend", "model", "task_type", "status", "terminated_by"),
            *("budget_type", "rounds", "tool_calls", "cost_usd", "cost_after_loop_usd", "started_at"),
            *("loop_flagged", "tenant__slug"),
        )
        .order_by(F(metric).desc(), "-started_at")[:limit]
    )
    total = len(listed) if len(listed) < limit else runs.count()
    return listed, total


def detection_rows(*, f: OverviewFilters, cover: Coverage | None = None) -> dict[str, list[dict[str, Any]]]:
    """The detections in range two ways: `series`, the interventions (correct and stronger) per
    (bucket, backend, model, kind), for the chart over time; `totals`, every detection per
    (backend, model, kind, action, feedback), for the tables and the rates. Rolled hours from the
    rollup, the rest from the detections."""
    cover = cover or coverage(f=f)
    series: dict[tuple[datetime, str, str, str], int] = defaultdict(int)
    totals: dict[tuple[str, str, str, str, str], int] = defaultdict(int)
    starts: dict[int, datetime] = {}
    if cover.live:
        found = detections_in_range(f=f).filter(_within("ts", cover.live))
        live_series = (
            found.exclude(action=Detection.Action.OBSERVE)
            .annotate(at=EpochBucket("ts", f.step))
            .values_list("at", "backend", "model", "kind")
            .annotate(n=Count("*"))
            .order_by()
        )
        live_totals = (
            found.values_list("backend", "model", "kind", "action", "feedback")
            .annotate(n=Count("*"))
            .order_by()
        )
        for at, backend, model, kind, n in _rows(live_series):
            start = starts.get(at) or starts.setdefault(at, bucket_start(at, f.step))
            series[(start, backend, model, kind)] += n
        for backend, model, kind, action, feedback, n in _rows(live_totals):
            totals[(backend, model, kind, action, feedback)] += n
    if cover.rolled:
        grain = max(f.step, HOUR)
        rolled = _filtered(DetectionRollup.objects.filter(tenant_id__in=f.tenant_ids), f).filter(
            _within("hour", cover.rolled)
        )
        rolled_series = (
            rolled.exclude(action=Detection.Action.OBSERVE)
            .annotate(at=EpochBucket("hour", grain))
            .values_list("at", "backend", "model", "kind")
            .annotate(Sum("n"), *(Sum(f"n_q{i}") for i in range(4)))
            .order_by()
        )
        rolled_totals = (
            rolled.values_list("backend", "model", "kind", "action", "feedback").annotate(Sum("n")).order_by()
        )
        for at, backend, model, kind, n, *quarters in _rows(rolled_series):
            if f.step >= HOUR:
                start = starts.get(at) or starts.setdefault(at, bucket_start(at, grain))
                series[(start, backend, model, kind)] += n
            else:
                for start, count in _quarters(at, quarters, f.step):
                    series[(start, backend, model, kind)] += count
        for backend, model, kind, action, feedback, n in _rows(rolled_totals):
            totals[(backend, model, kind, action, feedback)] += n
    return {
        "series": [
            {"bucket": start, "backend": backend, "model": model, "kind": kind, "n": n}
            for (start, backend, model, kind), n in series.items()
        ],
        "totals": [
            {"backend": backend, "model": model, "kind": kind, "action": action, "feedback": feedback, "n": n}
            for (backend, model, kind, action, feedback), n in totals.items()
        ],
    }


@dataclass(frozen=True)
class UnknownWrite:
    """An operation UNKNOWN now, as the overview lists it."""

    operation_key: str
    tool: str
    needs_person: bool
    run_id: int | None
    run: Run | None
    age_text: str  # how long it has been UNKNOWN (age_text)


def unknown_operations(*, f: OverviewFilters, now: datetime, oldest: int = 10) -> dict[str, Any]:
    """The writes whose outcome is UNKNOWN now (not limited to the range), with their ages."""
    ops = Operation.objects.filter(tenant_id__in=f.tenant_ids, status=Operation.Status.UNKNOWN)
    for name in ("backend", "model", "task_type", "agent"):
        value = getattr(f, name)
        if value:
            ops = ops.filter(**{f"run__{name}": value})
    aggregates: dict[str, Any] = {
        "open": Count("pk"),
        "first": Min("unknown_since"),
        "people": Count("pk", filter=needs_person_q()),  # the write queue's rule
    }
    lower = None
    for index, (_, upper) in enumerate(UNKNOWN_AGES):
        window = Q(unknown_since__isnull=False)
        if upper is not None:
            window &= Q(unknown_since__gt=now - upper)
        if lower is not None:
            window &= Q(unknown_since__lte=now - lower)
        aggregates[f"age{index}"] = Count("pk", filter=window)
        lower = upper
    figures = ops.aggregate(**aggregates)
    ages = [(label, figures[f"age{i}"]) for i, (label, _) in enumerate(UNKNOWN_AGES)]
    listed = list(
        ops.filter(unknown_since__isnull=False)
        .select_related("tenant", "run")
        .annotate(reconciler_exists=has_reconciler())
        .only("operation_key", "tool", "unknown_since", "needs_person", "tenant__slug", "run__run_id")
        .order_by("unknown_since", "pk")[:oldest]
    )
    oldest_ops = [
        UnknownWrite(
            operation_key=op.operation_key,
            tool=op.tool,
            needs_person=op.needs_person,
            run_id=op.run_id,
            run=op.run,
            age_text=age_text(now - op.unknown_since) if op.unknown_since else "",
        )
        for op in listed
    ]
    oldest_age = (now - figures["first"]) if figures["first"] else None
    return {
        "open": figures["open"],
        "needs_person": figures["people"],
        "oldest_age": oldest_age,
        "oldest_age_text": age_text(oldest_age) if oldest_age is not None else "",
        "ages": ages,
        "oldest": oldest_ops,
    }


def age_text(age: timedelta) -> str:
    """An age as an operator reads it: the two largest units (2 d 3 h, 3 h 12 min, 12 min, 40 s)."""
    seconds = max(int(age.total_seconds()), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else f"{seconds} s"


def latest_runs(*, f: OverviewFilters, limit: int = 10) -> list[Run]:
    return list(runs_in_range(f=f).select_related("tenant").order_by("-started_at")[:limit])


def runs_exist(*, tenant_ids: list[int] | tuple[int, ...]) -> bool:
    return Run.objects.filter(tenant_id__in=tenant_ids).exists()


def last_run_started(*, f: OverviewFilters) -> datetime | None:
    """When the latest run of the user's tenants started: said when the range holds nothing."""
    return Run.objects.filter(tenant_id__in=f.tenant_ids).aggregate(at=Max("started_at"))["at"]


def settings_changes(*, f: OverviewFilters, limit: int = CHANGES_MARKED) -> list[dict[str, Any]]:
    """Changes of detection settings (thresholds, tool descriptions) of the tenants in the range, oldest
    first, as {at, text}: the time charts mark them (the figures after one were made with others)."""
    changes = (
        ConfigChange.objects.filter(tenant_id__in=f.tenant_ids, at__gte=f.start, at__lt=f.end)
        .select_related("tenant", "user")
        .order_by("-at", "-pk")[:limit]
    )
    return [
        {
            "at": change.at,
            "text": f"{change.at:%Y-%m-%d %H:%M} UTC: {change.tenant.slug} {change.action} {change.target}"
            f" by {change.user.get_username() if change.user else 'a deleted user'}"
            + (f": {change.note[:120]}" if change.note else ""),
        }
        for change in reversed(list(changes))
    ]
