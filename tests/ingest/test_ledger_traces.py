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


# --- the order of a pass's starts and results ----------------------------------------------------------


def _traced_runs() -> list[dict]:
    """Runs whose writes are retried: after a 503 (the service refused it: one effect in all), after
    a timeout and after a success (the effect may now exist twice)."""
    events = []
    for run_id, first in (
        ("r-503", {"status": "error", "error_class": "transient", "result": {"http": 503}}),
        ("r-timeout", {"status": "timeout", "result": None}),
        ("r-twice", {"status": "ok", "result": {"order": "ORD-1"}}),
    ):
        key = f"order-{run_id}:place"
        events += [
            run_started(run_id),
            write("c1", 1, key=key, run_id=run_id),
            tool_result(run_id, "c1", 1, **first),
            write("c2", 2, key=key, run_id=run_id),
            tool_result(run_id, "c2", 2, result={"order": "ORD-2"}),
        ]
    return events


def _outcome(tenant) -> tuple[list, list]:
    detections = sorted(
        (d.run.run_id, d.seq, d.kind, d.action, d.count, d.signature)
        for d in Detection.objects.filter(tenant=tenant).select_related("run")
    )
    operations = sorted(
        Operation.objects.filter(tenant=tenant).values_list(
            "operation_key", "status", "executions", "attempts"
        )
    )
    return detections, operations


def test_detections_do_not_depend_on_how_the_events_were_batched(api, tenant, other_tenant, make_key):
    one_batch, one_by_one = (
        make_key(tenant, ["ingest", "ledger"]),
        make_key(other_tenant, ["ingest", "ledger"]),
    )
    assert api.post(URL, _traced_runs(), one_batch).status_code == 200
    for event in _traced_runs():
        assert api.post(URL, [event], one_by_one).status_code == 200
    batched, single = _outcome(tenant), _outcome(other_tenant)
    assert batched == single
    duplicates = {run_id for run_id, _, kind, *_ in batched[0] if kind == "duplicate_side_effect"}
    assert duplicates == {"r-timeout", "r-twice"}  # a retry after a 503 is not a duplicate
    assert ("order-r-503:place", "SUCCEEDED", 2, 2) in batched[1]


# --- who may give the ledger a verdict ------------------------------------------------------------------

CLAIM = "/api/v1/operations/claim"


def _claim(api, key, op_key="order-1:place"):
    body = {"operation_key": op_key, "tool": "place_order", "args": {"sku": "A", "qty": 1}, "worker_id": "w1"}
    return api.post(CLAIM, body, key)


def test_an_ingest_only_keys_traced_result_is_evidence_not_a_verdict(api, tenant, make_key):
    ingest_only, ledger = make_key(tenant, ["ingest"]), make_key(tenant, ["ledger"])
    api.post(
        URL,
        [run_started(), write("c1", 1), tool_result(call_id="c1", result={"order": "PLANTED"})],
        ingest_only,
    )
    op = Operation.objects.get()
    assert (op.status, op.result_json) == ("SUCCEEDED", None)  # seen in a trace, kept as evidence
    assert op.history.last().evidence == {"run_id": "r1", "call_id": "c1", "ledger_scope": False}

    answer = _claim(api, ledger)
    assert answer.status_code == 409 and answer.json()["decision"] == "reconcile"
    assert "PLANTED" not in answer.content.decode()
    op.refresh_from_db()
    assert op.status == "UNKNOWN" and "ledger" in op.history.last().note
    # Asked again: still reconcile (a person or the reconciler decides), never the planted result.
    assert _claim(api, ledger).json()["decision"] == "reconcile"


def test_an_ingest_only_keys_traced_failure_does_not_refuse_the_write_either(api, tenant, make_key):
    ingest_only, ledger = make_key(tenant, ["ingest"]), make_key(tenant, ["ledger"])
    failed = tool_result(call_id="c1", status="error", error_class="invalid_argument", result="declined")
    api.post(URL, [run_started(), write("c1", 1), failed], ingest_only)
    assert Operation.objects.get().status == "FAILED"
    assert _claim(api, ledger).json()["decision"] == "reconcile"


def test_a_traced_result_of_a_key_with_the_ledger_scope_is_a_verdict(api, key):
    api.post(URL, [run_started(), write("c1", 1), tool_result(call_id="c1", result={"order": "ORD-1"})], key)
    answer = _claim(api, key)
    assert answer.json()["decision"] == "reuse" and answer.json()["result"] == {"order": "ORD-1"}


def test_a_run_an_ingest_only_key_wrote_into_gives_no_verdict_from_then_on(api, key, tenant, make_key):
    ingest_only = make_key(tenant, ["ingest"])
    api.post(URL, [run_started(), write("c1", 1), tool_result(call_id="c1", result={"order": "ORD-1"})], key)
    api.post(
        URL,
        [write("c2", 2, key="order-2:place"), tool_result(call_id="c2", n=2, result={"o": 2})],
        ingest_only,
    )
    api.post(URL, [write("c3", 3, key="order-3:place"), tool_result(call_id="c3", n=3, result={"o": 3})], key)
    assert _claim(api, key, "order-1:place").json()["decision"] == "reuse"
    assert _claim(api, key, "order-2:place").json()["decision"] == "reconcile"
    assert _claim(api, key, "order-3:place").json()["decision"] == "reconcile"  # the run is mixed now
