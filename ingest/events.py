"""Names shared between ingest and whoever listens: Channels groups, task names."""

from __future__ import annotations

TASK_DETECT_RUN = "ingest.detect_run"
TASK_DETECT_RUNS = "ingest.detect_runs"
TASK_DETECT_PENDING = "ingest.detect_pending"
TASK_DETECT_SWEEP = "ingest.detect_sweep"
TASK_INCIDENTS_NOTIFY = "ingest.incidents_notify"
TASK_NOTIFICATION_DELIVER = "ingest.notification_deliver"


def alerts_group(tenant_id: int) -> str:
    return f"alerts.tenant.{tenant_id}"


# The type of a Channels group message carrying one alert (a consumer's handler: alert_detection).
ALERT_MESSAGE = "alert.detection"
