"""The overview's hourly rollup: the same figures as the live reads, rebuilt alike, late data, tenants."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from django.core.cache import cache
from django.db import connection
from django.http import QueryDict

from dashboards.alerts.services import detection_feedback_set
from dashboards.models import DetectionRollup, RollupHour, RunRollup, TailRollup
from dashboards.overview import selectors
from dashboards.overview.filters import filters_parse
from dashboards.overview.rollup import MAX_HOURS_PER_PASS, rollup_hour_build, rollup_pass
from ingest.models import Detection, Run, RunCursor

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
# Not on an hour: every range has ragged ends read live beside the rolled hours.
NOW = datetime(2026, 11, 29, 12, 37, 11, tzinfo=UTC)
HOUR = timedelta(hours=1)
QUERIES = (
    "range=week",
    "range=day",
    "range=hour",
    "range=custom&from=2026-11-25T03:20&to=2026-11-27T05:10",  # 30-minute steps
    "range=custom&from=2026-11-24T00:00&to=2026-11-28T00:00",  # hours, ends on the hour
    "range=week&backend=openai",
    "range=week&backend=openai&model=m1",
    "range=day&task_type=research",
    "range=week&agent=b",
    "range=day&backend=local&model=m2&task_type=faq&agent=a",
)


@pytest.fixture(autouse=True)
def _fresh_options():
    cache.clear()


@pytest.fixture(autouse=True)
def _clock():
    """The data is stored an hour before the first pass; a late change is stamped after it."""
    with time_machine.travel(NOW - HOUR, tick=False):
        yield


def _later(minutes: int = 2):
    return time_machine.travel(NOW + timedelta(minutes=minutes), tick=False)


def _filters(tenants, query: str):
    ids = {t.slug: t.pk for t in tenants}
    options = selectors.filter_options(tenant_ids=tuple(ids.values()), fresh=True)
    return filters_parse(params=QueryDict(query), tenants=ids, options=options, now=NOW)


def _populate(tenant, rng: random.Random, n: int, prefix: str) -> list[Run]:
    runs = []
    for i in range(n):
        status = rng.choice(
            ["running", "succeeded", "succeeded", "failed", "truncated", "waiting", "abandoned"]
        )
        by_budget = status in ("truncated", "running") or (status == "failed" and rng.random() < 0.3)
        cost = round(rng.uniform(0, 2), 4)
        run = Run.objects.create(
            tenant=tenant,
            run_id=f"{prefix}{i}",
            backend=rng.choice(["openai", "anthropic", "local"]),
            model=rng.choice(["m1", "m2"]),
            task_type=rng.choice(["faq", "research"]),
            agent=rng.choice(["a", "b", ""]),
            status=status,
            terminated_by="budget" if by_budget else rng.choice(["", "user"]),
            budget_type=rng.choice(["max_rounds", "max_tool_calls", ""]) if by_budget else "",
            started_at=NOW - timedelta(days=8) * rng.random(),
            rounds=rng.randint(0, 60),
            tool_calls=rng.randint(0, 120),
            events_count=rng.randint(1, 300),
            cost_usd=cost,
            cost_after_loop_usd=round(cost * rng.random(), 4) if rng.random() < 0.3 else 0,
            loop_flagged=rng.random() < 0.3,
        )
        RunCursor.objects.create(run=run, position=run.events_count)
        runs.append(run)
        for seq in range(rng.choice([0, 0, 1, 3])):
            _detection(run, seq, rng)
    return runs


def _detection(run: Run, seq: int, rng: random.Random, ts: datetime | None = None) -> Detection:
    return Detection.objects.create(
        tenant=run.tenant,
        run=run,
        seq=seq,
        kind=rng.choice(["exact_repeat", "oscillation", "no_progress"]),
        action=rng.choice(["observe", "correct", "handoff", "terminate"]),
        feedback=rng.choice(["", "", "true_loop", "false_alarm"]),
        backend=run.backend,
        model=run.model,
        task_type=run.task_type,
        agent=run.agent,
        ts=ts or min(run.started_at + timedelta(minutes=rng.uniform(0, 90)), NOW - timedelta(seconds=1)),
    )


def _figures(tenants, query: str) -> dict:
    f = _filters(tenants, query)
    runs = selectors.run_figures(f=f)
    detections = selectors.detection_rows(f=f)
    return {
        "totals": runs["totals"],
        "by_backend": runs["by_backend"],
        "budget_rows": runs["budget_rows"],
        "series": sorted(
            (r["bucket"], r["backend"], r["model"], r["kind"], r["n"]) for r in detections["series"]
        ),
        "totals_detections": sorted(tuple(r.values()) for r in detections["totals"]),
        "tail": selectors.tail_histograms(f=f),
    }


def _approx(figures: dict) -> dict:
    """Costs are summed in another order from the rollup: equal up to rounding."""
    out = dict(figures)
    out["totals"] = {k: pytest.approx(v) for k, v in figures["totals"].items()}
    out["by_backend"] = [
        {k: pytest.approx(v) if isinstance(v, float) else v for k, v in line.items()}
        for line in figures["by_backend"]
    ]
    return out


def _rows() -> tuple[list, list]:
    """Every rollup row but its pk, costs rounded (summed in the order the database hands them)."""
    out = []
    for model in (RunRollup, DetectionRollup):
        names = [f.attname for f in model._meta.concrete_fields if not f.primary_key]
        rows = model.objects.values_list(*names)
        out.append(sorted(tuple(round(v, 9) if isinstance(v, float) else v for v in row) for row in rows))
    return out[0], out[1]


@pytest.fixture
def data(tenant, other_tenant):
    rng = random.Random(7)
    return {"mine": _populate(tenant, rng, 150, "m"), "theirs": _populate(other_tenant, rng, 60, "t")}


def test_rolled_hours_give_the_live_figures_for_every_range_and_filter(tenant, other_tenant, data):
    live = {query: _figures([tenant], query) for query in QUERIES}
    both = _figures([tenant, other_tenant], "range=week")
    first = min(r.started_at for runs in data.values() for r in runs).replace(
        minute=0, second=0, microsecond=0
    )
    closed = NOW.replace(minute=0, second=0)
    # every closed hour since the first run, newest first, a week per pass, and each pass the open
    # hour up to the minute a minute before it
    assert rollup_pass(now=NOW) == MAX_HOURS_PER_PASS + 1
    assert rollup_pass(now=NOW) == (closed - first) // HOUR - MAX_HOURS_PER_PASS + 1
    assert rollup_pass(now=NOW) == 1
    assert list(RollupHour.objects.filter(hour__gte=NOW - HOUR).values_list("hour", "until")) == [
        (closed, datetime(2026, 11, 29, 12, 36, tzinfo=UTC))
    ]
    for query in QUERIES:
        f = _filters([tenant], query)
        cover = selectors.coverage(f=f)
        assert bool(cover.rolled) == (query != "range=hour"), query  # minute steps are read live
        assert _figures([tenant], query) == _approx(live[query]), query
    assert _figures([tenant, other_tenant], "range=week") == _approx(both)


def test_coverage_reads_the_ragged_ends_and_unrolled_or_dirty_hours_live(tenant, data):
    rollup_pass(now=NOW, max_hours=None)
    RollupHour.objects.filter(hour=datetime(2026, 11, 28, 20, tzinfo=UTC)).update(dirty=True)
    RollupHour.objects.filter(hour=datetime(2026, 11, 29, 3, tzinfo=UTC)).delete()
    cover = selectors.coverage(f=_filters([tenant], "range=day"))  # from 2026-11-28 12:37:11
    assert cover.live == (
        (NOW - timedelta(days=1), datetime(2026, 11, 28, 13, tzinfo=UTC)),
        (datetime(2026, 11, 28, 20, tzinfo=UTC), datetime(2026, 11, 28, 21, tzinfo=UTC)),
        (datetime(2026, 11, 29, 3, tzinfo=UTC), datetime(2026, 11, 29, 4, tzinfo=UTC)),
        (datetime(2026, 11, 29, 12, 36, tzinfo=UTC), NOW),  # the minutes since the open hour was rolled
    )
    assert cover.rolled == (
        (datetime(2026, 11, 28, 13, tzinfo=UTC), datetime(2026, 11, 28, 20, tzinfo=UTC)),
        (datetime(2026, 11, 28, 21, tzinfo=UTC), datetime(2026, 11, 29, 3, tzinfo=UTC)),
        (datetime(2026, 11, 29, 4, tzinfo=UTC), datetime(2026, 11, 29, 12, 36, tzinfo=UTC)),
    )
    assert _figures([tenant], "range=day") == _approx(_live_figures(tenant, "range=day"))


def test_rolling_again_or_twice_gives_the_same_rows(tenant, data):
    rollup_pass(now=NOW, max_hours=None)
    first = _rows()
    assert first[0] and first[1]
    assert rollup_pass(now=NOW + timedelta(seconds=30)) == 1  # nothing changed: the open hour only
    hour = datetime(2026, 11, 27, 15, tzinfo=UTC)
    rollup_hour_build(hour=hour, now=NOW)
    rollup_hour_build(hour=hour, now=NOW)
    assert _rows() == first
    assert RollupHour.objects.filter(hour=hour).count() == 1


def test_the_command_rolls_every_due_hour_and_rebuild_starts_from_nothing(tenant, data):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    with time_machine.travel(NOW, tick=False):
        call_command("overview_rollup", stdout=out)
        first = _rows()
        assert first[0] and first[1]
        hours = RollupHour.objects.count()
        assert out.getvalue().startswith(f"{hours} hours rolled up")
        RunRollup.objects.all().delete()  # data changed behind the rollup's back
        call_command("overview_rollup", "--rebuild", stdout=out)
    assert _rows() == first and RollupHour.objects.count() == hours


def test_a_run_finishing_after_its_hour_was_rolled_is_counted_by_the_next_pass(tenant, data):
    run = Run.objects.create(
        tenant=tenant,
        run_id="late",
        backend="openai",
        task_type="faq",
        status="running",
        started_at=datetime(2026, 11, 28, 3, 10, tzinfo=UTC),
        cost_usd=1.0,
    )
    cursor = RunCursor.objects.create(run=run)
    rollup_pass(now=NOW, max_hours=None)
    with _later():  # ingest stores the run's last events, then the detection task moves its cursor
        Run.objects.filter(pk=run.pk).update(
            status="truncated", terminated_by="budget", budget_type="max_rounds", cost_usd=3.5
        )
        cursor.position = 5
        cursor.save()
    hour = datetime(2026, 11, 28, 3, tzinfo=UTC)
    assert rollup_pass(now=NOW + timedelta(minutes=3)) == 2  # and the open hour
    assert not RollupHour.objects.get(hour=hour).dirty
    live_now = _live_figures(tenant, "range=week")
    assert _figures([tenant], "range=week") == _approx(live_now)
    budget = RunRollup.objects.get(
        tenant=tenant, hour=hour, ended="max_rounds", backend="openai", task_type="faq", agent=""
    )
    assert budget.finished >= 1 and budget.running == 0


def _live_figures(tenant, query: str) -> dict:
    """The figures with every hour read live (the markers hidden for the time of the reads)."""
    hours = list(RollupHour.objects.filter(dirty=False).values_list("pk", flat=True))
    RollupHour.objects.filter(pk__in=hours).update(dirty=True)
    try:
        return _figures([tenant], query)
    finally:
        RollupHour.objects.filter(pk__in=hours).update(dirty=False)


def test_a_detection_stored_late_for_an_old_hour_is_counted_by_the_next_pass(tenant, data):
    rollup_pass(now=NOW, max_hours=None)
    run = data["mine"][0]
    before = _figures([tenant], "range=week")
    with _later():
        _detection(run, 999, random.Random(1), ts=datetime(2026, 11, 26, 8, 30, tzinfo=UTC))
    assert rollup_pass(now=NOW + timedelta(minutes=3)) == 2  # and the open hour
    after = _figures([tenant], "range=week")
    assert after == _approx(_live_figures(tenant, "range=week"))
    assert (
        sum(r[-1] for r in after["totals_detections"]) == sum(r[-1] for r in before["totals_detections"]) + 1
    )


def test_a_verdict_on_a_rolled_hour_shows_at_once_and_after_the_next_pass(tenant, data, django_user_model):
    rollup_pass(now=NOW, max_hours=None)
    detection = Detection.objects.filter(
        tenant=tenant, action="correct", feedback="", ts__lt=NOW - timedelta(hours=3)
    ).first()
    hour = detection.ts.replace(minute=0, second=0, microsecond=0)
    user = django_user_model.objects.create_user("ana", password="pw")
    with _later():
        detection_feedback_set(detection=detection, user=user, verdict="false_alarm")
    assert RollupHour.objects.get(hour=hour).dirty  # read live until rolled again
    expected = _live_figures(tenant, "range=week")
    assert _figures([tenant], "range=week") == _approx(expected)
    assert rollup_pass(now=NOW + timedelta(minutes=3)) == 2  # and the open hour
    assert not RollupHour.objects.get(hour=hour).dirty
    assert _figures([tenant], "range=week") == _approx(expected)


def test_a_run_handed_to_a_person_without_an_event_makes_its_hour_due(tenant, data):
    rollup_pass(now=NOW, max_hours=None)
    run = next(r for r in data["mine"] if r.status == "running" and r.started_at < NOW - 2 * HOUR)
    Run.objects.filter(pk=run.pk).update(status="waiting")  # what the guard does; no cursor moves
    assert rollup_pass(now=NOW + timedelta(minutes=3)) == 2  # and the open hour
    assert _figures([tenant], "range=week") == _approx(_live_figures(tenant, "range=week"))


def test_a_tenant_sees_none_of_another_tenants_rolled_figures(tenant, other_tenant, data):
    rollup_pass(now=NOW, max_hours=None)
    mine = _figures([tenant], "range=week")
    theirs = _figures([other_tenant], "range=week")
    week = NOW - timedelta(days=7)
    assert mine["totals"]["runs"] == sum(1 for r in data["mine"] if r.started_at >= week)
    assert theirs["totals"]["runs"] == sum(1 for r in data["theirs"] if r.started_at >= week)
    assert RunRollup.objects.filter(tenant=other_tenant).exists()


CHILD = """
import sys
from datetime import datetime
import django
django.setup()
from dashboards.overview.rollup import rollup_hour_build
hours = [datetime.fromisoformat(h) for h in sys.argv[1:]]
for _ in range(3):
    for hour in hours:
        rollup_hour_build(hour=hour, now=datetime.fromisoformat("2026-11-29T12:37:11+00:00"))
