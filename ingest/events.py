"""Names shared between ingest and whoever listens: Channels groups, task names."""

from __future__ import annotations

TASK_DETECT_RUN = "ingest.detect_run"
TASK_DETECT_RUNS = "ingest.detect_runs"


def alerts_group(tenant_id: int) -> str:
    return f"alerts.tenant.{tenant_id}"
