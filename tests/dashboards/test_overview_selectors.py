"""The overview's reads, against the database: what they count, and only within the user's tenants."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from django.core.cache import cache
from django.http import QueryDict

from dashboards.overview import selectors
from dashboards.overview.filters import FilterOptions, filters_parse
from ingest.models import Detection, Operation, Run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_options():
    """The filter options are cached per set of tenant pks, which SQLite hands out again after a test."""
    cache.clear()


NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
FINISHED = {"succeeded", "failed", "truncated", "abandoned"}


def _filters(tenants, query: str = "", options: FilterOptions | None = None):
    ids = {t.slug: t.pk for t in tenants}
    options = options or selectors.filter_options(tenant_ids=tuple(ids.values()), fresh=True)
    return filters_parse(params=QueryDict(query), tenants=ids, options=options, now=NOW)


def _run(tenant, run_id: str, **fields) -> Run:
    fields.setdefault("started_at", NOW - timedelta(hours=1))
    return Run.objects.create(tenant=tenant, run_id=run_id, **fields)


def _random_runs(tenant, rng: random.Random, n: int, prefix: str, age: timedelta) -> list[Run]:
    runs = []
    for i in range(n):
        status = rng.choice(["running", "succeeded", "succeeded", "failed", "truncated", "waiting"])
        by_budget = status == "truncated" or (status == "failed" and rng.random() < 0.3)
        cost = round(rng.uniform(0, 2), 4)
        runs.append(
            _run(
                tenant,
                f"{prefix}{i}",
                backend=rng.choice(["openai", "anthropic", "local"]),
                model=rng.choice(["m1", "m2"]),
                task_type=rng.choice(["faq", "research"]),
                agent=rng.choice(["a", "b"]),
                status=status,
                terminated_by="budget" if by_budget else "",
                budget_type=rng.choice(["max_rounds", "max_tool_calls", ""]) if by_budget else "",
                started_at=NOW - age * rng.random(),
                rounds=rng.randint(0, 60),
                tool_calls=rng.randint(0, 120),
                events_count=rng.randint(1, 300),
                cost_usd=cost,
                cost_after_loop_usd=round(cost * rng.random(), 4) if rng.random() < 0.3 else 0,
                loop_flagged=rng.random() < 0.3,
            )
        )
    return runs


def test_run_figures_count_the_runs_started_in_range_of_the_users_tenants(tenant, other_tenant):
    rng = random.Random(3)
    mine = _random_runs(tenant, rng, 60, "in", timedelta(hours=23))
    _random_runs(tenant, rng, 10, "old", timedelta(hours=1))
    Run.objects.filter(run_id__startswith="old").update(started_at=NOW - timedelta(days=3))
    _random_runs(other_tenant, rng, 20, "theirs", timedelta(hours=23))
    got = selectors.run_figures(f=_filters([tenant], "range=day"))
    finished = [r for r in mine if r.status in FINISHED]
    assert got["totals"]["runs"] == len(mine)
    assert got["totals"]["running"] == sum(r.status == "running" for r in mine)
    assert got["totals"]["finished"] == len(finished)
    assert got["totals"]["budget"] == sum(r.terminated_by == "budget" for r in finished)
    assert got["totals"]["events"] == sum(r.events_count for r in mine)
    assert got["totals"]["cost"] == pytest.approx(sum(r.cost_usd for r in mine))
    assert got["totals"]["burned"] == pytest.approx(sum(r.cost_after_loop_usd for r in mine))
    for line in got["by_backend"]:
        theirs = [r for r in mine if r.backend == line["backend"]]
        assert line["runs"] == len(theirs)
        assert line["succeeded"] == sum(r.status == "succeeded" for r in theirs)
        assert line["flagged"] == sum(r.loop_flagged for r in theirs)
        assert line["tool_calls"] == sum(r.tool_calls for r in theirs)
        assert line["success_cost"] == pytest.approx(
            sum(r.cost_usd for r in theirs if r.status == "succeeded")
        )
    per_type = Counter()
    for row in got["budget_rows"]:
        per_type[row["budget_type"]] += row["runs"]
    expected = Counter(
        (r.budget_type or "unspecified") if r.terminated_by == "budget" else "" for r in finished
    )
    assert per_type == expected


def test_runs_are_put_in_the_bucket_of_their_start(tenant):
    nine = datetime(2026, 11, 29, 9, tzinfo=UTC)
    for minute in (0, 179, 180, 359, 360):
        _run(tenant, f"r{minute}", status="succeeded", started_at=nine + timedelta(minutes=minute))
    assert _filters([tenant], "range=custom&from=2026-11-29T09:00&to=2026-11-29T12:00").step == timedelta(
        minutes=5
    )
    f = _filters([tenant], "range=custom&from=2026-11-20T09:00&to=2026-11-29T16:00")
    assert f.step == timedelta(hours=3)
    rows = selectors.run_figures(f=f)["budget_rows"]
    assert [(row["bucket"].hour, row["runs"]) for row in rows] == [(9, 2), (12, 2), (15, 1)]


def test_the_time_axis_covers_the_range_in_steps(tenant):
    _run(tenant, "r")
    f = _filters([tenant], "range=day")
    axis = selectors.buckets(f=f)
    assert axis[0] <= f.start < axis[0] + f.step and axis[-1] < f.end <= axis[-1] + f.step
    assert all(b - a == f.step for a, b in pairwise(axis))


def test_the_tail_counts_finished_runs_per_value(tenant):
    rng = random.Random(9)
    runs = _random_runs(tenant, rng, 50, "r", timedelta(hours=20))
    hist = selectors.tail_histograms(f=_filters([tenant], "range=day"))
    for metric in ("rounds", "tool_calls"):
        expected: dict[str, Counter] = {}
        for r in runs:
            if r.status in FINISHED:
                expected.setdefault(r.task_type, Counter())[getattr(r, metric)] += 1
        assert {task: dict(c) for task, c in expected.items()} == hist[metric]


def test_a_tail_bar_lists_its_runs_longest_first(tenant, other_tenant):
    for i, rounds in enumerate((9, 12, 10, 13, 8)):
        _run(tenant, f"r{i}", task_type="research", status="succeeded", rounds=rounds)
    _run(tenant, "running", task_type="research", status="running", rounds=11)
    _run(tenant, "faq", task_type="faq", status="succeeded", rounds=11)
    _run(other_tenant, "theirs", task_type="research", status="succeeded", rounds=11)
    f = _filters([tenant], "range=day&bin_task=research&bin_lo=9&bin_hi=12")
    listed, total = selectors.tail_runs(f=f)
    assert [r.rounds for r in listed] == [12, 10, 9] and total == 3
    listed, total = selectors.tail_runs(f=f, limit=2)
    assert [r.rounds for r in listed] == [12, 10] and total == 3
    f = _filters([tenant], "range=day&metric=tool_calls&bin_task=research&bin_lo=0&bin_hi=0")
    assert selectors.tail_runs(f=f)[1] == 5


def _detection(run, seq: int, kind: str, action: str, feedback: str = "", at: datetime = NOW) -> Detection:
    return Detection.objects.create(
        tenant=run.tenant,
        run=run,
        seq=seq,
        kind=kind,
        action=action,
        backend=run.backend,
        model=run.model,
        task_type=run.task_type,
        agent=run.agent,
        feedback=feedback,
        ts=at - timedelta(minutes=30),
    )


def test_detections_are_counted_by_interventions_over_time_and_in_all(tenant, other_tenant):
    run = _run(tenant, "r", backend="openai", model="gpt-4o", agent="shop")
    other_agent = _run(tenant, "r2", backend="openai", model="gpt-4o", agent="ops")
    theirs = _run(other_tenant, "t", backend="openai", model="gpt-4o")
    _detection(run, 1, "exact_repeat", "observe")
    _detection(run, 2, "exact_repeat", "correct", feedback="true_loop")
    _detection(run, 3, "exact_repeat", "terminate")
    _detection(other_agent, 1, "oscillation", "correct", feedback="false_alarm")
    _detection(run, 9, "no_progress", "handoff", at=NOW - timedelta(days=2))  # before the range
    _detection(theirs, 1, "exact_repeat", "correct")
    got = selectors.detection_rows(f=_filters([tenant], "range=day"))
    assert sum(r["n"] for r in got["series"]) == 3
    assert Counter({(r["kind"], r["action"], r["feedback"]): r["n"] for r in got["totals"]}) == Counter(
        {
            ("exact_repeat", "observe", ""): 1,
            ("exact_repeat", "correct", "true_loop"): 1,
            ("exact_repeat", "terminate", ""): 1,
            ("oscillation", "correct", "false_alarm"): 1,
        }
    )
    by_agent = selectors.detection_rows(f=_filters([tenant], "range=day&agent=ops"))
    assert [(r["kind"], r["n"]) for r in by_agent["series"]] == [("oscillation", 1)]


def test_unknown_writes_are_aged_and_the_oldest_listed(tenant, other_tenant):
    run = _run(tenant, "r", backend="openai")
    ages = {
        "a": timedelta(minutes=2),
        "b": timedelta(minutes=40),
        "c": timedelta(hours=30),
        "d": timedelta(hours=3),
    }
    for key, age in ages.items():
        Operation.objects.create(
            tenant=tenant,
            operation_key=key,
            tool="refund",
            fingerprint="f",
            status="UNKNOWN",
            unknown_since=NOW - age,
            run=run,
        )
    Operation.objects.create(
        tenant=tenant, operation_key="done", tool="refund", fingerprint="f", status="SUCCEEDED"
    )
    Operation.objects.create(
        tenant=other_tenant,
        operation_key="x",
        tool="refund",
        fingerprint="f",
        status="UNKNOWN",
        unknown_since=NOW - timedelta(days=9),
    )
    got = selectors.unknown_operations(f=_filters([tenant], "range=hour"), now=NOW)
    assert got["open"] == 4 and got["oldest_age"] == timedelta(hours=30)
    assert dict(got["ages"]) == {
        "< 5 min": 1,
        "5-15 min": 0,
        "15-60 min": 1,
        "1-6 h": 1,
        "6-24 h": 0,
        "> 1 day": 1,
    }
    assert [op.operation_key for op in got["oldest"]] == ["c", "d", "b", "a"]
    assert (
        selectors.unknown_operations(f=_filters([tenant], "range=hour&backend=openai"), now=NOW)["open"] == 4
    )


def test_filter_options_are_what_the_tenants_runs_hold_and_refresh_when_asked(tenant, other_tenant):
    _run(tenant, "r1", backend="openai", model="gpt-4o", task_type="faq", agent="shop")
    _run(other_tenant, "t1", backend="secret-backend", model="x", task_type="secret", agent="spy")
    options = selectors.filter_options(tenant_ids=(tenant.pk,), fresh=True)
    assert (options.backends, options.models, options.task_types, options.agents) == (
        ("openai",),
        (("openai", "gpt-4o"),),
        ("faq",),
        ("shop",),
    )
    _run(tenant, "r2", backend="anthropic", model="claude", task_type="faq", agent="shop")
    assert selectors.filter_options(tenant_ids=(tenant.pk,)).backends == ("openai",)  # cached
    assert selectors.filter_options(tenant_ids=(tenant.pk,), fresh=True).backends == ("anthropic", "openai")
