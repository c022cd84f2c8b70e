"""The operator queue: open writes of the user's tenants, decisions with a note, safe double clicks."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from dashboards.models import Membership
from dashboards.queue.selectors import QueueFilters, queue_operations
from ingest.ledger import (
    AlreadyResolved,
    TransitionRefused,
    operation_claim,
    operation_complete,
    operation_reconcile_now,
    operation_resolve,
)
from ingest.models import Operation, Reconciler
from ingest.services import events_ingest

pytestmark = pytest.mark.django_db


def _unknown(tenant, key="k1", tool="refund"):
    operation_claim(
        tenant=tenant, key=key, tool=tool, args={"payment": "p1", "amount": 10}, worker_id="w", lease_s=30
    )
    return operation_complete(tenant=tenant, key=key, worker_id="w", outcome="timeout")


def _expired(tenant, key="k-exp", tool="refund"):
    operation_claim(tenant=tenant, key=key, tool=tool, args={"x": 1}, worker_id="w2", lease_s=30)
    Operation.objects.filter(operation_key=key).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    return Operation.objects.get(operation_key=key)


def _member(tenant, name, role="operator"):
    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def _client(user, csrf=False):
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def _decide(client, op, action, note="checked in the PSP console", shown=None, **extra):
    data = {"action": action, "note": note, "shown_status": shown or op.status, **extra}
    return client.post(f"/queue/{op.pk}/", data)


# --- ledger extensions ---------------------------------------------------------------------------


def test_resolve_with_the_shown_status_refuses_a_stale_decision_naming_who_decided(tenant):
    op = _unknown(tenant)
    operation_resolve(
        operation=op, to="SUCCEEDED", user="ana", note="ok", external_reference="re_1", expected="UNKNOWN"
    )
    with pytest.raises(
        AlreadyResolved, match=r"already resolved by ana at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: now SUCCEEDED"
    ):
        operation_resolve(operation=op, to="COMPENSATED", user="ben", note="undo", expected="UNKNOWN")
    assert Operation.objects.get().history.filter(actor="user").count() == 1


def test_an_expired_lease_becomes_unknown_before_the_decision(tenant):
    op = _expired(tenant)
    done = operation_resolve(
        operation=op, to="RETRYABLE_FAILED", user="ana", note="never sent", expected="RUNNING"
    )
    assert [(t.from_status, t.to_status, t.actor) for t in done.history.all()] == [
        ("", "RUNNING", "worker"),
        ("RUNNING", "UNKNOWN", "system"),
        ("UNKNOWN", "RETRYABLE_FAILED", "user"),
    ]


def test_nobody_decides_over_a_live_lease(tenant):
    operation_claim(tenant=tenant, key="live", tool="refund", args={}, worker_id="w", lease_s=300)
    with pytest.raises(TransitionRefused):
        operation_resolve(operation=Operation.objects.get(), to="SUCCEEDED", user="ana", note="?")


class _Downstream:
    """A real HTTP status endpoint: /status/<key> answers {"state": ...} or 503."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, dict]] = {}
        self.asked: list[str] = []
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                key = self.path.removeprefix("/status/")
                downstream.asked.append(key)
                status, body = downstream.answers.get(key, (503, {"error": "busy"}))
                data = json.dumps(body).encode()
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def downstream(tenant, settings):
    settings.LOOPWATCH_RECONCILER_ALLOWED_HOSTS = ["127.0.0.1"]
    server = _Downstream()
    Reconciler.objects.create(
        tenant=tenant,
        tool="refund",
        url_template=f"http://127.0.0.1:{server.port}/status/{{operation_key}}",
        field="state",
        done_values=["done"],
        not_done_values=["not_found"],
        timeout_s=2,
        max_attempts=3,
    )
    yield server
    server.close()


