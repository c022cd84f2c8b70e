"""Runs stored before the limits (issue 11, items 1 and 5) render on every page and API.

The audit's runs gave 500 on /check, GET /api/v1/runs, /runs/ and the run page (round(inf)); labels
{"items": "ab"} broke the run page; costs of 1e308 broke the overview and its rollup for every
tenant. A run whose detection failed is shown to its operators, and the runs list filters them.
"""

from __future__ import annotations

import importlib
import math
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from dashboards.models import Membership, RunRollup
from ingest.models import ModelRound, Run, RunCursor
from ingest.services import runs_process
from tests.ingest.events import model_round, run_started
from tests.ingest.test_poison import calendar_ends, century, corrupt, huge_cost, normal_run, plant

pytestmark = pytest.mark.django_db


def _member(tenant, username: str = "ana"):
    user = get_user_model().objects.create_user(username, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.OPERATOR)
    return user


@pytest.fixture
def stored(tenant) -> dict[str, Run]:
    """The audit's runs, stored as ingest stored them before the limits, then processed."""
    plant(tenant, [run_started("labels", labels={"items": "ab", "keys": "cd", "env": "<b>prod</b>"})])
    plant(tenant, normal_run("labels"))
    for make in (huge_cost, century, calendar_ends, corrupt, normal_run):
        plant(tenant, make(make.__name__.replace("_", "-")))
    runs_process(run_pks=list(Run.objects.filter(tenant=tenant).values_list("pk", flat=True)))
    return {run.run_id: run for run in Run.objects.filter(tenant=tenant)}


def test_every_page_and_api_renders_the_audits_runs(needs_postgres, client, api, tenant, make_key, stored):
    client.force_login(_member(tenant))
    for url in ["/runs/", "/runs/?detection=failed", "/", *(f"/runs/{run.pk}/" for run in stored.values())]:
        response = client.get(url)
        assert response.status_code == 200, (url, response.content[-2000:])
    key = make_key(tenant, ["ingest", "read"])
    listed = api.get("/api/v1/runs", key)
    assert listed.status_code == 200
    assert {row["run_id"] for row in listed.json()} == set(stored)
    for run_id in stored:
        assert api.get(f"/api/v1/runs/{run_id}", key).status_code == 200
        check = api.post(f"/api/v1/runs/{run_id}/check", {"tool": "search_orders", "args": {"q": 1}}, key)
        assert check.status_code == 200, (run_id, check.content)


def test_labels_named_like_dict_methods_render_as_labels(needs_postgres, client, tenant, stored):
    client.force_login(_member(tenant))
    page = client.get(f"/runs/{stored['labels'].pk}/").content.decode()
    assert "<code>items=ab</code>" in page and "<code>keys=cd</code>" in page
    assert "<code>env=&lt;b&gt;prod&lt;/b&gt;</code>" in page


def test_a_quarantined_run_is_shown_to_operators_and_filtered(
    needs_postgres, client, api, tenant, make_key, stored
):
    client.force_login(_member(tenant))
    quarantined = stored["corrupt"]
    cursor = RunCursor.objects.get(run=quarantined)
    page = client.get(f"/runs/{quarantined.pk}/").content.decode()
    assert 'id="detection-failed"' in page
    assert "Detection failed on this run" in page and "KeyError" in page and "call_id" in page
    assert timezone.localtime(cursor.retry_at).strftime("%Y-%m-%d %H:%M") in page
    healthy = client.get(f"/runs/{stored['normal-run'].pk}/").content.decode()
    assert 'id="detection-failed"' not in healthy
    failed = client.get("/runs/?detection=failed").content.decode()
    assert f"/runs/{quarantined.pk}/" in failed and f"/runs/{stored['normal-run'].pk}/" not in failed
    assert "detection failed" in client.get("/runs/").content.decode()  # the list marks it too
    key = make_key(tenant, ["read"])
    rows = {row["run_id"]: row for row in api.get("/api/v1/runs", key).json()}
    assert rows["corrupt"]["detection"]["failures"] == 1
    assert "KeyError" in rows["corrupt"]["detection"]["error"]
    assert rows["normal-run"]["detection"] == {
        "failures": 0,
        "error": "",
        "failed_at": None,
        "retry_at": None,
    }
    only = api.get("/api/v1/runs", key, detection="failed").json()
    assert [row["run_id"] for row in only] == ["corrupt"]
    assert api.get("/api/v1/runs", key, detection="maybe").status_code == 400


def test_costs_stored_before_the_caps_are_capped_by_the_migration(needs_postgres, client, tenant, stored):
    """What the old pipeline stored and the new one cannot: a run's cost of Infinity (three rounds of
    1e308 summed in Python), two runs of 1e308 (PostgreSQL's SUM overflowed: the overview and the
    rollup of every tenant failed), rounds of 1e308. The migration caps them once."""
    Run.objects.filter(pk=stored["huge-cost"].pk).update(cost_usd=math.inf, cost_after_loop_usd=math.inf)
    Run.objects.filter(pk__in=[stored["century"].pk, stored["normal-run"].pk]).update(cost_usd=1e308)
    ModelRound.objects.filter(run=stored["huge-cost"]).update(cost_usd=1e308)
    migration = importlib.import_module("ingest.migrations.0011_poison")

    from django.apps import apps

    migration.costs_cap(apps, None)
    assert max(Run.objects.values_list("cost_usd", flat=True)) <= 1e15
    assert max(Run.objects.values_list("cost_after_loop_usd", flat=True)) <= 1e15
    assert max(ModelRound.objects.values_list("cost_usd", flat=True)) <= 1e6
    client.force_login(_member(tenant))
    assert client.get("/").status_code == 200
    for run in stored.values():
        Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(hours=3))
    call_command("overview_rollup", "--rebuild")
    assert all(math.isfinite(cost) for cost in RunRollup.objects.values_list("cost", flat=True))


def test_a_runs_cost_stays_within_its_cap_however_many_rounds(needs_postgres, api, tenant, make_key):
    key = make_key(tenant)
    api.post("/api/v1/events", [run_started("r1")], key)
    for _ in range(3):
        rounds = [model_round("r1", n=n, cost_usd=1_000_000) for n in range(1, 501)]
        assert api.post("/api/v1/events", rounds, key).status_code == 200
    run = Run.objects.get(tenant=tenant)
    assert run.cost_usd == pytest.approx(1.5e9)  # well within: the cap only bounds what sums can reach
    Run.objects.filter(pk=run.pk).update(cost_usd=1e15 - 1)
    api.post("/api/v1/events", [model_round("r1", n=1, cost_usd=1_000_000)], key)
    assert Run.objects.get(pk=run.pk).cost_usd == 1e15


def test_rollup_hours_that_summed_an_infinite_cost_are_read_live_again(tenant):
    from datetime import UTC, datetime

    from django.apps import apps

    from dashboards.models import RollupHour

    hour = datetime(2026, 11, 29, 10, tzinfo=UTC)
    for when, cost in ((hour, math.inf), (hour + timedelta(hours=1), 12.5)):
        RollupHour.objects.create(hour=when, rolled_at=when + timedelta(hours=1))
        RunRollup.objects.create(tenant=tenant, hour=when, backend="b", task_type="t", cost=cost, runs=1)
    importlib.import_module("dashboards.migrations.0004_poison").hours_dirty(apps, None)
    assert list(RollupHour.objects.order_by("hour").values_list("dirty", flat=True)) == [True, False]
