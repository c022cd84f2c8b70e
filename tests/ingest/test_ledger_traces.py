"""A runtime that only sends traces still gets the ledger: traced writes become operations."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ingest.ledger import leases_expire
from ingest.models import Detection, Operation, Run
from tests.ingest.events import run_started, tool_call, tool_result

URL = "/api/v1/events"
pytestmark = pytest.mark.django_db


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant, ["ingest", "read", "ledger"])


def write(call_id: str, n: int, key: str | None = "order-1:place", **fields):
    extra = {"operation_key": key} if key else {}
    return tool_call(
        call_id=call_id, n=n, tool="place_order", kind="write", args={"sku": "A", "qty": 1}, **extra, **fields
    )


def test_a_traced_write_becomes_an_operation_that_succeeds(api, key):
    api.post(URL, [run_started(), write("c1", 1), tool_result(call_id="c1", result={"order": "ORD-1"})], key)
    op = Operation.objects.get()
    assert (op.status, op.source, op.tool, op.executions) == ("SUCCEEDED", "trace", "place_order", 1)
    assert op.result_json == '{"order":"ORD-1"}'
    assert [(t.from_status, t.to_status, t.actor) for t in op.history.all()] == [
        ("", "RUNNING", "trace"),
        ("RUNNING", "SUCCEEDED", "trace"),
    ]


def test_a_traced_timeout_is_unknown(api, key):
    api.post(
        URL,
        [
            run_started(),
            write("c1", 1),
            tool_result(call_id="c1", status="timeout", external_request_id="x-9"),
        ],
        key,
    )
    op = Operation.objects.get()
    assert (op.status, op.external_request_id) == ("UNKNOWN", "x-9")


def test_the_same_key_executed_twice_is_a_duplicate_side_effect(api, key, tenant):
    api.post(URL, [run_started(), write("c1", 1), tool_result(call_id="c1", status="timeout")], key)
    api.post(URL, [write("c2", 2), tool_result(call_id="c2", result={"order": "ORD-2"})], key)
    duplicate = Detection.objects.get(kind="duplicate_side_effect")
    assert duplicate.action == "handoff" and duplicate.evidence["previous_status"] == "UNKNOWN"
    assert "may now exist twice" in duplicate.hint
    assert Operation.objects.get().executions == 2
    assert Run.objects.get(tenant=tenant).loop_flagged


def test_identical_writes_with_different_keys_are_two_operations(api, key):
    api.post(
        URL,
        [
            run_started(),
            write("c1", 1, key="order-1:place"),
            tool_result(call_id="c1", result={"order": "ORD-1"}),
            write("c2", 2, key="order-2:place"),
            tool_result(call_id="c2", result={"order": "ORD-2"}),
        ],
        key,
    )
    assert sorted(Operation.objects.values_list("status", flat=True)) == ["SUCCEEDED", "SUCCEEDED"]
    assert not Detection.objects.filter(kind__in=["duplicate_side_effect", "duplicate_write"]).exists()


def test_a_write_claimed_through_the_api_and_traced_once_is_one_execution(api, key):
    claim = {
        "operation_key": "order-1:place",
        "tool": "place_order",
        "args": {"sku": "A", "qty": 1},
        "worker_id": "w1",
    }
    assert api.post("/api/v1/operations/claim", claim, key).json()["decision"] == "execute"
    api.post(
        "/api/v1/operations/order-1:place/complete",
        {"worker_id": "w1", "outcome": "succeeded", "result": {"order": "ORD-1"}},
        key,
    )
    api.post(URL, [run_started(), write("c1", 1), tool_result(call_id="c1", result={"order": "ORD-1"})], key)
    op = Operation.objects.get()
    assert (op.status, op.source, op.executions) == ("SUCCEEDED", "api", 1)
    assert not Detection.objects.filter(kind="duplicate_side_effect").exists()


def test_a_traced_write_that_never_reports_back_becomes_unknown(api, key):
    api.post(URL, [run_started(), write("c1", 1, key=None, step_id="s1")], key)
    op = Operation.objects.get()
    assert op.status == "RUNNING" and op.step_id == "s1"
    assert leases_expire(now=timezone.now() + timedelta(hours=1)) == 1
    assert Operation.objects.get().status == "UNKNOWN"


def test_a_write_without_a_key_or_step_is_not_tracked(api, key):
    api.post(URL, [run_started(), write("c1", 1, key=None), tool_result(call_id="c1", result={"ok": 1})], key)
    assert not Operation.objects.exists()