def test_reconcile_now_asks_the_downstream_and_records_the_request(tenant, downstream):
    op = _unknown(tenant)
    Operation.objects.filter(pk=op.pk).update(needs_person=True)
    still = operation_reconcile_now(operation=op, user="ana", note="PSP was down", expected="UNKNOWN")
    assert still.status == "UNKNOWN" and still.last_reconcile["status"] == 503 and not still.needs_person
    downstream.answers["k1"] = (200, {"state": "done", "id": "re_9"})
    done = operation_reconcile_now(operation=op, user="ana", note="again", expected="UNKNOWN")
    assert done.status == "SUCCEEDED" and done.last_reconcile["verdict"] == "done"
    assert downstream.asked == ["k1", "k1"]
    assert [(t.from_status, t.to_status, t.actor, t.actor_id) for t in done.history.all()][2:] == [
        ("UNKNOWN", "UNKNOWN", "user", "ana"),
        ("UNKNOWN", "UNKNOWN", "user", "ana"),
        ("UNKNOWN", "SUCCEEDED", "reconciler", ""),
    ]


def test_reconcile_now_without_a_reconciler_says_so_and_needs_a_person(tenant):
    op = _unknown(tenant, tool="email")
    after = operation_reconcile_now(operation=op, user="ana", note="try", expected="UNKNOWN")
    assert after.needs_person and "no reconciler" in after.last_reconcile["answer"]


# --- selectors -----------------------------------------------------------------------------------


def test_the_queue_holds_unknown_and_expired_running_of_the_users_tenants_oldest_first(tenant, other_tenant):
    first = _unknown(tenant, "a")
    second = _unknown(tenant, "b", tool="email")
    Operation.objects.filter(pk=first.pk).update(unknown_since=timezone.now() - timedelta(hours=2))
    expired = _expired(tenant)
    operation_claim(tenant=tenant, key="live", tool="refund", args={}, worker_id="w", lease_s=300)
    _unknown(other_tenant, "theirs")
    done = _unknown(tenant, "done")
    operation_resolve(operation=done, to="RETRYABLE_FAILED", user="x", note="n")
    user = _member(tenant, "ana")
    keys = [op.operation_key for op in queue_operations(user=user, filters=QueueFilters())]
    assert keys == ["a", expired.operation_key, "b"]
    assert [o.operation_key for o in queue_operations(user=user, filters=QueueFilters(tool="email"))] == ["b"]
    Operation.objects.filter(pk=second.pk).update(external_request_id="REQ-77")
    assert [o.operation_key for o in queue_operations(user=user, filters=QueueFilters(q="req-7"))] == ["b"]
    assert [o.operation_key for o in queue_operations(user=user, filters=QueueFilters(q="k-ex"))] == ["k-exp"]
    # Nothing reconciles these tools: every one of them waits for a person (the detail page says so).
    assert [
        o.operation_key for o in queue_operations(user=user, filters=QueueFilters(needs_person=True))
    ] == ["a", "k-exp", "b"]
    Reconciler.objects.create(
        tenant=tenant, tool="refund", url_template="https://psp.example/{operation_key}"
    )
    Reconciler.objects.create(
        tenant=other_tenant, tool="email", url_template="https://mail.example/{operation_key}"
    )
    assert [
        o.operation_key for o in queue_operations(user=user, filters=QueueFilters(needs_person=True))
    ] == ["b"]  # another tenant's reconciler for "email" is not ours
    Operation.objects.filter(pk=first.pk).update(needs_person=True)  # reconciliation gave up
    assert [
        o.operation_key for o in queue_operations(user=user, filters=QueueFilters(needs_person=True))
    ] == ["a", "b"]


# --- views ---------------------------------------------------------------------------------------


