"""Incidents on the pages: the verdict names its incident, the run page gives one too, and the
incident says what reached the agent; the alerts socket carries each alert's incident."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from dashboards.alerts.selectors import IncidentFilters, incident_list
from dashboards.models import Membership
from ingest.incidents import guard_answer_record
from ingest.models import Detection, Incident
from ingest.services import events_ingest
from tests.dashboards.test_alerts import _json, _loop, _socket, socket_db, socket_test


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    """The socket test on a fresh in-memory channel layer, as tests/dashboards/test_alerts.py's."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def _user(tenant, name: str, role: str = Membership.Role.OPERATOR):
    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def _ingest(tenant, events, capture) -> None:
    with capture(execute=True):
        events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)


def _verdict_url(pk) -> str:
    return f"/alerts/incidents/{pk}/verdict/"


@pytest.fixture
def escalated(tenant, django_capture_on_commit_callbacks) -> Incident:
    """A loop that went correct → handoff → terminate: one incident."""
    _ingest(tenant, _loop("esc-1", repeats=12, agent="shop"), django_capture_on_commit_callbacks)
    return Incident.objects.get(run__run_id="esc-1")


@pytest.mark.django_db
def test_a_verdict_is_given_to_the_whole_incident(client, tenant, escalated):
    ana = _user(tenant, "ana")
    client.force_login(ana)
    response = client.post(
        _verdict_url(escalated.pk),
        {"verdict": "false_alarm", "note": "the user asked", "incident": str(escalated.pk)},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 200, response.content
    answer = response.json()
    assert (answer["id"], answer["verdict"], answer["status"], answer["verdict_by"]) == (
        escalated.pk,
        "false_alarm",
        "resolved",
        "ana",
    )
    assert f"Incident {escalated.pk} (exact_repeat on esc-1)" in answer["message"]
    marked = Detection.objects.filter(run=escalated.run).exclude(action="observe")
    assert marked.count() == escalated.alerts >= 3
    assert set(marked.values_list("feedback", "feedback_note", "feedback_by")) == {
        ("false_alarm", "the user asked", ana.pk)
    }
    client.post(_verdict_url(escalated.pk), {"verdict": "clear", "incident": str(escalated.pk)})
    escalated.refresh_from_db()
    assert (escalated.verdict, escalated.status) == ("", "open")
    assert not Detection.objects.filter(run=escalated.run).exclude(feedback="").exists()


@pytest.mark.django_db
def test_a_verdict_naming_another_incident_is_refused(
    client, tenant, escalated, django_capture_on_commit_callbacks
):
    _ingest(tenant, _loop("esc-2", repeats=3), django_capture_on_commit_callbacks)
    other = Incident.objects.get(run__run_id="esc-2")
    client.force_login(_user(tenant, "ana"))
    wrong = client.post(
        _verdict_url(escalated.pk),
        {"verdict": "true_loop", "incident": str(other.pk)},
        HTTP_ACCEPT="application/json",
    )
    assert wrong.status_code == 409
    assert wrong.json()["field"] == "incident" and f"incident {escalated.pk}" in wrong.json()["detail"]
    missing = client.post(
        _verdict_url(escalated.pk), {"verdict": "true_loop"}, HTTP_ACCEPT="application/json"
    )
    assert missing.status_code == 400 and missing.json()["field"] == "incident"
    bad = client.post(
        _verdict_url(escalated.pk),
        {"verdict": "maybe", "incident": str(escalated.pk)},
        HTTP_ACCEPT="application/json",
    )
    assert bad.status_code == 400 and bad.json()["field"] == "verdict"
    long = client.post(
        _verdict_url(escalated.pk),
        {"verdict": "true_loop", "incident": str(escalated.pk), "note": "x" * 2001},
        HTTP_ACCEPT="application/json",
    )
    assert long.status_code == 400 and long.json()["field"] == "note"
    assert not Incident.objects.exclude(verdict="").exists()


@pytest.mark.django_db
def test_a_viewer_and_another_tenant_cannot_give_a_verdict(client, tenant, other_tenant, escalated):
    client.force_login(_user(tenant, "vic", Membership.Role.VIEWER))
    body = {"verdict": "true_loop", "incident": str(escalated.pk)}
    assert client.post(_verdict_url(escalated.pk), body).status_code == 403
    client.force_login(_user(other_tenant, "oz"))
    assert client.post(_verdict_url(escalated.pk), body).status_code == 404
    assert client.get(f"/alerts/incidents/{escalated.pk}/").status_code == 404
    assert not Incident.objects.exclude(verdict="").exists()


@pytest.mark.django_db
def test_the_run_page_lists_its_incidents_with_a_verdict_form(client, tenant, escalated):
    client.force_login(_user(tenant, "ana"))
    page = client.get(f"/runs/{escalated.run_id}/").content.decode()
    row = page.split(f'id="run-incident-{escalated.pk}"')[1].split("</tr>")[0]
    assert "correct → handoff → terminate" in row
    assert f'action="/alerts/incidents/{escalated.pk}/verdict/"' in row
    assert f'name="incident" value="{escalated.pk}"' in row
    assert "traces only" in row and "does not use the guard" in page
    response = client.post(
        _verdict_url(escalated.pk),
        {"verdict": "true_loop", "incident": str(escalated.pk), "next": f"/runs/{escalated.run_id}/"},
    )
    assert response.status_code == 302 and response["Location"] == f"/runs/{escalated.run_id}/"
    escalated.refresh_from_db()
    assert escalated.verdict == "true_loop"


@pytest.mark.django_db
def test_the_incident_says_which_steps_reached_the_agent(client, tenant, escalated):
    handoff = Detection.objects.filter(run=escalated.run, action="handoff").first()
    guard_answer_record(
        tenant_id=tenant.pk,
        run_id="esc-1",
        answer={
            "run_known": True,
            "decision": "handoff",
            "detections": [{"kind": handoff.kind, "signature": handoff.signature, "action": "handoff"}],
        },
        now=timezone.now(),
    )
    client.force_login(_user(tenant, "ana"))
    page = client.get(f"/alerts/incidents/{escalated.pk}/").content.decode()
    assert "delivered by a guard check: handoff" in page
    assert "only recorded from traces (no check answered it): correct, terminate" in page
    listed, _ = incident_list(tenant_ids=[tenant.pk], filters=IncidentFilters(), now=timezone.now())
    assert listed[0]["reached"] == "partly"


@pytest.mark.django_db
def test_older_incidents_are_a_page_away(client, tenant, django_capture_on_commit_callbacks):
    for n in range(5):
        _ingest(tenant, _loop(f"page-{n}"), django_capture_on_commit_callbacks)
    ids = sorted(Incident.objects.values_list("pk", flat=True), reverse=True)
    first, more = incident_list(
        tenant_ids=[tenant.pk], filters=IncidentFilters(), limit=3, now=timezone.now()
    )
    assert [i["id"] for i in first] == ids[:3] and more
    rest, more = incident_list(
        tenant_ids=[tenant.pk], filters=IncidentFilters(), before=ids[2], limit=3, now=timezone.now()
    )
    assert [i["id"] for i in rest] == ids[3:] and not more
    client.force_login(_user(tenant, "ana"))
    page = client.get("/alerts/", {"before": ids[2]}).content.decode()
    assert f'id="incident-{ids[3]}"' in page and f'id="incident-{ids[0]}"' not in page


@socket_db
@socket_test
async def test_the_socket_carries_each_alerts_incident_and_its_verdicts(tenant):
    ana = await database_sync_to_async(_user)(tenant, "ana")
    ws = _socket(ana, "?after=0")
    await ws.connect(timeout=10)
    assert (await _json(ws))["type"] == "catch_up"  # the socket has joined its groups
    await database_sync_to_async(events_ingest)(
        tenant=tenant, events=_loop("live-1", repeats=6), max_event_bytes=1 << 20
    )
    first = (await _json(ws))["alert"]
    incident = await database_sync_to_async(Incident.objects.get)(run__run_id="live-1")
    assert first["incident"]["id"] == incident.pk
    assert first["incident"]["steps"][0]["action"] == "correct"
    later = [(await _json(ws))["alert"] for _ in range(first["incident"]["alerts"] - 1)]
    assert {a["incident"]["id"] for a in later} <= {incident.pk}
    client = Client()
    await database_sync_to_async(client.force_login)(ana)
    response = await database_sync_to_async(client.post)(
        _verdict_url(incident.pk), {"verdict": "true_loop", "incident": str(incident.pk)}
    )
    assert response.status_code == 302
    message = await _json(ws)
    assert message["type"] == "verdict"
    assert (message["verdict"]["id"], message["verdict"]["verdict"], message["verdict"]["verdict_by"]) == (
        incident.pk,
        "true_loop",
        "ana",
    )
    await ws.disconnect()
