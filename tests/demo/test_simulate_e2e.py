"""`manage.py simulate` end to end: over HTTP to a live server, then what the server stored."""

from __future__ import annotations

import re
import urllib.request
from collections import Counter
from datetime import timedelta
from io import StringIO

import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import Max, Min
from django.utils import timezone

from demo.management.commands import simulate
from ingest.models import Event, Run, ToolCall

# live_server serves from another thread: the data must really be committed.
pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 12
# The mix is deterministic for a seed: this one's 12 runs hold four backends, four task types and
# two budget truncations (a generator change may need another seed; test_simulation checks the mix).
SEED = 20261129


def _simulate(url: str, key: str, **options) -> str:
    """simulate's REST path alone (test_demo_stack covers OTLP and the guard)."""
    out = StringIO()
    call_command(
        "simulate",
        url=url,
        key=key,
        rate=0,
        no_progress=True,
        rest_only=True,
        stdout=out,
        stderr=StringIO(),
        **options,
    )
    return out.getvalue()


def _report(text: str) -> dict[str, int]:
    head = re.search(r"simulate: (\d+) runs, (\d+) events", text)
    verdicts = re.search(r"accepted (\d+), duplicate (\d+), rejected (\d+)", text)
    assert head and verdicts, text
    runs, events = map(int, head.groups())
    accepted, duplicate, rejected = map(int, verdicts.groups())
    return {
        "runs": runs,
        "events": events,
        "accepted": accepted,
        "duplicate": duplicate,
        "rejected": rejected,
    }


def _scenario_rows(text: str) -> dict[str, int]:
    """Runs per scenario from the summary's table."""
    rows = re.findall(r"^  ([a-z_]+)\s+(\d+)\s+(\d+)$", text, flags=re.MULTILINE)
    return {name: int(runs) for name, runs, _ in rows if int(runs)}


def _api_get(url: str, key: str):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return orjson.loads(response.read())


def test_it_sends_runs_the_server_stores_and_processes(live_server, tenant, make_key, tmp_path):
    call_command("demo_setup", key_file=tmp_path / "key", stdout=StringIO())  # the list prices
    key = make_key(tenant)
    before = timezone.now()
    text = _simulate(live_server.url, key, runs=RUNS, seed=SEED)
    report = _report(text)

    runs = Run.objects.filter(tenant=tenant)
    assert report["runs"] == RUNS == runs.count()
    assert report["events"] == report["accepted"] == Event.objects.filter(tenant=tenant).count()
    assert report["duplicate"] == report["rejected"] == 0

    assert len({r.backend for r in runs}) >= 3
    assert len({r.task_type for r in runs}) >= 3
    assert runs.filter(status=Run.Status.TRUNCATED, terminated_by="budget").exclude(budget_type="").exists()
    assert not runs.filter(status=Run.Status.RUNNING).exists()
    assert not runs.filter(finished_at__isnull=True).exists()
    assert Counter(r.labels["sim_scenario"] for r in runs) == _scenario_rows(text)
    # Stamped as sent: a live demo has no event in the future.
    stamps = Event.objects.filter(tenant=tenant).aggregate(first=Min("ts"), last=Max("ts"))
    assert before - timedelta(seconds=1) <= stamps["first"] <= stamps["last"] <= timezone.now()
    # Rounds without a cost_usd were priced from the table.
    assert all(r.cost_usd > 0 for r in runs if r.backend != "local" and r.rounds)

    # Every event was processed (eager Celery in the server thread), and every call met its result.
    for run in runs.select_related("cursor"):
        assert run.cursor.position == run.events_count > 0, run.run_id
    calls = ToolCall.objects.filter(run__tenant=tenant)
    assert calls.count() == sum(r.tool_calls for r in runs) > 0
    assert not calls.filter(result_status="").exists()
    assert calls.filter(kind=ToolCall.Kind.WRITE).exists()

    # Detection ran on every run: loops flagged, legitimate repetition left alone.
    assert {"ok", "loop"} <= {r.labels["sim_expect"] for r in runs}
    for run in runs:
        expect = run.labels["sim_expect"]
        if expect == "ok":
            assert not run.loop_flagged, (run.run_id, list(run.detections.values_list("kind", "action")))
        elif expect == "loop":
            assert run.loop_flagged, run.run_id

    # The read API agrees.
    listed = _api_get(f"{live_server.url}/api/v1/runs?limit=100", key)
    assert len(listed) == RUNS
    assert all(r["processed"] == r["events_count"] and r["finished_at"] for r in listed)


def test_it_makes_new_runs_when_run_twice_with_the_same_seed(live_server, tenant, make_key):
    key = make_key(tenant)
    first = _report(_simulate(live_server.url, key, runs=2, seed=5))
    second = _report(_simulate(live_server.url, key, runs=2, seed=5))
    assert first["events"] == second["events"] == second["accepted"]
    runs = Run.objects.filter(tenant=tenant)
    assert runs.count() == 4
    assert (
        sorted(r.labels["sim_scenario"] for r in runs)[::2]
        == sorted(r.labels["sim_scenario"] for r in runs)[1::2]
    )


def test_it_fails_loudly_on_a_bad_key(live_server, tenant):
    with pytest.raises(CommandError, match="HTTP 401"):
        _simulate(live_server.url, "lw_not-a-key", runs=1)


def test_it_counts_and_shows_rejected_events(live_server, tenant, make_key, monkeypatch):
    real = simulate.run_generate

    def broken(*args, **kwargs):
        run = real(*args, **kwargs)
        run.events[1]["event_id"] = ""
        return run

    monkeypatch.setattr(simulate, "run_generate", broken)
    err = StringIO()
    with pytest.raises(CommandError, match="2 events were rejected"):
        call_command(
            "simulate",
            url=live_server.url,
            key=make_key(tenant),
            runs=2,
            rate=0,
            no_progress=True,
            rest_only=True,
            stdout=StringIO(),
            stderr=err,
        )
    assert err.getvalue().count("rejected: run") == 2
    assert "event_id: must not be empty" in err.getvalue()


def test_it_needs_a_key(monkeypatch):
    monkeypatch.delenv("LOOPWATCH_API_KEY", raising=False)
    with pytest.raises(CommandError, match="LOOPWATCH_API_KEY"):
        call_command("simulate", runs=1, no_progress=True)
