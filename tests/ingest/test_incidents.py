"""Incidents: a run's detections of one problem fold into one row (ingest.incidents)."""

from __future__ import annotations

import pytest

from ingest.incidents import guard_answer_record, incident_deliveries, incidents_backfill, reached_summary
from ingest.models import Detection, GuardDelivery, Incident, Run
from ingest.services import events_ingest, run_process, run_reprocess
from tests.ingest.events import model_round, run_started, tool_call, tool_result


def _loop(run_id: str, calls: int, *, args: dict | None = None, start: int = 1) -> list[dict]:
    events = [run_started(run_id, agent="shop")] if start == 1 else []
    for i in range(start, start + calls):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i, args=args or {"customer": "42"}),
            tool_result(run_id, f"c{i}", n=i, result={"orders": []}),
        ]
    return events


def _process(tenant, events: list[dict]) -> Run:
    runs = events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20).runs_touched
    for pk in runs:
        run_process(run_pk=pk)
    return Run.objects.get(pk=runs[0])


@pytest.mark.django_db
def test_a_problem_escalating_is_one_incident_with_its_steps(tenant):
    run = _process(tenant, _loop("esc", 12))
    actions = list(
        Detection.objects.filter(run=run, kind="exact_repeat")
        .exclude(action="observe")
        .values_list("action", flat=True)
    )
    assert len(actions) >= 3 and actions[-1] == "terminate", actions  # the loop escalated to the end
    incident = Incident.objects.get(run=run)
    assert (incident.kind, incident.action, incident.alerts) == ("exact_repeat", "terminate", len(actions))
    assert [s["action"] for s in incident.steps] == actions
    assert incident.first_seen < incident.last_seen
    assert incident.status == Incident.Status.OPEN
    assert incident.agent == "shop"


@pytest.mark.django_db
def test_another_problem_of_the_same_run_is_another_incident(tenant):
    events = _loop("two", 3) + _loop("two", 3, args={"customer": "77"}, start=4)
    run = _process(tenant, events)
    incidents = Incident.objects.filter(run=run).order_by("pk")
    signatures = set(
        Detection.objects.filter(run=run).exclude(action="observe").values_list("kind", "signature")
    )
    assert len(signatures) >= 2
    assert {(i.kind, i.signature) for i in incidents} == signatures


@pytest.mark.django_db
def test_batches_and_processing_again_count_nothing_twice(tenant):
    events = _loop("twice", 8)
    events_ingest(tenant=tenant, events=events[:10], max_event_bytes=1 << 20)
    run = Run.objects.get(run_id="twice")
    run_process(run_pk=run.pk)
    events_ingest(tenant=tenant, events=events[10:], max_event_bytes=1 << 20)
    run_process(run_pk=run.pk)
    stored = Detection.objects.filter(run=run).exclude(action="observe").count()
    incident = Incident.objects.get(run=run)
    assert incident.alerts == stored
    run_reprocess(run_pk=run.pk)
    incident.refresh_from_db()
    assert incident.alerts == stored
    assert Incident.objects.filter(run=run).count() == 1


@pytest.mark.django_db
def test_the_backfill_makes_the_incidents_of_stored_detections(tenant):
    run = _process(tenant, _loop("old", 8))
    expected = {(i.kind, i.signature, i.action, i.alerts) for i in Incident.objects.filter(run=run)}
    Incident.objects.all().delete()
    assert incidents_backfill() >= 1
    assert {(i.kind, i.signature, i.action, i.alerts) for i in Incident.objects.filter(run=run)} == expected


@pytest.mark.django_db
def test_a_new_step_after_a_verdict_opens_the_incident_again(tenant):
    events = _loop("again", 10)
    events_ingest(tenant=tenant, events=events[:10], max_event_bytes=1 << 20)
    run = Run.objects.get(run_id="again")
    run_process(run_pk=run.pk)
    Incident.objects.filter(run=run).update(status=Incident.Status.RESOLVED, verdict="true_loop")
    events_ingest(tenant=tenant, events=events[10:], max_event_bytes=1 << 20)
    run_process(run_pk=run.pk)
    incident = Incident.objects.get(run=run)
    assert (incident.status, incident.verdict) == (Incident.Status.OPEN, "true_loop")


@pytest.mark.django_db
def test_observations_alone_make_no_incident(tenant):
    run = _process(tenant, _loop("calm", 2))
    assert Detection.objects.filter(run=run, action="observe").exists()
    assert not Incident.objects.filter(run=run).exists()


@pytest.mark.django_db
def test_a_step_is_delivered_when_a_guard_check_answered_it(tenant, settings):
    run = _process(tenant, _loop("guarded", 12))
    incident = Incident.objects.get(run=run)
    assert reached_summary(run=run, deliveries=incident_deliveries(incident=incident, run=run)).startswith(
        "recorded from traces: this run does not use the guard"
    )
    from django.utils import timezone

    correct = Detection.objects.filter(run=run, action="correct").first()
    answer = {
        "run_known": True,
        "decision": "correct",
        "detections": [{"kind": correct.kind, "signature": correct.signature, "action": "correct"}],
    }
    guard_answer_record(tenant_id=tenant.pk, run_id="guarded", answer=answer, now=timezone.now())
    guard_answer_record(tenant_id=tenant.pk, run_id="guarded", answer=answer, now=timezone.now())
    run.refresh_from_db()
    assert run.guard_checked_at is not None
    assert GuardDelivery.objects.filter(run=run).count() == 1
    steps = incident_deliveries(incident=incident, run=run)
    reached = {s["action"]: s["reached"] for s in steps}
    assert reached["correct"] == "guard" and reached["terminate"] == "traces"
    summary = reached_summary(run=run, deliveries=steps)
    assert "delivered by a guard check: correct" in summary
    assert "only recorded from traces" in summary and "terminate" in summary


@pytest.mark.django_db
def test_a_terminated_runs_check_delivers_its_stored_terminate(tenant):
    run = _process(tenant, _loop("ended", 12))
    from django.utils import timezone

    guard_answer_record(
        tenant_id=tenant.pk,
        run_id="ended",
        answer={"run_known": True, "decision": "terminate", "detections": []},
        now=timezone.now(),
    )
    assert list(GuardDelivery.objects.filter(run=run).values_list("action", flat=True)) == ["terminate"]
