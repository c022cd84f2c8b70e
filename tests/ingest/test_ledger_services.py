"""Ledger services beside the API: operators' decisions, the transition graph, retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ingest.ledger import (
    NotLeaseHolder,
    StaleAttempt,
    TransitionRefused,
    leases_expire,
    operation_claim,
    operation_complete,
    operation_release,
    operation_renew,
    operation_resolve,
    operations_purge,
    reconcile_due,
)
from ingest.models import Operation

pytestmark = pytest.mark.django_db


def _unknown(tenant, key="k1"):
    operation_claim(tenant=tenant, key=key, tool="refund", args={"p": 1}, worker_id="w", lease_s=30)
    return operation_complete(tenant=tenant, key=key, worker_id="w", outcome="timeout")


def test_an_operator_resolves_an_unknown_write_with_a_note_in_the_history(tenant):
    operation_claim(tenant=tenant, key="k1", tool="refund", args={"p": 1}, worker_id="w", lease_s=30)
    op = operation_complete(
        tenant=tenant, key="k1", worker_id="w", outcome="timeout", external_request_id="req_bNGf42"
    )
    done = operation_resolve(
        operation=op, to="SUCCEEDED", user="ana", note="seen in the PSP console", external_reference="re_123"
    )
    # The attempt's own request id stays; the operator's reference is the decision's.
    assert (done.status, done.external_request_id) == ("SUCCEEDED", "req_bNGf42")
    last = done.history.last()
    assert (last.actor, last.actor_id, last.note, last.operator_reference, last.evidence) == (
        "user",
        "ana",
        "seen in the PSP console",
        "re_123",
        {},
    )
    compensated = operation_resolve(operation=done, to="COMPENSATED", user="ana", note="refund reversed")
    assert compensated.status == "COMPENSATED"


def test_transitions_outside_the_graph_are_refused(tenant):
    op = _unknown(tenant)
    operation_resolve(operation=op, to="RETRYABLE_FAILED", user="ana", note="never reached the PSP")
    with pytest.raises(TransitionRefused):
        operation_resolve(operation=Operation.objects.get(), to="COMPENSATED", user="ana", note="?")
    with pytest.raises(ValueError, match="note"):
        operation_resolve(operation=Operation.objects.get(), to="RUNNING", user="ana", note=" ")


def test_a_second_click_on_a_changed_state_is_refused_not_repeated(tenant):
    op = _unknown(tenant)
    operation_resolve(operation=op, to="SUCCEEDED", user="ana", note="ok")
    with pytest.raises(TransitionRefused):
        operation_resolve(
            operation=op, to="SUCCEEDED", user="ben", note="ok too"
        )  # the stale object says UNKNOWN
    assert Operation.objects.get().history.filter(actor="user").count() == 1


def test_retention_keeps_open_and_recent_operations(tenant, settings):
    settings.LOOPWATCH_LEDGER_TTL_DAYS = {"default": 1, "refund": 7}
    _unknown(tenant, "open")
    operation_claim(tenant=tenant, key="old", tool="email", args={}, worker_id="w", lease_s=30)
    operation_complete(tenant=tenant, key="old", worker_id="w", outcome="succeeded", result=1)
    operation_claim(tenant=tenant, key="old-refund", tool="refund", args={}, worker_id="w", lease_s=30)
    operation_complete(tenant=tenant, key="old-refund", worker_id="w", outcome="succeeded", result=1)
    Operation.objects.update(updated_at=timezone.now() - timedelta(days=3))
    assert operations_purge() == 1
    assert sorted(Operation.objects.values_list("operation_key", flat=True)) == ["old-refund", "open"]
    assert operations_purge(now=timezone.now() + timedelta(days=30)) == 1  # the refund's TTL too
    assert list(Operation.objects.values_list("status", flat=True)) == ["UNKNOWN"]  # never purged


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_new_claim_and_its_success_are_one_statement_each(
    needs_postgres, tenant, django_assert_num_queries
):
    with django_assert_num_queries(1):
        answer = operation_claim(
            tenant=tenant, key="k1", tool="refund", args={"p": 1}, worker_id="w", lease_s=30
        )
    assert answer.decision == "execute" and answer.operation.status == "RUNNING"
    with django_assert_num_queries(1):
        done = operation_complete(tenant=tenant, key="k1", worker_id="w", outcome="succeeded", result=[1])
    assert done.status == "SUCCEEDED" and done.lease_expires_at is None
    stored = Operation.objects.get(pk=answer.operation.pk)
    assert (stored.status, stored.result_json, stored.lease_owner) == ("SUCCEEDED", "[1]", "w")
    assert [(t.from_status, t.to_status, t.actor_id) for t in stored.history.all()] == [
        ("", "RUNNING", "w"),
        ("RUNNING", "SUCCEEDED", "w"),
    ]
    # another worker's success is not the holder's: the locked path refuses it
    operation_claim(tenant=tenant, key="k2", tool="refund", args={}, worker_id="w", lease_s=30)
    with pytest.raises(NotLeaseHolder, match="cannot complete"):
        operation_complete(tenant=tenant, key="k2", worker_id="intruder", outcome="succeeded", result=1)


# --- attempts: every claim its own fencing token ----------------------------------------------------


def _claim(tenant, key="k1", worker="w", attempt_id="", lease_s=30.0):
    return operation_claim(
        tenant=tenant,
        key=key,
        tool="refund",
        args={"p": 1},
        worker_id=worker,
        lease_s=lease_s,
        attempt_id=attempt_id,
    )


def _expire(op_key="k1") -> None:
    Operation.objects.filter(operation_key=op_key).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert leases_expire() == 1


def test_a_second_claim_of_a_running_key_waits_whoever_sends_it(tenant):
    first = _claim(tenant, attempt_id="a1")
    assert first.decision == "execute" and first.operation.attempts == 1
    # The same worker (two threads of one process share it), without an attempt id or with another.
    assert _claim(tenant).decision == "wait"
    assert _claim(tenant, attempt_id="a2").decision == "wait"
    # The same attempt asking again (its answer was lost): the same lease, no second attempt.
    again = _claim(tenant, attempt_id="a1")
    assert again.decision == "execute" and again.operation.attempts == 1
    assert again.operation.lease_expires_at == first.operation.lease_expires_at
    assert Operation.objects.get().history.count() == 1


def test_each_attempt_gets_the_next_fencing_token(tenant):
    assert _claim(tenant, attempt_id="a1").operation.attempts == 1
    operation_complete(
        tenant=tenant,
        key="k1",
        worker_id="w",
        attempt=1,
        outcome="failed",
        error_class="transient",
        no_side_effect=True,
    )
    second = _claim(tenant, attempt_id="a2")
    assert (second.decision, second.operation.attempts, second.operation.attempt_id) == ("execute", 2, "a2")


def test_a_completion_with_a_stale_token_is_refused_and_recorded(tenant):
    _claim(tenant, attempt_id="a1")
    _expire()
    # The reconciler (or a person) found it never happened; a second attempt runs.
    operation_resolve(
        operation=Operation.objects.get(), to="RETRYABLE_FAILED", user="ana", note="not at the PSP"
    )
    assert _claim(tenant, attempt_id="a2").operation.attempts == 2
    with pytest.raises(StaleAttempt) as info:
        operation_complete(
            tenant=tenant, key="k1", worker_id="w", attempt=1, outcome="succeeded", result={"id": 1}
        )
    assert info.value.current_attempt == 2 and "attempt 1" in str(info.value)
    op = Operation.objects.get()
    assert (op.status, op.attempts, op.result_json) == ("RUNNING", 2, None)
    refused = op.history.last()
    assert (refused.from_status, refused.to_status, refused.actor) == ("RUNNING", "RUNNING", "worker")
    assert refused.evidence == {
        "refused": "complete",
        "attempt": 1,
        "current_attempt": 2,
        "outcome": "succeeded",
    }
    # The current attempt completes as usual.
    done = operation_complete(
        tenant=tenant, key="k1", worker_id="w", attempt=2, outcome="succeeded", result=2
    )
    assert done.status == "SUCCEEDED"


def test_a_renewal_moves_the_lease_on_and_a_stale_one_is_refused_and_recorded(tenant):
    first = _claim(tenant, attempt_id="a1", lease_s=5)
    renewed = operation_renew(tenant=tenant, key="k1", worker_id="w", attempt=1, lease_s=60)
    assert renewed.expires_at > first.operation.lease_expires_at + timedelta(seconds=50)
    op = Operation.objects.get()
    assert (op.status, op.lease_expires_at) == ("RUNNING", renewed.expires_at)
    assert op.history.count() == 1  # a renewal is not a transition
    with pytest.raises(StaleAttempt):
        operation_renew(tenant=tenant, key="k1", worker_id="w", attempt=7, lease_s=60)
    assert Operation.objects.get().history.last().evidence["refused"] == "renew"


def test_a_holder_renewing_after_its_lease_ran_out_is_running_again(tenant):
    _claim(tenant, attempt_id="a1", lease_s=5)
    _expire()
    back = operation_renew(tenant=tenant, key="k1", worker_id="w", attempt=1, lease_s=30)
    assert back.status == "RUNNING" and back.expires_at > timezone.now()
    assert [(t.from_status, t.to_status, t.actor) for t in Operation.objects.get().history.all()] == [
        ("", "RUNNING", "worker"),
        ("RUNNING", "UNKNOWN", "system"),
        ("UNKNOWN", "RUNNING", "worker"),
    ]
    # Not once the outcome was settled meanwhile.
    operation_complete(tenant=tenant, key="k1", worker_id="w", attempt=1, outcome="succeeded", result=1)
    with pytest.raises(NotLeaseHolder):
        operation_renew(tenant=tenant, key="k1", worker_id="w", attempt=1, lease_s=30)


def test_a_late_completion_after_the_lease_expired_needs_no_person(tenant):
    """A person was asked (no reconciler), then the holder's own success came: nobody is needed."""
    _claim(tenant, attempt_id="a1", lease_s=5)
    _expire()
    assert reconcile_due() == 0  # no reconciler for the tool: flagged for a person
    assert Operation.objects.get().needs_person
    done = operation_complete(
        tenant=tenant, key="k1", worker_id="w", attempt=1, outcome="succeeded", result=1
    )
    assert (done.status, done.needs_person) == ("SUCCEEDED", False)
    assert Operation.objects.get().needs_person is False


