"""The write queue tells the truth (issue 15): the count of writes that need a person agrees with their
pages, reconciliation is offered only where a reconciler exists, and a due time in the past says why."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from dashboards.models import Membership
from ingest.ledger import operation_claim, operation_complete
from ingest.models import Operation, Reconciler

pytestmark = pytest.mark.django_db


def _unknown(tenant, key, tool="refund"):
    operation_claim(tenant=tenant, key=key, tool=tool, args={"p": 1}, worker_id="w", lease_s=30)
    return operation_complete(tenant=tenant, key=key, worker_id="w", outcome="timeout")


@pytest.fixture
def operator(client, tenant):
    user = get_user_model().objects.create_user("olga", password="pw")
    Membership.objects.create(user=user, tenant=tenant, role="operator")
    client.force_login(user)
    return client


def _reconciler(tenant, tool="refund"):
    return Reconciler.objects.create(
        tenant=tenant, tool=tool, url_template="https://psp.example/{operation_key}"
    )


def test_need_a_person_agrees_with_the_detail_page(operator, tenant):
    lonely = _unknown(tenant, "k-email", tool="email")  # no reconciler: a person decides
    asked = _unknown(tenant, "k-refund")
    _reconciler(tenant)
    index = operator.get("/queue/").content.decode()
    assert 'id="queue-total">2<' in index and 'id="queue-needs-person">1<' in index
    assert "no reconciler for email: a person decides" in index
    detail = operator.get(f"/queue/{lonely.pk}/").content.decode()
    assert 'id="op-needs-person"' in detail and "No reconciler is configured for email" in detail
    assert 'id="op-needs-person"' not in operator.get(f"/queue/{asked.pk}/").content.decode()
    filtered = operator.get("/queue/?needs_person=1").content.decode()
    assert "k-email" in filtered and "k-refund" not in filtered


def test_retry_reconciliation_is_offered_only_with_a_reconciler(operator, tenant):
    lonely = _unknown(tenant, "k-email", tool="email")
    page = operator.get(f"/queue/{lonely.pk}/").content.decode()
    assert 'id="decide-reconcile"' not in page and 'id="decide-not_executed"' in page
    response = operator.post(
        f"/queue/{lonely.pk}/", {"action": "reconcile", "note": "try", "shown_status": "UNKNOWN"}
    )
    assert response.status_code == 400
    assert "action: no reconciler is configured for email" in response.content.decode()
    assert Operation.objects.get(pk=lonely.pk).history.count() == 2  # nothing recorded
    asked = _unknown(tenant, "k-refund")
    _reconciler(tenant)
    assert 'id="decide-reconcile"' in operator.get(f"/queue/{asked.pk}/").content.decode()


def test_a_next_reconciliation_in_the_past_says_why(operator, tenant):
    op = _unknown(tenant, "k-refund")
    _reconciler(tenant)
    # Just due: the next pass (every 15 s) takes it.
    Operation.objects.filter(pk=op.pk).update(next_reconcile_at=timezone.now() - timedelta(seconds=5))
    assert "due now: reconciliation passes every 15 s" in operator.get(f"/queue/{op.pk}/").content.decode()
    # Long overdue: no pass has run, and the page says what to check and what to do meanwhile.
    Operation.objects.filter(pk=op.pk).update(next_reconcile_at=timezone.now() - timedelta(minutes=5))
    for page in (operator.get(f"/queue/{op.pk}/").content.decode(), operator.get("/queue/").content.decode()):
        assert "no reconciliation pass has run since: is Celery beat running" in page
        assert "manage.py demo_beat" in page and "retry it now or decide" in page
    ahead = timezone.now() + timedelta(minutes=5)
    Operation.objects.filter(pk=op.pk).update(next_reconcile_at=ahead)
    detail = operator.get(f"/queue/{op.pk}/").content.decode()
    assert f'next at <span id="op-next-reconcile">{ahead:%Y-%m-%d %H:%M:%S} UTC</span>' in detail
