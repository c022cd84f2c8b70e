"""Reconcilers belong to a tenant and ask only what they were told to, where they were allowed to:
no redirects, no private targets unless allowed, encoded path segments, bodies reduced to the
verdict; and a "not done" while a holder may still be running is not acted on.

The downstreams are real HTTP servers on loopback ports (allowed explicitly, as an admin would).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from ingest.ledger import (
    leases_expire,
    operation_claim,
    operation_complete,
    operation_reconcile_now,
    reconcile_due,
)
from ingest.models import Operation, Reconciler
from tests.ingest.events import run_started, tool_call, tool_result

pytestmark = pytest.mark.django_db
SECRET = "Bearer acme-s3cret"


class Service:
    """A downstream on 127.0.0.1: answers `routes[path]` = (status, headers, JSON body), else
    404; records each request's path and headers."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, dict[str, str], object]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                service.requests.append((self.path, dict(self.headers)))
                status, headers, body = service.routes.get(self.path, (404, {}, {"error": "no such thing"}))
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service() -> Iterator[Service]:
    server = Service()
    yield server
    server.close()


@pytest.fixture
def inner() -> Iterator[Service]:
    """Another loopback service, one nobody allowed: what a redirect would lead to."""
    server = Service()
    yield server
    server.close()


@pytest.fixture
def allowed(settings):
    settings.LOOPWATCH_RECONCILER_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.LOOPWATCH_RECONCILER_HEADERS = {"acme": {"payments": {"Authorization": SECRET}}}
    return settings


def _reconciler(tenant, url_template: str, **fields) -> Reconciler:
    return Reconciler.objects.create(
        tenant=tenant,
        tool="refund_payment",
        url_template=url_template,
        headers_name="payments",
        field="state",
        done_values=["done"],
        not_done_values=["not_found"],
        **{"timeout_s": 2, "grace_s": 0, **fields},
    )


def _unknown(tenant, key="re-1", external_request_id="re_A1") -> Operation:
    operation_claim(tenant=tenant, key=key, tool="refund_payment", args={"p": 1}, worker_id="w", lease_s=30)
    return operation_complete(
        tenant=tenant, key=key, worker_id="w", outcome="timeout", external_request_id=external_request_id
    )


def test_a_redirect_is_not_followed_and_the_credentials_go_nowhere_else(tenant, service, inner, allowed):
    service.routes["/refunds/re_A1"] = (302, {"Location": f"http://localhost:{inner.port}/steal"}, {})
    _reconciler(tenant, f"{service.url}/refunds/{{external_request_id}}")
    op = _unknown(tenant)
    assert reconcile_due() == 1
    op.refresh_from_db()
    assert op.status == "UNKNOWN" and op.last_reconcile["verdict"] == "unknown"
    assert "redirect" in op.last_reconcile["error"] and op.last_reconcile["status"] == 302
    assert inner.requests == []
    assert service.requests[0][1]["Authorization"] == SECRET  # its own downstream, its own key


def test_private_loopback_and_link_local_targets_are_refused_unless_an_admin_allows_the_host(
    tenant, service, settings
):
    settings.LOOPWATCH_RECONCILER_ALLOWED_HOSTS = []
    service.routes["/refunds/re_A1"] = (200, {}, {"state": "done"})
    reconciler = _reconciler(tenant, f"{service.url}/refunds/{{external_request_id}}")
    op = _unknown(tenant)
    for url in (
        f"{service.url}/refunds/{{external_request_id}}",
        "http://169.254.169.254/latest/meta-data/{external_request_id}",
        "http://10.1.2.3/refunds/{external_request_id}",
        "http://[::1]:9/refunds/{external_request_id}",
        "http://[::ffff:127.0.0.1]:9/refunds/{external_request_id}",
    ):
        reconciler.url_template = url
        reconciler.save()
        after = operation_reconcile_now(operation=op, user="ana", note="try", expected="UNKNOWN")
        assert after.status == "UNKNOWN" and "not allowed" in after.last_reconcile["error"], url
    assert service.requests == []
    settings.LOOPWATCH_RECONCILER_ALLOWED_HOSTS = ["127.0.0.1"]
    reconciler.url_template = f"{service.url}/refunds/{{external_request_id}}"
    reconciler.save()
    done = operation_reconcile_now(operation=op, user="ana", note="allowed now", expected="UNKNOWN")
    assert done.status == "SUCCEEDED" and service.paths() == ["/refunds/re_A1"]


def test_path_segments_are_encoded_and_dot_dot_cannot_leave_the_path(tenant, service, allowed):
    _reconciler(tenant, f"{service.url}/refunds/{{external_request_id}}")
    traversing = _unknown(tenant, key="k-dots", external_request_id="..")
    slashed = _unknown(tenant, key="k-slash", external_request_id="../admin?x=1#y")
    assert reconcile_due() == 2
    traversing.refresh_from_db()
    assert "path segment" in traversing.last_reconcile["error"]
    assert service.paths() == ["/refunds/..%2Fadmin%3Fx%3D1%23y"]  # one segment, never /admin
    slashed.refresh_from_db()
    assert slashed.last_reconcile["status"] == 404


