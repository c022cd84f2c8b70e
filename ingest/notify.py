"""Notifications: a tenant's incidents leave the page, to a webhook, a Slack channel or e-mail.

How an incident is notified:

1. The detection pass, once its transaction has committed, queues `ingest.incidents_notify` with
   the incidents whose action rose past the one they last notified (incidents_notify_enqueue).
2. That task matches each incident against its tenant's enabled rules and creates one
   NotificationDelivery per (rule, incident, action): the unique constraint makes a second
   delivery of the task, or a second pass, create none. An incident notifies once per escalation
   step, never per alert row.
3. `ingest.notification_deliver` sends one delivery; a failure that may pass (no answer, 5xx, 408,
   429) is tried again later (RETRY_AFTER_S), up to MAX_ATTEMPTS; every attempt is in its log.

Webhooks get the incident as JSON, signed: `X-Loopwatch-Signature: sha256=<hex>`, the HMAC-SHA256
with the rule's secret of `<X-Loopwatch-Timestamp>.<body>`. Outbound requests go through
ingest.downstream: private, loopback and link-local hosts only when LOOPWATCH_NOTIFY_ALLOW_HOSTS
names them, no redirect followed.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import http.client
import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson
from celery import Task, current_app
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ingest import metrics
from ingest.downstream import Refused, downstream_fetch, url_target
from ingest.events import TASK_INCIDENTS_NOTIFY, TASK_NOTIFICATION_DELIVER
from ingest.incidents import incident_payload
from ingest.models import Incident, NotificationDelivery, NotificationRule

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 6
RETRY_AFTER_S = (10, 30, 120, 600, 1800)  # after attempt 1, 2, …: a receiver down for an hour still gets it
SEND_TIMEOUT_S = 5.0
RETRYABLE_STATUSES = frozenset({408, 425, 429})
SETTING = "LOOPWATCH_NOTIFY_ALLOW_HOSTS"
SIGNATURE_HEADER = "X-Loopwatch-Signature"
TIMESTAMP_HEADER = "X-Loopwatch-Timestamp"
LOG_MAX = 20  # attempts kept in a delivery's log


def incidents_notify_enqueue(*, incident_ids: list[int]) -> None:
    """Queue the notification of these incidents (after the pass's commit). A broker away loses
    nothing the next escalation would not carry; the incident's page still shows it."""
    try:
        _task(TASK_INCIDENTS_NOTIFY).delay(
            incident_ids=sorted(set(incident_ids)), ts=timezone.now().isoformat()
        )
    except Exception:
        logger.exception("queueing notifications of %d incidents failed", len(incident_ids))


def rule_matches(rule: NotificationRule, incident: Incident) -> bool:
    """Empty lists match anything."""
    return all(
        not wanted or value in wanted
        for wanted, value in (
            (rule.kinds, incident.kind),
            (rule.actions, incident.action),
            (rule.backends, incident.backend),
            (rule.task_types, incident.task_type),
        )
    )


def incident_url(incident_id: int) -> str:
    return f"{settings.LOOPWATCH_PUBLIC_URL}/alerts/incidents/{incident_id}/"


def notification_body(*, rule: NotificationRule, incident: Mapping[str, Any], test: bool) -> dict[str, Any]:
    return {
        "type": "loopwatch.incident",
        "test": test,
        "rule": {"id": rule.pk, "name": rule.name},
        "action": incident["action"],
        "url": incident_url(incident["id"]),
        "incident": incident,
    }


def _task(name: str) -> Task:
    """A task of ingest.tasks by its registered name: the tasks call these services, so the services
    do not import the tasks (as ingest.services.pipeline does)."""
    return current_app.tasks[name]


def _deliver_later(delivery_id: int, *, countdown: float = 0) -> None:
    _task(TASK_NOTIFICATION_DELIVER).apply_async(kwargs={"delivery_id": delivery_id}, countdown=countdown)


def incidents_notify_create(*, incident_ids: list[int]) -> int:
    """Create the deliveries of these incidents' current step for every matching rule; returns how many."""
    incidents = list(
        Incident.objects.filter(pk__in=incident_ids)
        .exclude(action="observe")  # a kind in shadow acts on nothing, and notifies nothing
        .select_related("run", "verdict_by")
    )
    rules_of: dict[int, list[NotificationRule]] = defaultdict(list)
    for rule in NotificationRule.objects.filter(tenant_id__in={i.tenant_id for i in incidents}, enabled=True):
        rules_of[rule.tenant_id].append(rule)
    created = 0
    for incident in incidents:
        matching = [rule for rule in rules_of[incident.tenant_id] if rule_matches(rule, incident)]
        if not matching:
            continue
        verdict_by = incident.verdict_by.get_username() if incident.verdict_by else ""
        payload = incident_payload(incident, run=incident.run, verdict_by=verdict_by)
        for rule in matching:
            try:
                with transaction.atomic():
                    delivery = NotificationDelivery.objects.create(
                        rule=rule,
                        incident=incident,
                        action=incident.action,
                        payload=notification_body(rule=rule, incident=payload, test=False),
                    )
            except IntegrityError:
                continue  # this step was notified to this rule already
            created += 1
            transaction.on_commit(functools.partial(_deliver_later, delivery.pk))
    # Per action, and only while it is still the incident's: a step reached since is notified by the
    # task its pass queues.
    by_action: dict[str, list[int]] = defaultdict(list)
    for incident in incidents:
        by_action[incident.action].append(incident.pk)
    for action, pks in by_action.items():
        Incident.objects.filter(pk__in=pks, action=action).update(notified_action=action)
    return created


def notification_send(*, delivery_id: int) -> str:
    """One attempt at a delivery; queues the next one when it failed in a way that may pass."""
    delivery = NotificationDelivery.objects.filter(pk=delivery_id).select_related("rule").first()
    if delivery is None or delivery.status in (
        NotificationDelivery.Status.SENT,
        NotificationDelivery.Status.FAILED,
    ):
        return "done"
    # Claim this attempt: a second delivery of the task (or a retry racing it) finds the count moved.
    claimed = NotificationDelivery.objects.filter(
        pk=delivery.pk, attempts=delivery.attempts, status__in=["pending", "retrying"]
    ).update(attempts=F("attempts") + 1)
    if not claimed:
        return "taken"
    delivery.attempts += 1
    status = delivery_attempt(delivery)
    if status == NotificationDelivery.Status.RETRYING:
        delay = RETRY_AFTER_S[min(delivery.attempts - 1, len(RETRY_AFTER_S) - 1)]
        _deliver_later(delivery.pk, countdown=delay)
    return status


def delivery_attempt(delivery: NotificationDelivery, *, now: datetime | None = None) -> str:
    """Send it once (the attempt is counted by the caller), record the outcome; the new status."""
    now = now or timezone.now()
    code, error, retryable = _send(delivery.rule, delivery.payload)
    ok = not error  # an answer outside 2xx is an error; e-mail has no status code
    if ok:
        status = NotificationDelivery.Status.SENT
    elif retryable and delivery.attempts < MAX_ATTEMPTS and not delivery.test:
        status = NotificationDelivery.Status.RETRYING
    else:
        status = NotificationDelivery.Status.FAILED
    entry = {"at": now.isoformat(), "attempt": delivery.attempts, "status_code": code, "error": error}
    delivery.log = [*(delivery.log or []), entry][-LOG_MAX:]
    delivery.status, delivery.status_code, delivery.error = status, code, error
    delivery.sent_at = now if ok else delivery.sent_at
    delivery.save(update_fields=["log", "status", "status_code", "error", "sent_at"])
    outcome = {NotificationDelivery.Status.SENT: "sent", NotificationDelivery.Status.RETRYING: "failed"}
    metrics.notification_delivery(
        channel=delivery.rule.channel,
        outcome=outcome.get(status, "dropped"),
        tenant_id=delivery.rule.tenant_id,
    )
    return status


def rule_test_send(*, rule: NotificationRule) -> NotificationDelivery:
    """Send a sample incident to the rule's target now (one attempt, no retry) and log it."""
    sample = {
        "id": 0,
        "run": 0,
        "run_id": "loopwatch-test-run",
        "tenant_id": rule.tenant_id,
        "agent": "test-agent",
        "kind": (rule.kinds or ["exact_repeat"])[0],
        "tool": "search_orders",
        "action": (rule.actions or ["handoff"])[0],
        "shadow": "",
        "backend": (rule.backends or ["openai"])[0],
        "model": "",
        "task_type": (rule.task_types or ["default"])[0],
        "alerts": 1,
        "hint": "A test of this notification rule: no run is involved.",
        "first_seen": timezone.now().isoformat(),
        "last_seen": timezone.now().isoformat(),
        "status": "open",
        "verdict": "",
        "verdict_note": "",
        "verdict_by": "",
        "verdict_at": "",
        "steps": [],
    }
    delivery = NotificationDelivery.objects.create(
        rule=rule,
        incident=None,
        action=sample["action"],
        test=True,
        payload=notification_body(rule=rule, incident=sample, test=True),
        attempts=1,
    )
    delivery_attempt(delivery)
    return delivery


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """What a webhook's receiver recomputes: sha256=HMAC-SHA256(secret, "<timestamp>." + body)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _send(rule: NotificationRule, payload: dict[str, Any]) -> tuple[int | None, str, bool]:
    """(HTTP status or None, error or "", whether trying again may help)."""
    if rule.channel == NotificationRule.Channel.EMAIL:
        return _send_email(rule, payload)
    if rule.channel == NotificationRule.Channel.SLACK:
        body = orjson.dumps({"text": slack_text(payload)})
        headers = {"Content-Type": "application/json"}
    else:
        body = orjson.dumps(payload)
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "loopwatch-notify",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: signature(rule.secret, timestamp, body),
        }
    try:
        target = url_target(rule.url, setting=SETTING)
    except Refused as refused:
        return None, f"refused: {refused}", False
    try:
        code, _ = downstream_fetch(target, method="POST", headers=headers, timeout=SEND_TIMEOUT_S, body=body)
    except (OSError, http.client.HTTPException) as exc:
        return None, f"no answer: {type(exc).__name__}: {exc}"[:500], True
    if 200 <= code < 300:
        return code, "", False
    if 300 <= code < 400:
        return code, f"HTTP {code}: redirects are not followed", False
    return code, f"HTTP {code}", code >= 500 or code in RETRYABLE_STATUSES


def slack_text(payload: dict[str, Any]) -> str:
    incident = payload["incident"]
    prefix = "[test] " if payload.get("test") else ""
    return (
        f"{prefix}loopwatch: *{incident['action']}* — {incident['kind']} on run `{incident['run_id']}` "
        f"({incident['agent'] or 'agent ?'}, {incident['backend']}); {incident['alerts']} alert(s). "
        f"{incident['hint']} <{payload['url']}|open the incident>"
    )


def _send_email(rule: NotificationRule, payload: dict[str, Any]) -> tuple[int | None, str, bool]:
    incident = payload["incident"]
    prefix = "[test] " if payload.get("test") else ""
    subject = f"{prefix}loopwatch {incident['action']}: {incident['kind']} on {incident['run_id']}"
    text = (
        f"{incident['kind']} on run {incident['run_id']} (agent {incident['agent']}, backend "
        f"{incident['backend']}, task type {incident['task_type']}) is at {incident['action']} after "
        f"{incident['alerts']} alert(s).\n\n{incident['hint']}\n\n{payload['url']}\n"
    )
    try:
        send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, list(rule.emails), fail_silently=False)
    except Exception as exc:  # an SMTP server away or refusing: tried again later
        return None, f"mail not sent: {type(exc).__name__}: {exc}"[:500], True
    return None, "", False
