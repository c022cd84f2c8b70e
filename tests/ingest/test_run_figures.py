"""Where a run's figures come from: ingest numbers the events and writes what run_started and
run_finished describe; the detection pass counts the rest (rounds, calls, errors, tokens, cost,
first and last event), each event once (RunCursor.figures_seq), even when a run is processed again
or quarantined."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from ingest.models import Backend, Event, ModelPrice, Run, RunCursor, Tenant
from ingest.services import events_ingest, run_reprocess, runs_process
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result, with_ids
from tests.ingest.test_poison import corrupt, plant

COUNTED = ("rounds", "tool_calls", "tool_errors", "input_tokens", "output_tokens", "cost_usd")


def _figures(run: Run) -> dict:
    run.refresh_from_db()
    return {name: getattr(run, name) for name in (*COUNTED, "started_at", "last_event_at", "events_count")}


def _events(run_id: str = "r1") -> list[dict]:
    return with_ids(
        [
            run_started(run_id, backend="priced", model="m1"),
            model_round(run_id, n=1),  # priced: 1,000 in, 100 out
            tool_call(run_id, "c1", n=1),
            tool_result(run_id, "c1", n=1, status="error", result={"error": "down"}),
            {**model_round(run_id, n=2, cost_usd=0.5), "input_tokens": 10, "output_tokens": 5},
            tool_call(run_id, "c2", n=2),
            tool_result(run_id, "c2", n=2),
        ]
    )


@pytest.fixture
def prices(db):
    backend = Backend.objects.create(name="priced", markup="2.000")
    ModelPrice.objects.create(backend=backend, model="m1", input_usd_per_mtok=3, output_usd_per_mtok=15)


EXPECTED = {
    "rounds": 2,
    "tool_calls": 2,
    "tool_errors": 1,
    "input_tokens": 1010,
    "output_tokens": 105,
    # (1,000 * 3 + 100 * 15) / 1e6 * markup 2, and the round that came with its cost
    "cost_usd": pytest.approx(0.009 + 0.5),
}


@pytest.mark.django_db
def test_ingest_numbers_and_describes_the_pass_counts_the_rest(tenant, prices):
    events = _events()
    result = events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)
    assert result.count("accepted") == len(events)
    run = Run.objects.get(tenant=tenant, run_id="r1")
    # Stored and described, not yet counted (the pass runs after the commit, on a worker).
    assert (run.events_count, run.backend, run.model, run.agent) == (7, "priced", "m1", "shop")
    assert run.started_at == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)  # run_started's ts
    assert {name: getattr(run, name) for name in COUNTED} == dict.fromkeys(COUNTED, 0)
    assert run.last_event_at is None

    assert runs_process(run_pks=result.runs_touched) == 7
    figures = _figures(run)
    assert {name: figures[name] for name in COUNTED} == EXPECTED
    assert figures["last_event_at"] == datetime(2026, 11, 29, 10, 0, 2, tzinfo=UTC)
    assert RunCursor.objects.get(run=run).figures_seq == 7

    # The next batch adds to them; run_finished describes the end at once.
    more = with_ids([model_round("r1", n=3, cost_usd=0.25), run_finished("r1", status="failed")])
    events_ingest(tenant=tenant, events=more, max_event_bytes=1 << 20)
    run.refresh_from_db()
    assert (run.status, run.events_count, run.rounds) == ("failed", 9, 2)
    runs_process(run_pks=[run.pk])
    figures = _figures(run)
    assert (figures["rounds"], figures["input_tokens"]) == (3, 2010)
    assert figures["cost_usd"] == pytest.approx(0.009 + 0.5 + 0.25)
    assert figures["last_event_at"] == datetime(2026, 11, 29, 10, 0, 59, tzinfo=UTC)


@pytest.mark.django_db
def test_a_run_processed_again_is_not_counted_twice(tenant, prices):
    result = events_ingest(tenant=tenant, events=_events(), max_event_bytes=1 << 20)
    runs_process(run_pks=result.runs_touched)
    run = Run.objects.get(tenant=tenant, run_id="r1")
    before = _figures(run)

    assert run_reprocess(run_pk=run.pk) == 7  # every event through the engine again
    assert _figures(run) == before
    cursor = RunCursor.objects.get(run=run)
    assert (cursor.position, cursor.figures_seq) == (7, 7)

    events_ingest(tenant=tenant, events=with_ids([tool_call("r1", "c3", n=3)]), max_event_bytes=1 << 20)
    runs_process(run_pks=[run.pk])
    assert _figures(run)["tool_calls"] == before["tool_calls"] + 1


@pytest.mark.django_db
def test_a_quarantined_run_still_gets_its_figures_once(tenant, prices):
    # A call stored without its call_id: detection raises on it, the run is quarantined.
    (pk,) = plant(tenant, [*corrupt("bad"), model_round("bad", n=1, cost_usd=0.125)])
    runs_process(run_pks=[pk])
    cursor = RunCursor.objects.get(run_id=pk)
    assert (cursor.failures, cursor.position) == (1, 0)
    assert cursor.figures_seq == 3
    figures = _figures(Run.objects.get(pk=pk))
    assert (figures["tool_calls"], figures["rounds"], figures["cost_usd"]) == (1, 1, 0.125)
    assert figures["started_at"] is not None and figures["last_event_at"] is not None

    # Its next try fails again: counted once all the same.
    RunCursor.objects.filter(run_id=pk).update(retry_at=timezone.now() - timedelta(seconds=1))
    runs_process(run_pks=[pk])
    assert RunCursor.objects.get(run_id=pk).failures == 2
    assert _figures(Run.objects.get(pk=pk)) == figures


@pytest.mark.django_db(transaction=True)
def test_the_migration_starts_the_count_where_ingest_left_it(needs_postgres):
    """Every event stored before 0020 was counted by ingest: figures_seq starts at events_count."""
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("ingest", "0019_cursor_state_text")])
        tenant = Tenant.objects.create(slug="acme")
        # Five calls stored and counted by ingest, three of them processed by detection.
        run = Run.objects.create(tenant=tenant, run_id="r1", events_count=5, tool_calls=5)
        for seq in range(1, 6):
            body = tool_call("r1", f"c{seq}", n=seq, args={"n": seq})
            Event.objects.create(
                tenant=tenant,
                run=run,
                seq=seq,
                type="tool_call",
                ts=datetime.fromisoformat(body["ts"]),
                body=body,
            )
        with connection.cursor() as cursor:  # 0019's columns (the model has figures_seq now)
            cursor.execute(
                "INSERT INTO ingest_runcursor (run_id, position, processed, updated_at, failures, error) "
                "VALUES (%s, 3, 3, now(), 0, '')",
                [run.pk],
            )
        executor = MigrationExecutor(connection)
        executor.migrate([("ingest", "0020_cursor_figures_seq")])
        cursor = RunCursor.objects.get(run=run)
        assert (cursor.position, cursor.figures_seq) == (3, 5)

        # The pass after the upgrade detects the two calls left and counts them not again.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        assert runs_process(run_pks=[run.pk]) == 2
        run.refresh_from_db()
        assert (run.tool_calls, RunCursor.objects.get(run=run).position) == (5, 5)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db
def test_the_api_says_how_far_the_figures_count(api, tenant, make_key, prices):
    key = make_key(tenant)
    events_ingest(tenant=tenant, events=_events(), max_event_bytes=1 << 20)  # no pass yet
    body = api.get("/api/v1/runs/r1", key).json()
    assert (body["events_count"], body["processed"], body["counted"]) == (7, 0, 0)
    assert (body["backend"], body["rounds"], body["tool_calls"]) == ("priced", 0, 0)

    runs_process(run_pks=[Run.objects.get(tenant=tenant, run_id="r1").pk])
    body = api.get("/api/v1/runs/r1", key).json()
    assert (body["events_count"], body["processed"], body["counted"]) == (7, 7, 7)
    assert (body["rounds"], body["tool_calls"], body["tool_errors"]) == (2, 2, 1)


@pytest.mark.django_db
def test_a_run_whose_figures_cannot_be_counted_either_keeps_them_and_holds_up_no_other(tenant, caplog):
    # A result stored without its status (no version accepted it): counting it raises too.
    broken = [run_started("broken"), tool_call("broken", "c1", n=1), tool_result("broken", "c1", n=1)]
    del broken[2]["status"]
    (bad,) = plant(tenant, broken)
    (good,) = plant(tenant, [run_started("good"), tool_call("good", "c1", n=1)])
    runs_process(run_pks=[bad, good])

    cursor = RunCursor.objects.get(run_id=bad)
    assert (cursor.failures, cursor.position, cursor.figures_seq) == (1, 0, 0)
    assert _figures(Run.objects.get(pk=bad))["tool_calls"] == 0
    assert "its figures could not be counted either" in caplog.text
    assert _figures(Run.objects.get(pk=good))["tool_calls"] == 1
    assert RunCursor.objects.get(run_id=good).figures_seq == 2
