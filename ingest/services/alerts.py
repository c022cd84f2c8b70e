"""Alerts: the payload of a stored intervention, published to its tenant's Channels group."""

from __future__ import annotations

import logging
from typing import Any

from ingest.events import ALERT_MESSAGE, alerts_group
from ingest.models import (
    Detection,
    Run,
)

logger = logging.getLogger(__name__)


def alert_payload(detection: Detection, *, run: Run) -> dict[str, Any]:
    # run (pk) and tenant_id let a page link the run and scope the alert without a query per alert.
    return {
        "id": detection.pk,
        "run_id": run.run_id,
        "run": run.pk,
        "tenant_id": run.tenant_id,
        "agent": run.agent,
        "seq": detection.seq,
        "kind": detection.kind,
        "action": detection.action,
        "tool": detection.tool,
        "count": detection.count,
        "at_call": detection.at_call,
        "at_round": detection.at_round,
        "backend": detection.backend,
        "model": detection.model,
        "task_type": detection.task_type,
        "hint": detection.hint,
        "ts": detection.ts.isoformat(),
        # A kind in shadow: stored as observe, with the action it would have taken.
        "shadow": str(detection.evidence.get("shadow", "")) if isinstance(detection.evidence, dict) else "",
    }


def alerts_publish(*, tenant_id: int, alerts: list[dict]) -> None:
    """Send alerts to the tenant's Channels group. At most once: pages catch up from the database."""
    alerts_publish_all(alerts=[(tenant_id, alert) for alert in alerts])


def alerts_publish_all(*, alerts: list[tuple[int, dict]]) -> None:
    """Send (tenant_id, alert) pairs to their tenants' groups, in order, from one event loop (one
    connection to the channel layer for all of a pass's alerts). At most once, as alerts_publish."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None or not alerts:
        return

    async def send() -> None:
        for tenant_id, alert in alerts:
            await layer.group_send(alerts_group(tenant_id), {"type": ALERT_MESSAGE, "alert": alert})

    try:
        async_to_sync(send)()
    except Exception:  # a broken channel layer must not undo stored detections
        logger.exception("publishing %d alerts failed", len(alerts))