def test_the_queue_page_lists_open_writes_with_what_is_needed_to_decide(client, tenant, other_tenant):
    events_ingest(
        tenant=tenant,
        events=[{"type": "run_started", "run_id": "run-7", "ts": "2026-11-29T10:00:00Z"}],
        max_event_bytes=1 << 20,
    )
    op = _unknown(tenant)
    Operation.objects.filter(pk=op.pk).update(
        external_request_id="req-55",
        reconcile_attempts=2,
        last_reconcile={"verdict": "unknown", "status": 503},
        run=tenant.runs.get(),
        needs_person=True,
    )
    _unknown(other_tenant, "theirs-key")
    client.force_login(_member(tenant, "ana", "viewer"))
    page = client.get("/queue/").content.decode()
    assert "k1" in page and "refund" in page and "req-55" in page and "2 attempts" in page and "503" in page
    assert f'href="/runs/{tenant.runs.get().pk}/"' in page
    assert "theirs-key" not in page and 'id="queue-total">1<' in page and 'id="nav-queue-open">1<' in page
    assert 'id="queue-needs-person">1</span> of them needs a person' in page


def test_another_tenants_operation_is_not_found(client, tenant, other_tenant):
    theirs = _unknown(other_tenant)
    client.force_login(_member(tenant, "ana", "admin"))
    assert client.get(f"/queue/{theirs.pk}/").status_code == 404
    assert _decide(client, theirs, "not_executed").status_code == 404
    assert Operation.objects.get().status == "UNKNOWN"


def test_the_detail_page_shows_arguments_history_and_the_last_answer(client, tenant, other_tenant):
    Reconciler.objects.create(  # another tenant's, for a tool of the same name: not ours, not shown
        tenant=other_tenant, tool="refund", url_template="https://globex-internal.example/r/{operation_key}"
    )
    op = _unknown(tenant)
    Operation.objects.filter(pk=op.pk).update(
        last_reconcile={"verdict": "unknown", "error": "connection refused"}
    )
    client.force_login(_member(tenant, "ana", "viewer"))
    page = client.get(f"/queue/{op.pk}/").content.decode()
    assert (
        "&quot;payment&quot;: &quot;p1&quot;" in page and "connection refused" in page and "timed out" in page
    )
    assert "No reconciler is configured for refund" in page and "globex-internal" not in page
    assert "operators and admins decide" in page and 'id="decide-succeeded"' not in page


def test_the_detail_page_shows_the_tenants_reconciler_and_its_grace(client, tenant, downstream):
    op = _unknown(tenant)
    client.force_login(_member(tenant, "ana", "viewer"))
    page = client.get(f"/queue/{op.pk}/").content.decode()
    assert f"127.0.0.1:{downstream.port}/status/" in page and "counts 30 s after the last lease ended" in page


def test_a_viewer_cannot_decide(client, tenant):
    op = _unknown(tenant)
    client.force_login(_member(tenant, "vic", "viewer"))
    assert _decide(client, op, "not_executed").status_code == 403
    assert Operation.objects.get().status == "UNKNOWN"


@pytest.mark.parametrize(
    ("action", "extra", "status", "reference"),
    [
        ("succeeded", {"external_reference": "re_42"}, "SUCCEEDED", "re_42"),
        ("not_executed", {}, "RETRYABLE_FAILED", ""),
        ("compensate", {}, "COMPENSATED", ""),
    ],
)
def test_an_operator_decides_with_a_note_recorded_with_the_user(tenant, action, extra, status, reference):
    op = _unknown(tenant)
    client = _client(_member(tenant, "ana", "operator"))
    assert client.get("/queue/").context["nav_queue_open"] == 1
    response = _decide(client, op, action, note="seen in the console", **extra)
    assert response.status_code == 302 and response["Location"] == f"/queue/{op.pk}/"
    op.refresh_from_db()
    assert op.status == status and not op.needs_person
    last = op.history.last()
    assert (last.actor, last.actor_id, last.note, last.operator_reference) == (
        "user",
        "ana",
        "seen in the console",
        reference,
    )
    page = client.get(response["Location"]).content.decode()
    assert f"→ {status}" in page and 'id="nav-queue-open">0<' in page


def test_an_empty_note_or_missing_reference_is_named_not_applied(tenant):
    op = _unknown(tenant)
    client = _client(_member(tenant, "ana", "admin"))
    response = _decide(client, op, "succeeded", note="  ")
    page = response.content.decode()
    assert response.status_code == 400
    assert "note: required" in page and "external reference: required" in page
    response = _decide(client, op, "bogus")
    assert response.status_code == 400 and "action: Select a valid choice." in response.content.decode()
    assert Operation.objects.get().status == "UNKNOWN" and op.history.count() == 2


