"""Writes of the live alerts page: an operator's verdict on a detection."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from dashboards.overview.rollup import rollup_hours_dirty
from ingest.events import alerts_group
from ingest.models import Detection

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


def detection_feedback_set(
    *, detection: Detection, user, verdict: str, note: str = "", now: datetime | None = None
) -> Detection:
    """Record (or replace, or with CLEAR take back) a verdict on a detection, by whom and when.

    The role check is the caller's; the other pages of the tenant are told once it has committed.
    """
    if verdict == CLEAR:
        detection.feedback, detection.feedback_note = "", ""
        detection.feedback_by, detection.feedback_at = None, None
    else:
        if verdict not in Detection.Feedback.values:
            raise ValueError(f"verdict: must be one of {', '.join(Detection.Feedback.values)} or {CLEAR}")
        detection.feedback, detection.feedback_note = verdict, note.strip()[:NOTE_MAX_CHARS]
        detection.feedback_by, detection.feedback_at = user, now or timezone.now()
    with transaction.atomic():
        detection.save(update_fields=["feedback", "feedback_note", "feedback_by", "feedback_at"])
        # The overview reads the verdicts of rolled hours from the rollup: this hour is read live until
        # it is rolled again (the marker's lock orders this after a roll in progress).
        rollup_hours_dirty(times=[detection.ts])
        payload = feedback_payload(detection)
        tenant_id = detection.tenant_id
        transaction.on_commit(lambda: _feedback_publish(tenant_id=tenant_id, payload=payload))
    return detection


def _feedback_publish(*, tenant_id: int, payload: FeedbackPayload) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            alerts_group(tenant_id), {"type": FEEDBACK_MESSAGE, "feedback": payload}
        )
    except Exception:  # the verdict is stored; open pages see it on their next load
        logger.exception("publishing feedback on detection %s failed", payload["id"])
