"""One run's bad data never stops detection for the others (issue 11, item 1).

The audit's triggers are refused at the door now (test_hostile_input), but runs stored before the
door refused them are still in the database. These tests store such events the way ingest stored
them then (validation skipped: `plant`), and check that a detection pass either processes them with
its counts bounded, or quarantines the run alone (a savepoint per run when a pass fails), with a
next try after an exponential backoff, while every other run of the pass, of any tenant, is
processed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import orjson
import pytest
from django.db import transaction
from django.utils import timezone

from ingest.bulk import insert_statement, statements_run
from ingest.models import Detection, ModelRound, Run, RunCursor, ToolCall
from ingest.services import QUARANTINE_FIRST_S, ingestion, runs_process
from ingest.tasks import detect_sweep
from tests.ingest.events import model_round, run_started, tool_call, tool_result

pytestmark = pytest.mark.django_db


def plant(tenant, events: list[dict]) -> list[int]:
    """Store events as ingest did before the limits: no validation (the values the audit sent were
    accepted then). Returns the runs touched; nothing is processed."""
    valid = [
        (i, event, datetime.fromisoformat(event["ts"]), orjson.dumps(event)) for i, event in enumerate(events)
    ]
    with transaction.atomic():
        return ingestion._store_atomic(tenant, valid, [None] * len(events), ledger_scope=True)


def normal_run(run_id: str) -> list[dict]:
    events = [run_started(run_id), model_round(run_id, n=1, cost_usd=0.01)]
    for n in (1, 2, 3):  # the same read three times: an exact repeat fires
        events += [tool_call(run_id, f"c{n}", n=n), tool_result(run_id, f"c{n}", n=n)]
    return events


def huge_cost(run_id: str) -> list[dict]:
    """model_round.cost_usd 1e308 (int(used) in the cost budget, then orjson's 64-bit limit), and
    more rounds at 1e308 after the budget fired (math.fsum's overflow in the money burned)."""
    events = [run_started(run_id, budgets={"max_cost_usd": 5})]
    return events + [model_round(run_id, n=n, cost_usd=1e308) for n in (1, 2, 3)]


def century(run_id: str) -> list[dict]:
    """run_started in 1900, then a call now: ~4e9 s of wall clock overflowed Detection.count."""
    return [
        {**run_started(run_id), "ts": "1900-01-01T00:00:00Z"},
        tool_call(run_id, "c1", n=1),
        tool_result(run_id, "c1", n=1),
    ]


def calendar_ends(run_id: str) -> list[dict]:
    """ts of year 0001 and 9999 with an offset: stored as 1 BC and 10000, which psycopg cannot read."""
    return [
        run_started(run_id),
        {**model_round(run_id, n=1), "ts": "0001-01-01T00:00:00+01:00"},
        {**model_round(run_id, n=2), "ts": "9999-12-31T23:00:00-05:00"},
    ]


def corrupt(run_id: str) -> list[dict]:
    """A stored tool_call without its call_id (no version ever accepted it: it stands for whatever a
    future bug lets through). Processing it raises."""
    call = tool_call(run_id, "c1", n=1)
    del call["call_id"]
    return [run_started(run_id), call]


POISON = {"huge-cost": huge_cost, "century": century, "calendar-ends": calendar_ends}


def _cursor(tenant, run_id: str) -> RunCursor:
    return RunCursor.objects.get(run__tenant=tenant, run__run_id=run_id)


def _caught_up(tenant, run_id: str) -> bool:
    cursor = _cursor(tenant, run_id)
    return cursor.position == cursor.run.events_count and cursor.failures == 0


def test_poison_runs_of_one_tenant_do_not_stop_another_tenants_runs(needs_postgres, tenant, other_tenant):
    poison = []
    for name, make in POISON.items():
        poison += plant(tenant, make(name))
    poison += plant(tenant, corrupt("corrupt"))
    mine = plant(other_tenant, normal_run("b1") + normal_run("b2"))
    # One pass over all of them, the poison first: before, the pass raised and rolled back all.
    runs_process(run_pks=[*poison, *mine])
    for run_id in ("b1", "b2"):
        assert _caught_up(other_tenant, run_id)
        assert Detection.objects.filter(run__run_id=run_id, kind="exact_repeat").exists()
    # The values the engine bounds are processed, their figures storable.
    for name in POISON:
        assert _caught_up(tenant, name), name
    wall = Detection.objects.get(run__run_id="century", kind="budget")
    assert wall.count == 2**31 - 1 and wall.evidence["budget_type"] == "max_wall_s"
    costly = Run.objects.get(tenant=tenant, run_id="huge-cost")
    assert costly.terminated_by == "budget" and costly.budget_type == "max_cost_usd"
    assert 0 < costly.cost_after_loop_usd < float("inf")
    assert all(
        0 <= cost <= 1e6 for cost in ModelRound.objects.filter(run=costly).values_list("cost_usd", flat=True)
    )
    # The run that still raises is quarantined, alone.
    cursor = _cursor(tenant, "corrupt")
    assert cursor.position == 0 and cursor.failures == 1
    assert "KeyError" in cursor.error and "call_id" in cursor.error
    assert cursor.retry_at is not None
    assert timedelta(seconds=QUARANTINE_FIRST_S - 5) < cursor.retry_at - timezone.now()
    assert cursor.retry_at - timezone.now() <= timedelta(seconds=QUARANTINE_FIRST_S)
    assert not ToolCall.objects.filter(run=cursor.run).exists()  # its pass was rolled back, alone
    # The years Python cannot hold, stored as 1 BC and 10000, read as the first and last it can.
    ends = Run.objects.get(tenant=tenant, run_id="calendar-ends")
    assert ends.started_at.year == 1 and ends.last_event_at.year == 9999
    assert [r.ts.year for r in ModelRound.objects.filter(run=ends).order_by("seq")] == [1, 9999]


def test_a_value_past_orjsons_64_bits_in_a_row_is_stored_as_a_float(needs_postgres, tenant):
    """The pass writes rows as one JSON array (ingest.bulk): one such value failed the statement."""
    (pk,) = plant(tenant, [run_started("r")])
    evidence = {"consumed": 2**70, "nested": [{"n": -(2**80)}], "fine": 2**64 - 1}
    row = Detection(tenant=tenant, run_id=pk, seq=1, kind="budget", action="terminate", evidence=evidence)
    row.ts = timezone.now()
    statements_run([insert_statement(Detection, [row])])
    stored = Detection.objects.get(run_id=pk).evidence
    assert stored["consumed"] == pytest.approx(2**70, rel=1e-15)  # jsonb reads 1.18e21 back as digits
    assert stored["nested"][0]["n"] == pytest.approx(-(2**80), rel=1e-15)
    assert stored["fine"] == 2**64 - 1


def test_a_quarantined_run_waits_for_its_next_try_then_backs_off_then_recovers(tenant):
    (pk,) = plant(tenant, corrupt("corrupt"))
    runs_process(run_pks=[pk])
    first = _cursor(tenant, "corrupt")
    assert first.failures == 1
    # Before its next try: passed over, not tried again (no hot loop), and not swept.
    assert runs_process(run_pks=[pk]) == 0
    assert detect_sweep() == 0
    assert _cursor(tenant, "corrupt").failures == 1
    # Due: the sweep queues it (eager here: processed at once), it fails again, the wait doubles.
    RunCursor.objects.filter(run_id=pk).update(retry_at=timezone.now() - timedelta(seconds=1))
    with transaction.atomic():
        assert detect_sweep() == 1
    second = _cursor(tenant, "corrupt")
    assert second.failures == 2
    waited = second.retry_at - timezone.now()
    assert (
        timedelta(seconds=2 * QUARANTINE_FIRST_S - 10) < waited <= timedelta(seconds=2 * QUARANTINE_FIRST_S)
    )
    # Repaired (here by hand), and due: processed, and the quarantine is lifted.
    from ingest.models import Event

    call = Event.objects.get(run_id=pk, type="tool_call")
    call.body = {**call.body, "call_id": "c1"}
    call.save()
    RunCursor.objects.filter(run_id=pk).update(retry_at=timezone.now() - timedelta(seconds=1))
    assert runs_process(run_pks=[pk]) == 2
    cursor = _cursor(tenant, "corrupt")
    assert (cursor.failures, cursor.error, cursor.retry_at) == (0, "", None)
    assert ToolCall.objects.filter(run_id=pk).count() == 1


def test_a_second_task_failing_the_same_try_does_not_count_it_twice(tenant):
    """Two workers queued for one run: the failed pass's savepoint lets go of the cursor's lock before
    its quarantine takes it again, and the other worker can take the run in between and fail the
    same try (test_poison_workers saw failures == 2 in CI). Its quarantine leaves the first one's."""
    from ingest.services.pipeline import _quarantine

    (pk,) = plant(tenant, corrupt("corrupt"))
    runs_process(run_pks=[pk])
    first = _cursor(tenant, "corrupt")
    with transaction.atomic():
        _quarantine(pk, KeyError("call_id"))  # the other worker's failure of the same try
    again = _cursor(tenant, "corrupt")
    assert (again.failures, again.retry_at, again.failed_at) == (1, first.retry_at, first.failed_at)


def test_a_batch_for_a_quarantined_run_does_not_make_it_try_again_early(api, tenant, make_key):
    key = make_key(tenant)
    (pk,) = plant(tenant, corrupt("corrupt"))
    runs_process(run_pks=[pk])
    response = api.post("/api/v1/events", [model_round("corrupt", n=2)], key)  # queues detection (eager)
    assert response.status_code == 200
    cursor = _cursor(tenant, "corrupt")
    assert cursor.failures == 1 and cursor.position == 0