def test_a_downstreams_body_is_reduced_to_the_verdict_and_the_declared_fields(
    tenant, service, allowed, api, make_key
):
    answer = {"state": "done", "id": "re_9", "customer": "Ann Example", "card_last4": "4242", "raw": {"x": 1}}
    service.routes["/refunds/re_A1"] = (200, {}, answer)
    _reconciler(tenant, f"{service.url}/refunds/{{external_request_id}}", keep_fields=["id"])
    op = _unknown(tenant)
    assert reconcile_due() == 1
    op.refresh_from_db()
    assert op.status == "SUCCEEDED"
    assert orjson.loads(op.result_json) == {"state": "done", "id": "re_9"}
    stored = orjson.dumps([op.last_reconcile, *op.history.values_list("evidence", flat=True)]).decode()
    assert "Ann Example" not in stored and "4242" not in stored
    detail = api.get(f"/api/v1/operations/{op.operation_key}", make_key(tenant, ["ledger"])).content.decode()
    assert "Ann Example" not in detail and "4242" not in detail


def test_another_tenant_never_uses_this_tenants_reconciler_or_sees_its_data(
    tenant, other_tenant, service, allowed, api, make_key
):
    service.routes["/refunds/re_A1"] = (200, {}, {"state": "done", "customer": "Ann Example"})
    _reconciler(tenant, f"{service.url}/refunds/{{external_request_id}}", keep_fields=["customer"])
    # Tenant B traces a timed-out refund_payment with A's external id.
    theirs = make_key(other_tenant, ["ingest", "ledger"])
    call = tool_call(call_id="c1", tool="refund_payment", kind="write", args={"p": 1}, operation_key="re-b")
    timeout = tool_result(call_id="c1", status="timeout", result=None, external_request_id="re_A1")
    api.post("/api/v1/events", [run_started(), call, timeout], theirs)
    op = Operation.objects.get(tenant=other_tenant)
    assert op.status == "UNKNOWN" and op.external_request_id == "re_A1"

    assert reconcile_due() == 0
    after = operation_reconcile_now(
        operation=Operation.objects.get(pk=op.pk), user="ben", note="try", expected="UNKNOWN"
    )
    assert after.needs_person and "no reconciler" in after.last_reconcile["answer"]
    assert service.requests == []  # A's downstream was never asked, with or without A's key
    detail = api.get("/api/v1/operations/re-b", theirs).content.decode()
    assert "Ann Example" not in detail and "acme-s3cret" not in detail
    # A's own operation with that id is asked, with A's credentials.
    mine = _unknown(tenant)
    assert reconcile_due() == 1
    mine.refresh_from_db()
    assert mine.status == "SUCCEEDED" and service.requests[0][1]["Authorization"] == SECRET


def test_not_done_while_the_holder_may_still_be_running_is_asked_again_not_acted_on(tenant, service, allowed):
    service.routes["/refunds/re-1"] = (200, {}, {"state": "not_found"})
    _reconciler(tenant, f"{service.url}/refunds/{{operation_key}}", grace_s=30)
    operation_claim(tenant=tenant, key="re-1", tool="refund_payment", args={"p": 1}, worker_id="w", lease_s=5)
    lease_end = timezone.now() + timedelta(seconds=5)
    assert leases_expire(now=lease_end + timedelta(seconds=1)) == 1
    assert reconcile_due(now=lease_end + timedelta(seconds=2)) == 1
    op = Operation.objects.get()
    assert op.status == "UNKNOWN"  # the holder may still act: its lease ended 2 s ago, the grace is 30 s
    assert op.last_reconcile["verdict"] == "not_done" and op.last_reconcile["acted"] is False
    assert abs((op.next_reconcile_at - (op.lease_expires_at + timedelta(seconds=30))).total_seconds()) < 1
    assert reconcile_due(now=lease_end + timedelta(seconds=20)) == 0  # not asked again before then
    assert reconcile_due(now=lease_end + timedelta(seconds=31)) == 1
    op.refresh_from_db()
    assert op.status == "RETRYABLE_FAILED"  # nobody can still act: now it may run again


def test_a_reconciler_template_cannot_choose_its_host_or_scheme(tenant):
    for template, field in (
        ("https://{external_request_id}.psp.example/refunds", "url_template"),
        ("ftp://psp.example/refunds/{operation_key}", "url_template"),
        ("https://user:pw@psp.example/refunds/{operation_key}", "url_template"),
    ):
        with pytest.raises(ValidationError) as info:
            Reconciler(tenant=tenant, tool="t", url_template=template).full_clean()
        assert field in info.value.message_dict, template
    for name in ("keep_fields",):
        with pytest.raises(ValidationError) as info:
            Reconciler(
                tenant=tenant, tool="t", url_template="https://p.example/{operation_key}", keep_fields="id"
            ).full_clean()
        assert name in info.value.message_dict
