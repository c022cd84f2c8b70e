"""Writes of the live alerts page: an operator's verdict on a detection."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from dashboards.overview.rollup import rollup_hours_dirty
from ingest.events import alerts_group
from ingest.incidents import ALERT_Q
from ingest.models import Detection, Incident

logger = logging.getLogger(__name__)

# A Channels message type of our own on the tenant's alerts group (the consumer's alert_feedback).
FEEDBACK_MESSAGE = "alert.feedback"
NOTE_MAX_CHARS = 2000
CLEAR = "clear"  # the verdict that takes a verdict back


class FeedbackPayload(TypedDict):
    id: int
    feedback: str
    feedback_note: str
    feedback_by: str
    feedback_at: str


def feedback_payload(detection: Detection) -> FeedbackPayload:
    return {
        "id": detection.pk,
        "feedback": detection.feedback,
        "feedback_note": detection.feedback_note,
        "feedback_by": detection.feedback_by.get_username() if detection.feedback_by else "",
        "feedback_at": detection.feedback_at.isoformat() if detection.feedback_at else "",
    }


def _verdict_values(*, verdict: str, user, note: str, now: datetime) -> dict[str, Any]:
    """A detection's feedback fields for `verdict` (CLEAR: none); ValueError naming a bad one."""
    if verdict == CLEAR:
        return {"feedback": "", "feedback_note": "", "feedback_by": None, "feedback_at": None}
    if verdict not in Detection.Feedback.values:
        raise ValueError(f"verdict: must be one of {', '.join(Detection.Feedback.values)} or {CLEAR}")
    return {
        "feedback": verdict,
        "feedback_note": note.strip()[:NOTE_MAX_CHARS],
        "feedback_by": user,
        "feedback_at": now,
    }


def _publish(*, tenant_id: int, message: dict[str, Any], what: str) -> None:
    """To the tenant's open alerts pages, after the commit; the change is stored whatever happens."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(alerts_group(tenant_id), message)
    except Exception:  # open pages see it on their next load
        logger.exception("publishing %s failed", what)


def detection_feedback_set(
    *, detection: Detection, user, verdict: str, note: str = "", now: datetime | None = None
) -> Detection:
    """Record (or replace, or with CLEAR take back) a verdict on a detection, by whom and when.

    The role check is the caller's; the other pages of the tenant are told once it has committed.
    """
    for name, value in _verdict_values(
        verdict=verdict, user=user, note=note, now=now or timezone.now()
    ).items():
        setattr(detection, name, value)
    with transaction.atomic():
        detection.save(update_fields=["feedback", "feedback_note", "feedback_by", "feedback_at"])
        # The overview reads the verdicts of rolled hours from the rollup: this hour is read live until
        # it is rolled again (the marker's lock orders this after a roll in progress).
        rollup_hours_dirty(times=[detection.ts])
        payload = feedback_payload(detection)
        tenant_id = detection.tenant_id
        message = {"type": FEEDBACK_MESSAGE, "feedback": payload}
        what = f"feedback on detection {payload['id']}"
        transaction.on_commit(lambda: _publish(tenant_id=tenant_id, message=message, what=what))
    return detection


# A Channels message type of our own on the tenant's alerts group (the consumer's incident_verdict).
VERDICT_MESSAGE = "incident.verdict"


class IncidentVerdict(TypedDict):
    id: int
    status: str
    verdict: str
    verdict_note: str
    verdict_by: str
    verdict_at: str


def incident_verdict_payload(incident: Incident) -> IncidentVerdict:
    return {
        "id": incident.pk,
        "status": incident.status,
        "verdict": incident.verdict,
        "verdict_note": incident.verdict_note,
        "verdict_by": incident.verdict_by.get_username() if incident.verdict_by else "",
        "verdict_at": incident.verdict_at.isoformat() if incident.verdict_at else "",
    }


def incident_verdict_set(
    *, incident: Incident, user, verdict: str, note: str = "", now: datetime | None = None
) -> Incident:
    """Give (or replace, or with CLEAR take back) the one verdict of an incident.

    Its detections carry the same verdict: the false-alarm rate, the precision that keeps a kind in
    shadow and the threshold preview count detections. The role check is the caller's.
    """
    values = _verdict_values(verdict=verdict, user=user, note=note, now=now or timezone.now())
    incident.status = Incident.Status.OPEN if verdict == CLEAR else Incident.Status.RESOLVED
    incident.verdict, incident.verdict_note = values["feedback"], values["feedback_note"]
    incident.verdict_by, incident.verdict_at = values["feedback_by"], values["feedback_at"]
    with transaction.atomic():
        incident.save(
            update_fields=["status", "verdict", "verdict_note", "verdict_by", "verdict_at", "updated_at"]
        )
        detections = Detection.objects.filter(
            run_id=incident.run_id, kind=incident.kind, signature=incident.signature
        ).filter(ALERT_Q)
        times = list(detections.values_list("ts", flat=True))
        detections.update(**values)
        if times:
            rollup_hours_dirty(times=times)
        payload = incident_verdict_payload(incident)
        tenant_id = incident.tenant_id
        message = {"type": VERDICT_MESSAGE, "verdict": payload}
        what = f"the verdict on incident {payload['id']}"
        transaction.on_commit(lambda: _publish(tenant_id=tenant_id, message=message, what=what))
    return incident
