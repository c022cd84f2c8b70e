"""Notifications leave the page: a local HTTP receiver (a real server in a thread) gets signed
webhooks, retried with a backoff, once per escalation step; Slack gets text; e-mail goes through
Django's mail backend; private hosts are refused unless allowed; redirects are not followed."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from django.core import mail
from prometheus_client import REGISTRY

from ingest.models import Detection, Incident, NotificationDelivery, NotificationRule
from ingest.notify import SIGNATURE_HEADER, TIMESTAMP_HEADER, notification_send, rule_matches, rule_test_send
from ingest.services import events_ingest, run_process
from tests.ingest.events import model_round, run_started, tool_call, tool_result
from tests.live import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def allow_local(settings):
    settings.LOOPWATCH_NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]


def _loop(run_id: str, calls: int, **started) -> list[dict]:
    events = [run_started(run_id, **started)]
    for i in range(1, calls + 1):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i, args={"customer": "42"}),
            tool_result(run_id, f"c{i}", n=i, result={"orders": []}),
        ]
    return events


def _process(tenant, events, capture) -> None:
    with capture(execute=True):
        for pk in events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20).runs_touched:
            run_process(run_pk=pk)


def _rule(tenant, receiver: Receiver, **fields) -> NotificationRule:
    defaults = {"name": "on-call", "channel": "webhook", "url": receiver.url, "secret": "s3cret"}
    return NotificationRule.objects.create(tenant=tenant, **{**defaults, **fields})


def test_a_webhook_is_signed_and_notified_once_per_escalation_step(
    tenant, receiver, allow_local, django_capture_on_commit_callbacks
):
    rule = _rule(tenant, receiver)
    events = _loop("esc", 12, agent="shop")
    # in three batches: the incident escalates across passes, and each pass refreshes it
    for part in (events[:10], events[10:19], events[19:]):
        _process(tenant, part, django_capture_on_commit_callbacks)
    incident = Incident.objects.get(run__run_id="esc")
    steps = list(dict.fromkeys(s["action"] for s in incident.steps))
    assert steps == ["correct", "handoff", "terminate"]
    deliveries = list(NotificationDelivery.objects.filter(rule=rule).order_by("pk"))
    assert [d.action for d in deliveries] == steps  # one per step, none per alert row
    assert {(d.status, d.status_code, d.attempts) for d in deliveries} == {("sent", 200, 1)}
    assert len(receiver.received) == 3
    _, headers, body = receiver.received[-1]
    expected = hmac.new(
        b"s3cret", headers[TIMESTAMP_HEADER].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    assert headers[SIGNATURE_HEADER] == f"sha256={expected}"
    assert headers["Content-Type"] == "application/json"
    payload = json.loads(body)
    assert (payload["type"], payload["action"], payload["incident"]["id"], payload["incident"]["run_id"]) == (
        "loopwatch.incident",
        "terminate",
        incident.pk,
        "esc",
    )
    assert payload["url"].endswith(f"/alerts/incidents/{incident.pk}/")
    incident.refresh_from_db()
    assert incident.notified_action == "terminate"
    # processed again from the start: the same incident, nothing sent again
    from ingest.services import run_reprocess

    with django_capture_on_commit_callbacks(execute=True):
        run_reprocess(run_pk=incident.run_id)
    assert NotificationDelivery.objects.filter(rule=rule).count() == 3 and len(receiver.received) == 3


def _delivered(outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "loopwatch_notification_deliveries_total", {"channel": "webhook", "outcome": outcome}
    )
    return value or 0.0


def test_a_failing_receiver_is_tried_again_with_a_log_of_its_answers(
    tenant, receiver, allow_local, django_capture_on_commit_callbacks
):
    receiver.answers = [500, 503]
    rule = _rule(tenant, receiver)
    before = {outcome: _delivered(outcome) for outcome in ("sent", "failed", "dropped")}
    _process(tenant, _loop("flaky", 3), django_capture_on_commit_callbacks)
    delivery = NotificationDelivery.objects.get(rule=rule)
    # every attempt is counted in loopwatch_notification_deliveries: two failed, then one sent
    assert {o: _delivered(o) - n for o, n in before.items()} == {"sent": 1, "failed": 2, "dropped": 0}
    # eager Celery runs the retries at once; a worker waits RETRY_AFTER_S between them
    assert (delivery.status, delivery.attempts, delivery.status_code) == ("sent", 3, 200)
    assert [entry["status_code"] for entry in delivery.log] == [500, 503, 200]
    assert delivery.log[0]["error"] == "HTTP 500"
    assert len(receiver.received) == 3


def test_a_client_error_is_not_tried_again_and_a_second_task_sends_nothing(
    tenant, receiver, allow_local, django_capture_on_commit_callbacks
):
    receiver.answers = [410]
    rule = _rule(tenant, receiver)
    _process(tenant, _loop("gone", 3), django_capture_on_commit_callbacks)
    delivery = NotificationDelivery.objects.get(rule=rule)
    assert (delivery.status, delivery.attempts, delivery.status_code) == ("failed", 1, 410)
    assert notification_send(delivery_id=delivery.pk) == "done"  # the task delivered twice
    assert len(receiver.received) == 1


def test_rules_match_on_kind_action_backend_and_task_type(
    tenant, receiver, allow_local, django_capture_on_commit_callbacks
):
    wanted = _rule(
        tenant, receiver, name="handoffs", actions=["handoff", "terminate"], backends=["anthropic"]
    )
    other = _rule(tenant, receiver, name="polls", kinds=["poll_budget"])
    _process(tenant, _loop("a", 6, backend="anthropic"), django_capture_on_commit_callbacks)
    _process(tenant, _loop("b", 6, backend="openai"), django_capture_on_commit_callbacks)
    sent = list(NotificationDelivery.objects.values_list("rule__name", "incident__run__run_id", "action"))
    assert sent == [("handoffs", "a", "handoff")]
    incident = Incident.objects.get(run__run_id="b")
    assert not rule_matches(wanted, incident) and not rule_matches(other, incident)
    incident.backend, incident.task_type = "anthropic", "refunds"
    assert rule_matches(wanted, incident)
    wanted.task_types = ["order_lookup"]
    assert not rule_matches(wanted, incident)


def test_a_private_host_is_refused_unless_allowed(tenant, receiver, settings):
    settings.LOOPWATCH_NOTIFY_ALLOW_HOSTS = []
    delivery = rule_test_send(rule=_rule(tenant, receiver))
    assert delivery.status == "failed" and "LOOPWATCH_NOTIFY_ALLOW_HOSTS" in delivery.error
    assert receiver.received == []
    settings.LOOPWATCH_NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]
    assert rule_test_send(rule=_rule(tenant, receiver)).status == "sent"


def test_a_redirect_is_not_followed(tenant, receiver, allow_local):
    receiver.answers = [307]
    delivery = rule_test_send(rule=_rule(tenant, receiver))
    assert (delivery.status, delivery.status_code) == ("failed", 307)
    assert "redirects are not followed" in delivery.error
    assert receiver.redirect_hits == 0 and len(receiver.received) == 1


def test_slack_gets_text_and_email_goes_through_the_mail_backend(tenant, receiver, allow_local):
    slack = rule_test_send(rule=_rule(tenant, receiver, channel="slack", secret=""))
    assert slack.status == "sent"
    _, headers, body = receiver.received[0]
    assert SIGNATURE_HEADER not in headers
    text = json.loads(body)["text"]
    assert text.startswith("[test] loopwatch: *handoff*") and "loopwatch-test-run" in text
    email = rule_test_send(
        rule=_rule(tenant, receiver, channel="email", url="", emails=["oncall@example.com"])
    )
    assert (email.status, email.status_code, email.error) == ("sent", None, "")
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["oncall@example.com"]
    assert mail.outbox[0].subject == "[test] loopwatch handoff: exact_repeat on loopwatch-test-run"


def test_shadow_incidents_and_disabled_rules_notify_nothing(
    tenant, receiver, allow_local, django_capture_on_commit_callbacks
):
    from ingest.models import ThresholdSet

    _rule(tenant, receiver, enabled=False)
    _process(tenant, _loop("off", 3), django_capture_on_commit_callbacks)
    ThresholdSet.objects.create(tenant=tenant, values={"mode_exact_repeat": "shadow"})
    _rule(tenant, receiver, name="on")
    _process(tenant, _loop("shadowed", 3), django_capture_on_commit_callbacks)
    assert Detection.objects.filter(run__run_id="shadowed", evidence__has_key="shadow").exists()
    assert NotificationDelivery.objects.count() == 0 and receiver.received == []
