"""Ledger services beside the API: operators' decisions, the transition graph, retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ingest.ledger import (
    NotLeaseHolder,
    TransitionRefused,
    operation_claim,
    operation_complete,
    operation_resolve,
    operations_purge,
)
from ingest.models import Operation

pytestmark = pytest.mark.django_db


def _unknown(tenant, key="k1"):
    operation_claim(tenant=tenant, key=key, tool="refund", args={"p": 1}, worker_id="w", lease_s=30)
    return operation_complete(tenant=tenant, key=key, worker_id="w", outcome="timeout")


def test_an_operator_resolves_an_unknown_write_with_a_note_in_the_history(tenant):
    op = _unknown(tenant)
    done = operation_resolve(
        operation=op, to="SUCCEEDED", user="ana", note="seen in the PSP console", external_reference="re_123"
    )
    assert (done.status, done.external_request_id) == ("SUCCEEDED", "re_123")
    last = done.history.last()
    assert (last.actor, last.actor_id, last.note, last.evidence) == (
        "user",
        "ana",
        "seen in the PSP console",
        {"external_reference": "re_123"},
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