def test_a_second_click_says_who_resolved_it_and_changes_nothing(tenant):
    op = _unknown(tenant)
    ana = _client(_member(tenant, "ana"))
    ben = _client(_member(tenant, "ben"))
    assert _decide(ana, op, "succeeded", external_reference="re_1").status_code == 302
    # ben's page still shows UNKNOWN: compensating a SUCCEEDED would be allowed by the graph, but not asked for.
    response = _decide(ben, op, "compensate", shown="UNKNOWN", note="refunded")
    assert response.status_code == 302
    page = ben.get(response["Location"]).content.decode()
    assert "already resolved by ana at" in page and "now SUCCEEDED" in page
    assert _decide(ana, op, "succeeded", shown="UNKNOWN", external_reference="re_1").status_code == 302
    op.refresh_from_db()
    assert op.status == "SUCCEEDED" and op.history.filter(actor="user").count() == 1


def test_an_expired_lease_is_recorded_unknown_then_decided(tenant):
    op = _expired(tenant)
    client = _client(_member(tenant, "ana"))
    assert "any decision first records it as UNKNOWN" in client.get(f"/queue/{op.pk}/").content.decode()
    assert client.get("/queue/").context["nav_queue_open"] == 1
    _decide(client, op, "not_executed", shown="RUNNING")
    op.refresh_from_db()
    assert op.status == "RETRYABLE_FAILED"
    assert [t.to_status for t in op.history.all()] == ["RUNNING", "UNKNOWN", "RETRYABLE_FAILED"]
    assert client.get("/queue/").context["nav_queue_open"] == 0


def test_retry_reconciliation_from_the_page(tenant, downstream):
    op = _unknown(tenant)
    client = _client(_member(tenant, "ana"))
    response = _decide(client, op, "reconcile", note="PSP back up")
    page = client.get(response["Location"]).content.decode()
    assert "no definite answer" in page and "still UNKNOWN" in page
    downstream.answers["k1"] = (200, {"state": "done"})
    page = client.get(_decide(client, op, "reconcile", note="again")["Location"]).content.decode()
    assert "done → SUCCEEDED" in page
    assert Operation.objects.get().status == "SUCCEEDED"


def test_forms_need_the_csrf_token(tenant):
    op = _unknown(tenant)
    client = _client(_member(tenant, "ana"), csrf=True)
    assert _decide(client, op, "not_executed").status_code == 403
    page = client.get(f"/queue/{op.pk}/").content.decode()
    token = page.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    response = client.post(
        f"/queue/{op.pk}/",
        {"action": "not_executed", "note": "n", "shown_status": "UNKNOWN", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302 and Operation.objects.get().status == "RETRYABLE_FAILED"


def test_the_queue_needs_a_login(client):
    assert client.get("/queue/").status_code == 302


@pytest.mark.django_db(transaction=True)
def test_two_simultaneous_decisions_apply_once(needs_postgres, tenant):
    """Two operators (or a double click) at the same moment: the row lock lets one through."""
    from django.db import connections

    op = _unknown(tenant)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def decide(user: str, to: str) -> None:
        barrier.wait()
        try:
            operation_resolve(operation=op, to=to, user=user, note="n", expected="UNKNOWN")
            outcomes.append(f"applied by {user}")
        except AlreadyResolved as exc:
            outcomes.append(str(exc))
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=decide, args=("ana", "SUCCEEDED")),
        threading.Thread(target=decide, args=("ben", "COMPENSATED")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    applied = [o for o in outcomes if o.startswith("applied")]
    refused = [o for o in outcomes if o.startswith("already resolved")]
    assert len(applied) == 1 and len(refused) == 1, outcomes
    winner = applied[0].removeprefix("applied by ")
    assert f"already resolved by {winner} at" in refused[0]
    assert Operation.objects.get().history.filter(actor="user").count() == 1
