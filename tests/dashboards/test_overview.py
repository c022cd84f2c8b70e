from __future__ import annotations

import gzip
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.cache import cache

from dashboards.models import Membership
from dashboards.overview.plotlyjs import plotlyjs_version
from ingest.models import Detection, Operation, Run
from ingest.services import events_ingest
from tests.ingest.events import model_round, run_started

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_options():
    """The filter options are cached per set of tenant pks, which SQLite hands out again after a test."""
    cache.clear()


# tests/ingest/events.py stamps events 2026-11-29T10:MM:SSZ: the overview's "last day" then holds them.
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clock():
    with time_machine.travel(NOW, tick=False):
        yield


def _member(tenant, username: str = "ana"):
    user = get_user_model().objects.create_user(username, password="pw")
    Membership.objects.create(user=user, tenant=tenant)
    return user


def _run(tenant, run_id: str, **fields) -> Run:
    fields.setdefault("started_at", NOW - timedelta(hours=2))
    fields.setdefault("status", "succeeded")
    return Run.objects.create(tenant=tenant, run_id=run_id, **fields)


def _figures(page: str) -> dict[str, dict]:
    """The figures the page hands to Plotly (json_script), by element id."""
    found = re.findall(r'<script id="(fig-[\w-]+)" type="application/json">(.*?)</script>', page, re.S)
    return {element: json.loads(text) for element, text in found}


