"""Reads, always scoped to one tenant."""

from __future__ import annotations

import logging

from django.db.models import Q, QuerySet

from ingest.detection import Config, Thresholds, ToolSpec
from ingest.models import Event, Run, Tenant, ThresholdSet, ToolConfig

logger = logging.getLogger(__name__)


def run_list(*, tenant: Tenant, filters: dict[str, str] | None = None, limit: int = 100) -> QuerySet[Run]:
    qs = Run.objects.filter(tenant=tenant)
    for name, value in (filters or {}).items():
        if name in ("status", "backend", "task_type", "agent", "model") and value:
            qs = qs.filter(**{name: value})
    return qs.order_by("-started_at", "-pk")[:limit]


def run_get(*, tenant: Tenant, run_id: str) -> Run | None:
    return Run.objects.filter(tenant=tenant, run_id=run_id).select_related("cursor").first()


def run_events(*, run: Run, after_seq: int = 0, limit: int = 1000) -> QuerySet[Event]:
    return Event.objects.filter(run=run, seq__gt=after_seq).order_by("seq")[:limit]


def detection_config(*, run: Run) -> Config:
    """Thresholds for the run: defaults < global row < task type < backend < (backend, model)."""
    rows = ThresholdSet.objects.filter(
        Q(backend="", model="", task_type__in=["", run.task_type])
        | Q(backend=run.backend, model__in=["", run.model], task_type="")
    )

    def weight(row: ThresholdSet) -> int:
        return (
            (2 if row.backend else 0)
            + (1 if row.model else 0)
            + (1 if row.task_type else 0) * (not row.backend)
        )

    thresholds = Thresholds()
    for row in sorted(rows, key=weight):
        try:
            thresholds = thresholds.merged(row.values)
        except (TypeError, ValueError) as exc:
            logger.warning("thresholds %s ignored: %s", row, exc)
    tools = {
        tool.name: ToolSpec(
            kind=tool.kind,
            core_args=tuple(tool.core_args),
            noise_args=tuple(tool.noise_args),
            cursor_args=tuple(tool.cursor_args),
            casefold=tool.casefold,
        )
        for tool in ToolConfig.objects.all()
    }
    return Config(thresholds=thresholds, tools=tools)