"""


def _database_url() -> str:
    s = connection.settings_dict
    return (
        f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )


@pytest.mark.real_workers
@pytest.mark.django_db(transaction=True)
def test_concurrent_rolls_of_the_same_hours_leave_one_set_of_rows(needs_postgres, tenant, other_tenant):
    rng = random.Random(11)
    _populate(tenant, rng, 80, "c")
    hours = [datetime(2026, 11, 28, h, tzinfo=UTC) for h in range(0, 24, 2)]
    for hour in hours:
        rollup_hour_build(hour=hour, now=NOW)
    expected = _rows()
    env = {**os.environ, "DATABASE_URL": _database_url()}
    env.pop("REDIS_URL", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, *(h.isoformat() for h in (hours if p % 2 else hours[::-1]))],
            cwd=ROOT,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    assert _rows() == expected  # no row twice
    assert RollupHour.objects.filter(hour__in=hours).count() == len(hours)


def test_rollups_older_than_their_retention_are_deleted(tenant, settings):
    from dashboards.overview.rollup import rollups_purge

    settings.LOOPWATCH_ROLLUP_RETENTION_DAYS = 800
    now = datetime(2026, 12, 2, 12, tzinfo=UTC)
    old, kept = now - timedelta(days=801), now - timedelta(days=799)
    for hour in (old, kept):
        hour = hour.replace(minute=0, second=0, microsecond=0)
        rollup_hour_build(hour=hour, now=now)
    assert RollupHour.objects.count() == 2
    assert rollups_purge(now=now) == 1
    assert list(RollupHour.objects.values_list("hour", flat=True)) == [
        kept.replace(minute=0, second=0, microsecond=0)
    ]


def _open_hour_run(tenant, run_id: str, started: datetime, **figures) -> Run:
    run = Run.objects.create(
        tenant=tenant,
        run_id=run_id,
        backend="openai",
        model="m1",
        task_type="faq",
        status=figures.pop("status", "succeeded"),
        started_at=started,
        rounds=figures.pop("rounds", 7),
        tool_calls=figures.pop("tool_calls", 11),
        events_count=20,
        cost_usd=figures.pop("cost_usd", 0.25),
    )
    RunCursor.objects.create(run=run, position=run.events_count)
    return run


def test_the_open_hour_is_rolled_up_to_a_minute_before_the_pass_and_read_live_after(tenant, data):
    _open_hour_run(tenant, "early", datetime(2026, 11, 29, 12, 5, tzinfo=UTC), rounds=90)
    _open_hour_run(tenant, "just-before", datetime(2026, 11, 29, 12, 35, 59, tzinfo=UTC), rounds=91)
    _open_hour_run(tenant, "after", datetime(2026, 11, 29, 12, 36, 30, tzinfo=UTC), rounds=92)
    live = {query: _figures([tenant], query) for query in ("range=day", "range=week")}

    rollup_pass(now=NOW, max_hours=None)

    marker = RollupHour.objects.get(hour=datetime(2026, 11, 29, 12, tzinfo=UTC))
    assert marker.until == datetime(2026, 11, 29, 12, 36, tzinfo=UTC) and not marker.dirty
    rolled_rounds = set(
        TailRollup.objects.filter(hour=marker.hour, metric="rounds").values_list("value", flat=True)
    )
    assert {90, 91} <= rolled_rounds and 92 not in rolled_rounds  # started after `until`: read live
    cover = selectors.coverage(f=_filters([tenant], "range=day"))
    assert cover.live[-1] == (marker.until, NOW)
    for query, figures in live.items():
        assert _figures([tenant], query) == _approx(figures), query
    assert selectors.tail_histograms(f=_filters([tenant], "range=day"))["rounds"]["faq"][90] == 1


def test_an_hour_rolled_while_open_is_rolled_whole_once_it_has_closed(tenant, data):
    rollup_pass(now=NOW, max_hours=None)
    hour = datetime(2026, 11, 29, 12, tzinfo=UTC)
    assert RollupHour.objects.get(hour=hour).until == datetime(2026, 11, 29, 12, 36, tzinfo=UTC)
    _open_hour_run(tenant, "late-in-hour", datetime(2026, 11, 29, 12, 50, tzinfo=UTC), rounds=93)
    later = datetime(2026, 11, 29, 13, 5, tzinfo=UTC)
    with time_machine.travel(later, tick=False):
        assert rollup_pass(now=later) == 2  # 12:00 whole, and 13:00 up to 13:04
        marker = RollupHour.objects.get(hour=hour)
        assert marker.until == hour + HOUR and not marker.dirty
        assert TailRollup.objects.filter(hour=hour, metric="rounds", value=93).exists()
        ids = {tenant.slug: tenant.pk}
        options = selectors.filter_options(tenant_ids=(tenant.pk,), fresh=True)
        f = filters_parse(params=QueryDict("range=day"), tenants=ids, options=options, now=later)
        rolled = selectors.run_figures(f=f)["totals"]
        tail = selectors.tail_histograms(f=f)
        RollupHour.objects.update(dirty=True)  # everything live
        assert selectors.run_figures(f=f)["totals"] == {k: pytest.approx(v) for k, v in rolled.items()}
        assert selectors.tail_histograms(f=f) == tail


def test_the_long_tail_from_the_rollup_is_the_live_one_for_every_range_and_filter(tenant, data):
    live = {query: selectors.tail_histograms(f=_filters([tenant], query)) for query in QUERIES}
    rollup_pass(now=NOW, max_hours=None)
    assert TailRollup.objects.exists()
    for query in QUERIES:
        assert selectors.tail_histograms(f=_filters([tenant], query)) == live[query], query