def test_the_overview_needs_a_login(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_overview_shows_only_the_users_tenants(client, tenant, other_tenant):
    events_ingest(tenant=tenant, events=[run_started("mine"), model_round("mine")], max_event_bytes=1 << 20)
    events_ingest(
        tenant=other_tenant, events=[run_started("theirs", backend="anthropic")], max_event_bytes=1 << 20
    )
    client.force_login(_member(tenant))
    page = client.get("/").content.decode()
    assert "mine" in page and "theirs" not in page and "anthropic" not in page
    assert 'id="runs-total">1<' in page


def test_another_tenants_values_are_refused_like_made_up_ones(client, tenant, other_tenant):
    _run(tenant, "mine", backend="openai", task_type="faq")
    _run(other_tenant, "theirs", backend="anthropic", model="secret", task_type="research", agent="spy")
    client.force_login(_member(tenant))
    for query, field in (
        ("tenant=globex", "tenant"),
        ("backend=anthropic", "backend"),
        ("model=secret", "model"),
        ("task_type=research", "task_type"),
        ("agent=spy", "agent"),
        ("bin_task=research&bin_lo=1&bin_hi=2", "bin_task"),
    ):
        response = client.get(f"/?{query}")
        assert response.status_code == 400, query
        assert f'data-field="{field}"' in response.content.decode()
        fragment = client.get(f"/overview/tail/?{query}")
        assert fragment.status_code == 400 and fragment.content.decode().startswith(f"{field}:")


def test_the_tail_fragment_lists_only_the_users_runs(client, tenant, other_tenant):
    mine = _run(tenant, "mine-long", task_type="research", rounds=50)
    _run(other_tenant, "theirs-long", task_type="research", rounds=50)
    client.force_login(_member(tenant))
    response = client.get("/overview/tail/?range=day&bin_task=research&bin_lo=49&bin_hi=64")
    body = response.content.decode()
    assert response.status_code == 200
    assert f'href="/runs/{mine.pk}/"' in body and "theirs-long" not in body
    assert "research runs with 49\u201364 model rounds: 1" in body


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("range=year", "range"),
        ("range=custom", "from"),
        ("range=custom&from=yesterday&to=2026-11-29T10:00", "from"),
        ("range=custom&from=2026-11-29T10:00&to=2026-11-29T09:00", "to"),
        ("range=custom&from=2020-01-01&to=2026-11-29", "to"),
        ("range=day&range=week", "range"),
        ("metric=tokens", "metric"),
        ("backend=nope", "backend"),
        ("model=gpt-4o&backend=local", "model"),
        ("bin_task=faq&bin_lo=-1&bin_hi=3", "bin_lo"),
        ("bin_task=faq&bin_lo=5&bin_hi=3", "bin_hi"),
        ("bin_task=faq&bin_lo=5", "bin_hi"),
        ("bin_task=faq&bin_lo=1&bin_hi=99999999999", "bin_hi"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(client, tenant, query, field):
    _run(tenant, "r", backend="openai", model="gpt-4o", task_type="faq")
    _run(tenant, "r2", backend="local", model="llama", task_type="faq")
    client.force_login(_member(tenant))
    response = client.get(f"/?{query}")
    assert response.status_code == 400
    assert f'data-field="{field}"' in response.content.decode()


def test_the_range_and_filters_choose_the_runs(client, tenant):
    _run(tenant, "recent-openai", backend="openai", started_at=NOW - timedelta(minutes=20))
    _run(tenant, "recent-local", backend="local", started_at=NOW - timedelta(minutes=30))
    _run(tenant, "this-week", backend="openai", started_at=NOW - timedelta(days=3))
    client.force_login(_member(tenant))

    def total(query: str) -> int:
        page = client.get(f"/?{query}").content.decode()
        return int(re.search(r'id="runs-total">(\d+)<', page).group(1))

    assert (total("range=hour"), total("range=day"), total("range=week")) == (2, 2, 3)
    assert total("range=week&backend=openai") == 2
    assert total("range=custom&from=2026-11-26T00:00&to=2026-11-27T00:00") == 1


def test_the_charts_come_with_their_data_and_our_plotly(client, tenant):
    run = _run(
        tenant,
        "r",
        backend="openai",
        model="gpt-4o",
        task_type="research",
        rounds=40,
        tool_calls=90,
        cost_usd=2.0,
        cost_after_loop_usd=0.5,
        loop_flagged=True,
    )
    _run(
        tenant,
        "r2",
        backend="openai",
        model="gpt-4o",
        task_type="research",
        status="truncated",
        terminated_by="budget",
        budget_type="max_rounds",
        rounds=150,
        cost_usd=6.0,
    )
    Detection.objects.create(
        tenant=tenant,
        run=run,
        seq=5,
        kind="exact_repeat",
        action="correct",
        backend="openai",
        model="gpt-4o",
        task_type="research",
        feedback="false_alarm",
        ts=NOW - timedelta(hours=1),
    )
    Operation.objects.create(
        tenant=tenant,
        operation_key="k1",
        tool="refund",
        fingerprint="f",
        status="UNKNOWN",
        unknown_since=NOW - timedelta(minutes=20),
        run=run,
    )
    client.force_login(_member(tenant))
    page = client.get("/").content.decode()
    assert f'<script src="/plotly/{plotlyjs_version()}/plotly.min.js">' in page
    assert "cdn" not in page.lower()
    figures = _figures(page)
    assert set(figures) == {
        "fig-loops",
        "fig-budget_type",
        "fig-budget_task",
        "fig-tail",
        "fig-cost_success",
        "fig-cost_burned",
        "fig-repeats",
        "fig-false_alarms",
        "fig-unknown_ages",
    }
    tail = next(t for t in figures["fig-tail"]["data"] if t["visible"])
    assert sum(n for n in tail["y"] if n) == 2
    assert figures["fig-cost_success"]["data"][0]["y"] == [8.0]  # $8 spent, one success
    assert 'id="burned-total">$0.50<' in page
    assert 'id="unknown-open">1</b> writes UNKNOWN, oldest for 20 min<' in page
    assert 'id="false-alarm-rate">100.0 %<' in page
    # both runs started in the same step: one of its two finished runs ended by max_rounds
    assert [(t["name"], max(t["y"])) for t in figures["fig-budget_type"]["data"]] == [("max_rounds", 50.0)]


def test_a_bar_link_shows_its_runs_under_the_chart(client, tenant):
    run = _run(tenant, "long-one", task_type="research", rounds=55)
    client.force_login(_member(tenant))
    page = client.get("/?bin_task=research&bin_lo=49&bin_hi=64").content.decode()
    assert 'id="tail-runs"' in page and f'href="/runs/{run.pk}/">long-one</a>' in page


def test_the_overview_says_what_to_do_when_empty(client, tenant):
    client.force_login(_member(tenant))
    page = client.get("/").content.decode()
    assert "No traces yet" in page and "manage.py simulate" in page
    assert "plotly" not in page


def test_a_range_without_runs_says_when_the_last_one_started(client, tenant):
    _run(tenant, "old", started_at=NOW - timedelta(days=3))
    client.force_login(_member(tenant))
    page = client.get("/?range=hour").content.decode()
    assert "No run started in this range" in page and "2026-11-26 12:00" in page


def test_a_user_without_a_tenant_is_told_to_ask_for_one(client, tenant):
    _run(tenant, "r")
    client.force_login(get_user_model().objects.create_user("lonely", password="pw"))
    page = client.get("/").content.decode()
    assert "not a member of any tenant" in page and "runs-total" not in page


def test_plotly_is_served_by_us_with_long_caching(client):
    url = f"/plotly/{plotlyjs_version()}/plotly.min.js"
    plain = client.get(url)
    assert plain.status_code == 200 and plain["Content-Type"].startswith("text/javascript")
    assert "immutable" in plain["Cache-Control"] and "max-age=31536000" in plain["Cache-Control"]
    body = plain.content
    assert b"plotly" in body[:2000].lower() and len(body) > 1_000_000
    zipped = client.get(url, HTTP_ACCEPT_ENCODING="gzip, br")
    assert zipped["Content-Encoding"] == "gzip" and gzip.decompress(zipped.content) == body
    assert len(zipped.content) < len(body) / 2
    assert client.get(url, HTTP_IF_NONE_MATCH=plain["ETag"]).status_code == 304
    stale = client.get("/plotly/0.0.1/plotly.min.js")
    assert stale.status_code == 302 and stale["Location"] == url


def test_a_member_signs_in_through_the_login_page(client, tenant):
    _member(tenant, "cai")
    assert "Sign in" in client.get("/accounts/login/?next=/").content.decode()
    response = client.post("/accounts/login/", {"username": "cai", "password": "pw", "next": "/"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert "Overview" in client.get("/").content.decode()


def test_a_member_of_two_tenants_sees_both_or_the_one_chosen(client, tenant, other_tenant):
    _run(tenant, "acme-run", backend="openai")
    _run(other_tenant, "globex-run", backend="anthropic")
    user = _member(tenant)
    Membership.objects.create(user=user, tenant=other_tenant)
    client.force_login(user)
    both = client.get("/").content.decode()
    assert "acme-run" in both and "globex-run" in both and 'id="runs-total">2<' in both
    assert "Tenants: acme, globex." in both and '<select name="tenant">' in both
    one = client.get("/?tenant=globex").content.decode()
    assert "globex-run" in one and "acme-run" not in one and "Tenants: globex." in one


def test_unknown_writes_show_even_without_runs(client, tenant, other_tenant):
    Operation.objects.create(
        tenant=tenant,
        operation_key="k",
        tool="refund",
        fingerprint="f",
        status="UNKNOWN",
        unknown_since=NOW - timedelta(hours=3, minutes=5),
    )
    Operation.objects.create(
        tenant=other_tenant,
        operation_key="x",
        tool="refund",
        fingerprint="f",
        status="UNKNOWN",
        unknown_since=NOW - timedelta(days=2),
    )
    client.force_login(_member(tenant))
    page = client.get("/").content.decode()
    assert "No traces yet" in page
    assert (
        'id="unknown-open">1</b> writes claimed through the ledger API are UNKNOWN, the oldest for 3 h 5 min'
        in page
    )