def test_a_claim_given_back_before_it_ran_may_run_again_without_a_person(tenant):
    _claim(tenant, attempt_id="a1")
    released = operation_release(tenant=tenant, key="k1", worker_id="w", attempt_id="a1")
    assert (released.status, released.needs_person) == ("RETRYABLE_FAILED", False)
    assert "released" in released.history.last().note
    assert _claim(tenant, attempt_id="a2").decision == "execute"
    # Given back only after its lease ran out (the client could not reach the ledger for a while).
    operation_release(tenant=tenant, key="k1", worker_id="w", attempt_id="a2")
    _claim(tenant, attempt_id="a3", lease_s=5)
    _expire()
    assert Operation.objects.get().status == "UNKNOWN"
    after = operation_release(tenant=tenant, key="k1", worker_id="w", attempt_id="a3")
    assert (after.status, after.needs_person) == ("RETRYABLE_FAILED", False)
    # Another attempt's id gives nothing back.
    _claim(tenant, attempt_id="a4")
    with pytest.raises(NotLeaseHolder):
        operation_release(tenant=tenant, key="k1", worker_id="w", attempt_id="a3")
    assert Operation.objects.get().status == "RUNNING"


def test_a_renewal_in_flight_when_its_own_completion_landed_is_refused_quietly(tenant):
    _claim(tenant, attempt_id="a1")
    operation_complete(tenant=tenant, key="k1", worker_id="w", attempt=1, outcome="succeeded", result=1)
    with pytest.raises(NotLeaseHolder) as info:
        operation_renew(tenant=tenant, key="k1", worker_id="w", attempt=1, lease_s=30)
    assert not isinstance(info.value, StaleAttempt) and info.value.status == "SUCCEEDED"
    assert Operation.objects.get().history.count() == 2  # claimed, succeeded: no refusal recorded
