"""The ledger API: claim decisions, completion by the lease holder, history, and the rules."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import orjson
import pytest
from django.utils import timezone

from ingest.ledger import leases_expire
from ingest.models import Operation, OperationTransition

# Committed transactions, as in production: on PostgreSQL a new key's claim and a lease holder's
# success then take their one-statement paths (inside a test's transaction they cannot).
pytestmark = pytest.mark.django_db(transaction=True)
CLAIM = "/api/v1/operations/claim"


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant, ["ledger"])


def claim(api, key, op="order-42:place:v1", args=None, worker="w1", **extra):
    body = {
        "operation_key": op,
        "tool": "place_order",
        "args": args or {"sku": "A", "qty": 1},
        "worker_id": worker,
        **extra,
    }
    return api.post(CLAIM, body, key)


def complete(api, key, op="order-42:place:v1", worker="w1", **body):
    return api.post(f"/api/v1/operations/{op}/complete", {"worker_id": worker, **body}, key)


def test_execute_then_reuse_the_first_result_byte_for_byte(api, key):
    first = claim(api, key)
    assert first.status_code == 200 and first.json()["decision"] == "execute"
    assert first.json()["lease"]["owner"] == "w1"
    done = complete(api, key, outcome="succeeded", result={"order": "ORD-9", "total": 10.50, "items": [1, 2]})
    assert done.status_code == 200 and done.json()["status"] == "SUCCEEDED"
    again = claim(api, key, worker="w2")
    repeat = claim(api, key, worker="w3")
    assert again.json()["decision"] == "reuse" and again.json()["result"] == {
        "order": "ORD-9",
        "total": 10.5,
        "items": [1, 2],
    }
    assert again.content == repeat.content
    stored = Operation.objects.get()
    assert again.content.endswith(b',"result":' + stored.result_json.encode() + b"}")


def test_a_live_lease_means_wait_and_an_expired_one_unknown(api, key):
    claim(api, key, lease_s=30)
    waiting = claim(api, key, worker="w2")
    assert waiting.status_code == 409 and waiting.json()["decision"] == "wait"
    assert 0 < waiting.json()["retry_after"] <= 30 and waiting["Retry-After"]
    Operation.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert leases_expire() == 1
    answer = claim(api, key, worker="w2")
    assert answer.status_code == 409 and answer.json()["decision"] == "reconcile"
    assert Operation.objects.get().status == "UNKNOWN"


def test_the_same_attempt_asking_again_gets_its_own_lease_back_not_a_wait(api, key):
    """A lost claim answer: the attempt asks again with its attempt_id and must not wait on itself."""
    first = claim(api, key, lease_s=30, attempt_id="a1").json()
    assert first["lease"]["attempt"] == 1 and first["lease"]["attempt_id"] == "a1"
    again = claim(api, key, lease_s=30, attempt_id="a1")
    assert again.status_code == 200 and again.json()["decision"] == "execute"
    assert again.json()["lease"] == first["lease"]  # the same lease and attempt, not a new one
    assert (
        complete(api, key, outcome="succeeded", result={"ok": 1}, attempt=1).json()["status"] == "SUCCEEDED"
    )
    assert Operation.objects.get().history.count() == 2  # claimed, succeeded: nothing in between


def test_a_second_claim_by_the_same_worker_waits(api, key):
    """Two threads of one process share a worker_id: the second must not execute too."""
    claim(api, key, lease_s=30, attempt_id="thread-1")
    for other in ({"attempt_id": "thread-2"}, {}):  # another attempt, or a client sending none
        waiting = claim(api, key, lease_s=30, **other)
        assert waiting.status_code == 409 and waiting.json()["decision"] == "wait"


def test_a_holder_renews_its_lease_and_a_stale_token_is_a_409_saying_so(api, key):
    claim(api, key, lease_s=5, attempt_id="a1")
    renewed = api.post(
        "/api/v1/operations/order-42:place:v1/renew", {"worker_id": "w1", "attempt": 1, "lease_s": 60}, key
    )
    assert renewed.status_code == 200
    lease = renewed.json()["lease"]
    assert (
        lease["attempt"] == 1 and lease["expires_at"] > (timezone.now() + timedelta(seconds=50)).isoformat()
    )
    stale = api.post("/api/v1/operations/order-42:place:v1/renew", {"worker_id": "w1", "attempt": 0}, key)
    assert stale.status_code == 409
    body = stale.json()
    assert (body["error"], body["field"], body["current_attempt"], body["status"]) == (
        "stale_attempt",
        "attempt",
        1,
        "RUNNING",
    )
    assert "attempt 0" in body["detail"]
    refused = complete(api, key, outcome="succeeded", result=1, attempt=2)
    assert refused.status_code == 409 and refused.json()["error"] == "stale_attempt"
    history = api.get("/api/v1/operations/order-42:place:v1", key).json()["history"]
    assert [h["evidence"].get("refused") for h in history] == [None, "renew", "complete"]


def test_a_claim_given_back_is_retryable(api, key):
    claim(api, key, attempt_id="a1")
    released = api.post(
        "/api/v1/operations/order-42:place:v1/release", {"worker_id": "w1", "attempt_id": "a1"}, key
    )
    assert released.status_code == 200 and released.json()["status"] == "RETRYABLE_FAILED"
    assert claim(api, key, attempt_id="a2").json()["decision"] == "execute"
    wrong = api.post(
        "/api/v1/operations/order-42:place:v1/release", {"worker_id": "w1", "attempt_id": "a1"}, key
    )
    assert wrong.status_code == 409 and wrong.json()["error"] == "not_lease_holder"
    missing = api.post("/api/v1/operations/order-42:place:v1/release", {"worker_id": "w1"}, key)
    assert missing.status_code == 400 and missing.json()["field"] == "attempt_id"
    unknown = api.post("/api/v1/operations/nope/release", {"worker_id": "w1", "attempt_id": "a1"}, key)
    assert unknown.status_code == 404


def test_timeout_is_unknown_and_never_executed_again_automatically(api, key):
    claim(api, key)
    complete(api, key, outcome="timeout", external_request_id="pay-77")
    op = Operation.objects.get()
    assert (op.status, op.external_request_id) == ("UNKNOWN", "pay-77")
    assert claim(api, key, worker="w9").json()["decision"] == "reconcile"


def test_failures_definitive_retryable_or_unknown(api, key):
    claim(api, key, op="k1")
    complete(api, key, op="k1", outcome="failed", error_class="invalid_argument", result={"msg": "bad sku"})
    failed = claim(api, key, op="k1")
    assert (
        failed.json()["decision"] == "failed" and failed.json()["error"]["error_class"] == "invalid_argument"
    )

    claim(api, key, op="k2")
    complete(api, key, op="k2", outcome="failed", error_class="transient", no_side_effect=True)
    assert Operation.objects.get(operation_key="k2").status == "RETRYABLE_FAILED"
    again = claim(api, key, op="k2", worker="w2")
    assert again.json()["decision"] == "execute" and again.json()["lease"]["attempt"] == 2

    claim(api, key, op="k3")
    complete(api, key, op="k3", outcome="failed", error_class="transient")  # no assertion: may have happened
    assert Operation.objects.get(operation_key="k3").status == "UNKNOWN"


def test_the_same_key_with_other_arguments_is_a_422_naming_both_fingerprints(api, key):
    claim(api, key, args={"sku": "A", "qty": 1, "request_id": "r1"})
    same = claim(
        api, key, args={"qty": 1, "sku": "A", "request_id": "r2"}, worker="w2"
    )  # noise and order differ
    assert same.status_code == 409  # the same payload: the live lease says wait
    other = claim(api, key, args={"sku": "A", "qty": 2}, worker="w2")
    assert other.status_code == 422
    body = other.json()
    assert body["error"] == "payload_conflict" and body["field"] == "args"
    assert body["stored_fingerprint"] in body["detail"] and body["fingerprint"] in body["detail"]


def test_only_the_lease_holder_completes(api, key):
    claim(api, key)
    response = complete(api, key, worker="intruder", outcome="succeeded", result=1)
    assert response.status_code == 409 and "w1" in response.json()["detail"]
    assert response.json()["error"] == "not_lease_holder"
    assert complete(api, key, op="no-such-key", outcome="succeeded").status_code == 404


def test_a_late_completion_by_the_expired_holder_resolves_the_unknown(api, key):
    claim(api, key, lease_s=5)
    Operation.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    leases_expire()
    done = complete(api, key, outcome="succeeded", result={"ok": True})
    assert done.status_code == 200 and done.json()["status"] == "SUCCEEDED"


def test_the_key_defaults_to_sha256_of_run_and_step(api, key):
    body = {"run_id": "run-1", "step_id": "s3", "tool": "send_email", "args": {"to": "a@b"}, "worker_id": "w"}
    response = api.post(CLAIM, body, key)
    expected = hashlib.sha256(b"run-1:s3").hexdigest()
    assert response.json()["operation_key"] == expected
    missing = api.post(CLAIM, {"tool": "t", "args": {}, "worker_id": "w"}, key)
    assert missing.status_code == 400 and missing.json()["field"] == "operation_key"


def test_history_records_every_transition(api, key):
    claim(api, key)
    complete(api, key, outcome="succeeded", result=[1])
    detail = api.get("/api/v1/operations/order-42:place:v1", key).json()
    assert [(h["from"], h["to"], h["actor"]) for h in detail["history"]] == [
        ("", "RUNNING", "worker"),
        ("RUNNING", "SUCCEEDED", "worker"),
    ]
    assert detail["result"] == [1]
    assert OperationTransition.objects.count() == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tool": "t", "args": [], "worker_id": "w", "operation_key": "k"}, "args"),
        ({"args": {}, "worker_id": "w", "operation_key": "k"}, "tool"),
        ({"tool": "t", "args": {}, "operation_key": "k"}, "worker_id"),
        ({"tool": "t", "args": {}, "worker_id": "w", "operation_key": "k", "lease_s": 0}, "lease_s"),
        (
            {"tool": "t", "args": {}, "worker_id": "w", "operation_key": "k", "attempt_id": "x" * 201},
            "attempt_id",
        ),
    ],
)
def test_bad_claims_name_the_field(api, key, body, field):
    response = api.post(CLAIM, body, key)
    assert response.status_code == 400 and response.json()["field"] == field


def test_ledger_needs_its_scope_and_stays_in_the_tenant(api, tenant, other_tenant, make_key, key):
    assert claim(api, make_key(tenant, ["ingest"])).status_code == 403
    claim(api, key)
    theirs = make_key(other_tenant, ["ledger"])
    assert api.get("/api/v1/operations/order-42:place:v1", theirs).status_code == 404
    assert claim(api, theirs).json()["decision"] == "execute"  # their own, separate operation
    assert Operation.objects.count() == 2


def test_not_json_is_a_400(api, key):
    assert api.post(CLAIM, b"{nope", key).status_code == 400
    assert orjson.loads(api.post(CLAIM, b"[]", key).content)["field"] == "body"


def test_metrics_count_dedupe_hits_conflicts_and_contention(api, key, client, tenant, settings):
    claim(api, key, op="m1")
    claim(api, key, op="m1", worker="w2")  # live lease: contention (and a dedupe hit)
    claim(api, key, op="m1", args={"sku": "B"}, worker="w3")  # conflict
    settings.LOOPWATCH_METRICS_PUBLIC = True
    text = client.get("/metrics").content.decode()
    labels = 'tool="place_order"'
    for name in ("dedupe_hit_total", "lease_contention_total", "payload_conflict_total"):
        line = next(line for line in text.splitlines() if line.startswith(f"{name}{{{labels}}}"))
        assert float(line.split()[-1]) >= 1
    settings.LOOPWATCH_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_input_fields_are_copied_per_request_and_never_shared():
    from ingest.api.operations import ClaimInput, CompleteInput

    bad = ClaimInput(data={"tool": "t" * 201, "args": [], "worker_id": "w", "lease_s": 0})
    assert not bad.is_valid()
    assert set(bad.errors) == {"tool", "args", "lease_s"}
    good = ClaimInput(data={"tool": "t", "args": {"a": 1}, "worker_id": "w"})
    assert good.is_valid(), good.errors
    assert good.validated_data == {
        "tool": "t",
        "args": {"a": 1},
        "worker_id": "w",
        "lease_s": 60,
        "attempt_id": "",
    }
    # Each instance bound copies; the declared fields stay unbound for the next request.
    assert good.fields["tool"] is not bad.fields["tool"]
    assert all(
        f.field_name is None
        for f in [*ClaimInput._declared_fields.values(), *CompleteInput._declared_fields.values()]
    )
    failed = CompleteInput(data={"worker_id": "w", "outcome": "lost"})
    assert not failed.is_valid() and set(failed.errors) == {"outcome"}
