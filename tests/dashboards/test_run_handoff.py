"""A person answers a run that waits for one: resume or stop on the run's page, safe twice, listed in
the operator queue, kept to the user's tenants; and what the guard answers afterwards."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from dashboards.models import Membership
from ingest.guard import config_cache_clear
from ingest.models import Run
from ingest.services import events_ingest
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result, ts

pytestmark = pytest.mark.django_db

FAILED = {"status": "error", "error_class": "not_found", "result": "no order o9"}


@pytest.fixture(autouse=True)
def fresh_config():
    config_cache_clear()


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant, scopes=("ingest", "ledger"))


def _store(tenant, events: list[dict]) -> None:
    result = events_ingest(tenant=tenant, events=events, max_event_bytes=settings.LOOPWATCH_MAX_EVENT_BYTES)
    assert result.count("accepted") == len(events), result.verdicts


def _check(api, key, n: int, *, run_id: str = "r1", tool: str = "search_orders", args=None) -> dict:
    body = {"tool": tool, "kind": "read", "args": args or {"id": "o9"}, "round": n, "ts": ts(n)}
    response = api.post(f"/api/v1/runs/{run_id}/check", body, key)
    assert response.status_code == 200, response.content
    return response.json()


def _waiting(tenant, api, key, run_id: str = "r1") -> Run:
    """A run the guard handed to a person: the same call failed 4 times, the 5th is asked about.

    The refused call is not traced: the detection that asked for the person stays after the run's
    last tool_call, the case where an answered handoff must not ask again by itself.
    """
    events = [run_started(run_id)]
    for n in range(1, 5):
        events += [
            model_round(run_id, n=n),
            tool_call(run_id, f"c{n}", n=n, args={"id": "o9"}),
            tool_result(run_id, f"c{n}", n=n, **FAILED),
        ]
    _store(tenant, events)
    assert _check(api, key, 5, run_id=run_id)["decision"] == "handoff"
    run = Run.objects.get(tenant=tenant, run_id=run_id)
    assert run.status == Run.Status.WAITING
    return run


def _member(tenant, name: str, role: str = "operator"):
    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def _client(user, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def _answer(client, run: Run, answer: str, note: str = "the order exists now", shown_at=None):
    shown = (run.handoff or {}).get("at", "") if shown_at is None else shown_at
    return client.post(f"/runs/{run.pk}/", {"answer": answer, "note": note, "shown_at": shown})


def _fake_waiting(tenant, run_id: str, waiting_for: timedelta, **fields) -> Run:
    at = timezone.now() - waiting_for
    handoff = {"at": at.isoformat(), "by": "guard", "kind": "repeated_error", "tool": "get_order"}
    handoff.update(count=4, hint=f"{run_id} keeps failing the same way.")
    return Run.objects.create(
        tenant=tenant, run_id=run_id, status=Run.Status.WAITING, handoff=handoff, **fields
    )


# --- the run's page ------------------------------------------------------------------------------


def test_an_operator_sees_the_summary_and_the_form_of_a_waiting_run(tenant, api, key):
    run = _waiting(tenant, api, key)
    page = _client(_member(tenant, "ana")).get(f"/runs/{run.pk}/").content.decode()
    assert "Waiting for a person" in page and 'id="handoff-form"' in page
    assert "<b>repeated_error</b>" in page and "search_orders" in page
    assert 'id="handoff-resume"' in page and 'id="handoff-stop"' in page
    assert "the same loop will ask again if it goes on" in page
    assert f'name="shown_at" value="{run.handoff["at"]}"' in page


def test_an_operator_resumes_the_run_and_the_page_says_who_when_and_why(tenant, api, key):
    run = _waiting(tenant, api, key)
    client = _client(_member(tenant, "ana"))
    response = _answer(client, run, "resume", note="  order o9 was created by hand  ")
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    resolved = run.handoff["resolved"]
    assert (resolved["by"], resolved["resume"], resolved["note"]) == (
        "ana",
        True,
        "order o9 was created by hand",
    )
    page = client.get(response["Location"]).content.decode()
    assert "r1: resumed — checks decide again." in page
    assert 'id="handoff-form"' not in page and "Handed to a person" in page
    answer = page.split('id="handoff-answer">')[1].split("</p>")[0]
    assert "Resumed" in answer and "ana" in answer and "order o9 was created by hand" in answer
    assert timezone.now().strftime("%Y-%m-%d") in answer
    assert "hand-off resumed by ana" in page  # the status line
    timeline = page.split('id="timeline-handoff"')[1].split("</li>")[0]
    assert "resumed" in timeline and "ana" in timeline


def test_an_operator_stops_the_run(tenant, api, key):
    run = _waiting(tenant, api, key)
    client = _client(_member(tenant, "ana", "admin"))
    response = _answer(client, run, "stop", note="the customer cancelled")
    run.refresh_from_db()
    assert (run.status, run.terminated_by, run.reason) == ("abandoned", "user", "the customer cancelled")
    assert run.finished_at is not None and run.handoff["resolved"]["resume"] is False
    page = client.get(response["Location"]).content.decode()
    assert "every check now answers terminate" in page and "Stopped" in page


def test_a_note_is_required(tenant, api, key):
    run = _waiting(tenant, api, key)
    response = _answer(_client(_member(tenant, "ana")), run, "resume", note="   ")
    page = response.content.decode()
    assert response.status_code == 400
    assert "note: required — say what changed so that the run may go on." in page
    assert 'id="handoff-form"' in page
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING


def test_an_unknown_answer_is_refused(tenant, api, key):
    run = _waiting(tenant, api, key)
    response = _answer(_client(_member(tenant, "ana")), run, "pause")
    assert response.status_code == 400 and "answer: Select a valid choice." in response.content.decode()
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING


def test_a_viewer_sees_the_panel_without_the_form_and_cannot_answer(tenant, api, key):
    run = _waiting(tenant, api, key)
    client = _client(_member(tenant, "vic", "viewer"))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Waiting for a person" in page and 'id="handoff-form"' not in page
    assert "You are a viewer of acme: operators and admins answer." in page
    assert _answer(client, run, "stop").status_code == 403
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING


def test_another_tenants_run_is_not_found_nor_answered(tenant, other_tenant, api, key):
    run = _waiting(tenant, api, key)
    client = _client(_member(other_tenant, "olga", "admin"))
    assert client.get(f"/runs/{run.pk}/").status_code == 404
    assert _answer(client, run, "stop").status_code == 404
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING
    page = client.get("/queue/")
    assert page.context["nav_runs_waiting"] == 0 and 'id="waiting-empty"' in page.content.decode()


def test_the_form_needs_the_csrf_token(tenant, api, key):
    run = _waiting(tenant, api, key)
    client = _client(_member(tenant, "ana"), csrf=True)
    assert _answer(client, run, "resume").status_code == 403
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING
    page = client.get(f"/runs/{run.pk}/").content.decode()
    token = page.split('id="handoff-form">')[1].split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    data = {"answer": "resume", "note": "ok", "shown_at": run.handoff["at"], "csrfmiddlewaretoken": token}
    assert client.post(f"/runs/{run.pk}/", data).status_code == 302
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING


# --- safe twice ----------------------------------------------------------------------------------


def test_a_second_answer_says_who_answered_when_and_changes_nothing(tenant, api, key):
    run = _waiting(tenant, api, key)
    ana = _client(_member(tenant, "ana"))
    ben = _client(_member(tenant, "ben"))
    assert _answer(ana, run, "resume").status_code == 302
    # ben's page was shown before ana answered: his stop changes nothing.
    response = _answer(ben, run, "stop", note="looks hopeless")
    assert response.status_code == 302
    page = ben.get(response["Location"]).content.decode()
    assert "Nothing done: already answered by ana at 20" in page and "UTC (resumed)" in page
    assert "the run is now running" in page
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.handoff["resolved"]["by"] == "ana"
    # ana's own second click: the same.
    page = ana.get(_answer(ana, run, "resume")["Location"]).content.decode()
    assert "already answered by ana" in page


def test_a_run_that_finished_meanwhile_is_no_longer_waiting(tenant, api, key):
    run = _waiting(tenant, api, key)
    _store(tenant, [run_finished("r1", status="failed")])
    assert Run.objects.get(pk=run.pk).status == "failed"
    client = _client(_member(tenant, "ana"))
    page = client.get(_answer(client, run, "resume")["Location"]).content.decode()
    assert "Nothing done: the run is no longer waiting (now failed)." in page
    assert "resolved" not in Run.objects.get(pk=run.pk).handoff


def test_an_answer_to_an_older_handoff_does_not_answer_a_newer_one(tenant):
    run = _fake_waiting(tenant, "r-again", timedelta(minutes=3))
    shown_at = run.handoff["at"]
    newer = {**run.handoff, "at": timezone.now().isoformat(), "kind": "no_progress"}
    Run.objects.filter(pk=run.pk).update(handoff=newer)
    client = _client(_member(tenant, "ana"))
    page = client.get(_answer(client, run, "stop", shown_at=shown_at)["Location"]).content.decode()
    assert "Nothing done: the run asked for a person again at" in page and "read the new summary" in page
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING


# --- the operator queue and the navigation bar ---------------------------------------------------


def test_the_queue_lists_the_waiting_runs_of_the_users_tenants_oldest_first(tenant, other_tenant):
    _fake_waiting(tenant, "newer", timedelta(minutes=2), agent="shop", backend="openai", model="gpt-4o")
    older = _fake_waiting(tenant, "older", timedelta(hours=1), agent="billing", task_type="refund")
    _fake_waiting(other_tenant, "theirs", timedelta(hours=2))
    Run.objects.create(tenant=tenant, run_id="just-running")
    client = _client(_member(tenant, "vic", "viewer"))
    response = client.get("/queue/")
    page = response.content.decode()
    table = page.split('id="waiting-table"')[1].split("</table>")[0]
    assert table.index(">older<") < table.index(">newer<")
    assert "theirs" not in page and "just-running" not in table
    assert f'href="/runs/{older.pk}/"' in table and "billing" in table and "refund" in table
    assert "openai / gpt-4o" in table and "repeated_error (get_order, 4 times): older keeps failing" in table
    assert "1\xa0hour" in table  # waiting for
    assert 'id="waiting-total">2<' in page
    assert response.context["nav_runs_waiting"] == 2 and 'id="nav-runs-waiting">2<' in page
    assert 'id="nav-queue-open">0<' in page  # the writes' count is its own
    # The queue's tenant and search filters apply to the runs as well.
    assert ">older<" not in client.get("/queue/", {"q": "new"}).content.decode()


def test_an_answer_takes_the_run_off_the_queue_and_the_count(tenant, api, key):
    run = _waiting(tenant, api, key)
    client = _client(_member(tenant, "ana"))
    assert client.get("/queue/").context["nav_runs_waiting"] == 1
    _answer(client, run, "resume")
    response = client.get("/queue/")
    assert response.context["nav_runs_waiting"] == 0 and 'id="waiting-empty"' in response.content.decode()


# --- what the guard answers after the answer -----------------------------------------------------


def test_after_resume_a_new_call_is_allowed_and_the_run_stays_running(tenant, api, key):
    run = _waiting(tenant, api, key)
    _answer(_client(_member(tenant, "ana")), run, "resume")
    answer = _check(api, key, 5, tool="get_order", args={"id": "o1"})
    assert answer["decision"] == "allow", answer
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    # The engine's counts carried on: two more failures of the same call and the guard stops it.
    events = []
    for n in (5, 6):
        events += [
            tool_call("r1", f"c{n}", n=n, args={"id": "o9"}),
            tool_result("r1", f"c{n}", n=n, **FAILED),
        ]
    _store(tenant, events)
    answer = _check(api, key, 7, tool="get_order", args={"id": "o1"})
    assert answer["decision"] == "terminate" and answer["diagnosis"]["kind"] == "repeated_error"


def test_after_stop_every_check_answers_terminate(tenant, api, key):
    run = _waiting(tenant, api, key)
    _answer(_client(_member(tenant, "ana")), run, "stop", note="cancelled")
    answer = _check(api, key, 5, tool="get_order", args={"id": "o1"})
    assert answer["decision"] == "terminate" and answer["diagnosis"]["terminated_by"] == "user"
