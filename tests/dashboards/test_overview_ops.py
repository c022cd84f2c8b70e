"""The overview as operators use it (issue 15 "Charts") and as a hostile tenant loads it (issue 11,
items 4 and 12): bars that open their alerts, threshold changes on the time axes, steps as people say
them, and a page that stays small and inert whatever names and how many pairs a tenant sends."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.cache import cache

from dashboards.alerts.selectors import AlertFilterError, AlertFilters
from dashboards.models import ConfigChange, Membership
from dashboards.overview import charts
from ingest.incidents import incidents_refresh, problem_keys
from ingest.models import Detection, Incident, Run

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fresh():
    cache.clear()
    with time_machine.travel(NOW, tick=False):
        yield


def _member(tenant, username="ana", role="viewer"):
    user = get_user_model().objects.create_user(username, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def _run(tenant, run_id, **fields) -> Run:
    fields.setdefault("started_at", NOW - timedelta(hours=2))
    fields.setdefault("status", "succeeded")
    fields.setdefault("task_type", "faq")
    return Run.objects.create(tenant=tenant, run_id=run_id, **fields)


def _detection(run, *, kind="exact_repeat", action="correct", ts=None, seq=3) -> Detection:
    """A detection stored as the pipeline stores one: with its incident brought up to date."""
    detection = Detection.objects.create(
        tenant=run.tenant,
        run=run,
        seq=seq,
        kind=kind,
        action=action,
        backend=run.backend,
        model=run.model,
        task_type=run.task_type,
        agent=run.agent,
        ts=ts or NOW - timedelta(hours=1, minutes=50),
    )
    incidents_refresh(keys=problem_keys([detection]))
    return detection


def _figures(page: str) -> dict[str, dict]:
    found = re.findall(r'<script id="(fig-[\w-]+)" type="application/json">(.*?)</script>', page, re.S)
    return {element: json.loads(text) for element, text in found}


def test_the_page_says_its_step_as_people_do_and_offers_the_refresh(client, tenant):
    _detection(_run(tenant, "r1", backend="openai", model="gpt-4o"))
    client.force_login(_member(tenant))
    page = client.get("/?range=day").content.decode()
    said = re.search(r'<p class="muted" id="range-said".*?</p>', page, re.S).group(0)
    assert '<span id="step">15 min</span>' in said and "0:15:00" not in said
    assert 'data-every="45"' in said and "not while a menu is open" in said
    # times as <time> elements in UTC the browser rewrites in its own zone (UTC kept on hover)
    assert re.search(
        r'<time datetime="2026-11-28T12:00:00Z" data-local="minutes" title="2026-11-28 12:00:00 UTC">', said
    )
    week = client.get("/?range=week").content.decode()
    assert '<span id="step">3 h</span>' in week
    custom = client.get("/?range=custom&from=2026-11-29T08:00&to=2026-11-29T11:00").content.decode()
    assert 'id="refresh-said"' not in custom  # a fixed range does not change: nothing to refresh


def test_threshold_changes_in_the_range_are_marked_on_the_time_charts(client, tenant, other_tenant):
    _detection(_run(tenant, "r1", backend="openai", model="gpt-4o"))
    user = _member(tenant)
    inside = ConfigChange.objects.create(
        tenant=tenant, user=user, target="thresholds backend openai", action="update", note="quieter"
    )
    ConfigChange.objects.filter(pk=inside.pk).update(at=NOW - timedelta(hours=3))
    before = ConfigChange.objects.create(tenant=tenant, user=user, target="thresholds *", action="create")
    ConfigChange.objects.filter(pk=before.pk).update(at=NOW - timedelta(days=3))
    ConfigChange.objects.create(tenant=other_tenant, target="thresholds theirs", action="create")
    client.force_login(user)
    page = client.get("/").content.decode()
    figures = _figures(page)
    marks = [s for s in figures["fig-loops"]["layout"]["shapes"] if s["line"].get("dash") == "dot"]
    assert [m["x0"] for m in marks] == ["2026-11-29T09:00:00Z"]
    notes = [a for a in figures["fig-loops"]["layout"]["annotations"] if a.get("name") == "threshold-change"]
    assert (
        len(notes) == 1 and "acme update thresholds backend openai by ana: quieter" in notes[0]["hovertext"]
    )
    assert any(
        a.get("name") == "threshold-change" for a in figures["fig-budget_type"]["layout"]["annotations"]
    )
    assert "theirs" not in page and 'id="changes-said"' in page


def test_a_hostile_backend_name_is_text_in_every_chart_and_table(client, tenant):
    hostile = '<a href="https://evil.example/">click</a>'
    run = _run(tenant, "r1", backend=hostile, model=hostile, cost_usd=1.0, tool_calls=10)
    _detection(run)
    _detection(run, kind="oscillation", seq=4)
    client.force_login(_member(tenant))
    page = client.get("/").content.decode()
    assert '<a href="https://evil.example/">' not in page  # the template escapes; json_script too
    for name, figure in _figures(page).items():
        drawn = json.dumps({k: v for k, v in figure.items()})
        drawn = re.sub(r'"(meta|customdata)": (\{[^}]*\}|\[\[.*?\]\])', "", drawn)
        assert "<a href" not in drawn, name
    loops = _figures(page)["fig-loops"]
    assert "&lt;a href" in loops["layout"]["annotations"][0]["text"]


def test_two_thousand_backend_model_pairs_give_a_bounded_page(client, tenant):
    """Issue 11 item 4 (bench/overview_facets.py measures the time and size at 2,000 pairs)."""
    pairs = 300  # past every cap (8 panels, 12 series, 20 table rows, 200 menu values)
    runs = Run.objects.bulk_create(
        [
            Run(
                tenant=tenant,
                run_id=f"r{p}",
                backend=f"backend-{p}",
                model=f"model-{p}",
                task_type=f"task-{p % 40}",
                agent=f"agent-{p}",
                status="succeeded",
                started_at=NOW - timedelta(minutes=p + 1),
                rounds=p % 30 + 1,
                tool_calls=5,
                cost_usd=0.1,
            )
            for p in range(pairs)
        ]
    )
    Detection.objects.bulk_create(
        [
            Detection(
                tenant=tenant,
                run=run,
                seq=3,
                kind="exact_repeat",
                action="correct",
                backend=run.backend,
                model=run.model,
                task_type=run.task_type,
                agent=run.agent,
                ts=run.started_at,
            )
            for run in runs
        ]
    )
    client.force_login(_member(tenant))
    response = client.get("/")
    page = response.content.decode()
    figures = _figures(page)
    assert len({t["yaxis"] for t in figures["fig-loops"]["data"]}) == charts.MAX_FACETS
    assert len(figures["fig-cost_success"]["data"][0]["x"]) == charts.MAX_SERIES
    assert len(figures["fig-repeats"]["data"][0]["x"]) == charts.MAX_SERIES
    assert len(figures["fig-budget_task"]["data"]) <= charts.MAX_SERIES
    assert len(figures["fig-tail"]["data"]) <= charts.MAX_TABLE_ROWS
    actions = re.search(r'<table id="actions".*?</table>', page, re.S).group(0)
    assert actions.count("<tr") == charts.MAX_TABLE_ROWS + 1 and "281 other backend / model pairs" in actions
    # past 200 values a filter is typed, not a menu of hundreds of options
    assert '<input name="backend" value="" placeholder="any of 300"' in page
    assert page.count("<option") < 100
    assert len(response.content) < 300_000


def test_a_bar_of_the_overview_opens_the_alerts_of_its_backend_kind_and_step(client, tenant, other_tenant):
    mine = _run(tenant, "mine", backend="openai", model="gpt-4o")
    other_model = _run(tenant, "mini", backend="openai", model="gpt-4o-mini")
    theirs = _run(other_tenant, "theirs", backend="openai", model="gpt-4o")
    at = NOW - timedelta(hours=2) + timedelta(minutes=5)
    inside = _detection(mine, kind="oscillation", ts=at)
    _detection(mine, kind="oscillation", ts=at + timedelta(minutes=20), seq=5)  # the next step
    _detection(mine, kind="exact_repeat", ts=at, seq=6)  # another kind
    _detection(other_model, kind="oscillation", ts=at)  # another model
    _detection(theirs, kind="oscillation", ts=at)
    client.force_login(_member(tenant))
    query = "backend=openai&model=gpt-4o&kind=oscillation&from=2026-11-29T10:00:00Z&to=2026-11-29T10:15:00Z"
    response = client.get(f"/alerts/?{query}")
    assert response.status_code == 200
    # The incident of `inside` and its next step (seen 10:05 to 10:25) overlaps the bar's 10:00 to 10:15.
    assert [i["id"] for i in response.context["incidents"]] == [
        Incident.objects.get(run=mine, kind="oscillation").pk
    ]
    assert inside.run_id == mine.pk
    page = response.content.decode()
    assert 'id="alerts-window"' in page and "gpt-4o" in page
    config = json.loads(
        re.search(r'<script id="alerts-config" type="application/json">(.*?)</script>', page).group(1)
    )
    assert config["query"] == {
        "kind": "oscillation",
        "backend": "openai",
        "model": "gpt-4o",
        "from": "2026-11-29T10:00:00Z",
        "to": "2026-11-29T10:15:00Z",
    }  # the socket streams the same window
    for bad, field in (
        ("from=yesterday", "from"),
        ("from=2026-11-29T10:00:00Z&to=2026-11-29T09:00:00Z", "to"),
    ):
        response = client.get(f"/alerts/?{bad}")
        assert response.status_code == 400 and field in response.content.decode()


def test_the_window_filter_matches_live_payloads_as_the_database_does():
    f = AlertFilters.parse({"from": "2026-11-29T10:00:00Z", "to": "2026-11-29T10:15:00+00:00", "model": "m"})
    base = {"action": "correct", "kind": "exact_repeat", "backend": "b", "model": "m"}
    assert f.matches({**base, "ts": "2026-11-29T10:00:00+00:00"})
    assert not f.matches({**base, "ts": "2026-11-29T10:15:00+00:00"})
    assert not f.matches({**base, "ts": "2026-11-29T09:59:59+00:00"})
    assert not f.matches({**base, "model": "other", "ts": "2026-11-29T10:01:00+00:00"})
    with pytest.raises(AlertFilterError) as exc:
        AlertFilters.parse({"model": "x" * 201})
    assert exc.value.field == "model"


def test_writes_no_reconciler_will_ask_about_count_as_needing_a_person_on_the_overview(client, tenant):
    from ingest.ledger import operation_claim, operation_complete
    from ingest.models import Reconciler

    _run(tenant, "r1")
    for key, tool in (("k1", "refund"), ("k2", "email")):
        operation_claim(tenant=tenant, key=key, tool=tool, args={}, worker_id="w", lease_s=30)
        operation_complete(tenant=tenant, key=key, worker_id="w", outcome="timeout")
    Reconciler.objects.create(
        tenant=tenant, tool="refund", url_template="https://psp.example/{operation_key}"
    )
    client.force_login(_member(tenant))
    page = client.get("/").content.decode()
    assert "1 need a person" in page
    queue = client.get("/queue/").content.decode()
    assert 'id="queue-needs-person">1<' in queue


def test_renders_past_the_limit_of_a_process_wait_then_are_told_to_come_back(client, tenant, monkeypatch):
    from dashboards.overview import views

    _detection(_run(tenant, "r1", backend="openai", model="gpt-4o"))
    client.force_login(_member(tenant))
    monkeypatch.setattr(views, "RENDER_WAIT_S", 0.01)
    held = 0
    while views.RENDERS.acquire(blocking=False):  # every render slot of this process taken
        held += 1
    try:
        response = client.get("/")
        assert response.status_code == 503 and response["Retry-After"] == "5"
        assert "being drawn for" in response.content.decode()
    finally:
        for _ in range(held):
            views.RENDERS.release()
    assert held == 2 and client.get("/").status_code == 200
