"""Reads, always scoped to one tenant."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db.models import F, Q, QuerySet

from ingest.detection import Config, Thresholds, ToolSpec
from ingest.models import Event, Run, Tenant, ThresholdSet, ToolConfig

logger = logging.getLogger(__name__)


def run_list(
    *,
    tenant: Tenant,
    filters: dict[str, str] | None = None,
    limit: int = 100,
    after: tuple[datetime | None, int] | None = None,
) -> QuerySet[Run]:
    """The tenant's runs, the latest started first (then the latest created), `limit` of them;
    with `after` (the started_at and pk of the last run of the page before), the page after it."""
    qs = Run.objects.filter(tenant=tenant)
    for name, value in (filters or {}).items():
        if name in ("status", "backend", "task_type", "agent", "model") and value:
            qs = qs.filter(**{name: value})
    if after is not None:
        started, pk = after
        if started is None:  # runs without a start come first
            qs = qs.filter(Q(started_at__isnull=True, pk__lt=pk) | Q(started_at__isnull=False))
        else:
            qs = qs.filter(Q(started_at__lt=started) | Q(started_at=started, pk__lt=pk))
    # NULLS FIRST as PostgreSQL sorts DESC by default (the (tenant, -started_at) indexes serve it),
    # said so that SQLite sorts the same.
    return qs.order_by(F("started_at").desc(nulls_first=True), "-pk")[:limit]


def run_get(*, tenant: Tenant, run_id: str) -> Run | None:
    return Run.objects.filter(tenant=tenant, run_id=run_id).select_related("cursor").first()


def run_events(*, run: Run, after_seq: int = 0, limit: int = 1000) -> QuerySet[Event]:
    return Event.objects.filter(run=run, seq__gt=after_seq).order_by("seq")[:limit]


def detection_config(*, run: Run) -> Config:
    """Thresholds and tools for the run (see ThresholdSet for the order of resolution)."""
    return config_for(tenant_id=run.tenant_id, backend=run.backend, model=run.model, task_type=run.task_type)


Scope = tuple[int, str, str, str]  # (tenant_id, backend, model, task_type)


def config_for(*, tenant_id: int, backend: str, model: str, task_type: str) -> Config:
    """Defaults < rows for every tenant < the tenant's rows; within each, by scope:
    global < task type < backend < (backend, model). A tenant's tool row replaces the shared one."""
    scope = (tenant_id, backend, model, task_type)
    return configs_for(scopes={scope})[scope]


def configs_for(*, scopes: set[Scope]) -> dict[Scope, Config]:
    """config_for of several scopes with two queries for all of them (the detection task resolves
    the scopes of every run of a pass at once): the rows of the tenants and the shared ones, each
    scope's picked in memory by threshold_applies."""
    tenants = {tenant_id for tenant_id, _, _, _ in scopes}
    backends = {backend for _, backend, _, _ in scopes}
    rows = list(
        ThresholdSet.objects.filter(
            Q(tenant__isnull=True) | Q(tenant_id__in=tenants), backend__in=["", *sorted(backends)]
        )
    )
    rows.sort(key=threshold_weight)
    tools = list(ToolConfig.objects.filter(Q(tenant__isnull=True) | Q(tenant_id__in=tenants)))
    specs = {
        tenant_id: tool_specs([t for t in tools if t.tenant_id in (None, tenant_id)]) for tenant_id in tenants
    }
    configs = {}
    for tenant_id, backend, model, task_type in scopes:
        thresholds = Thresholds()
        for row in rows:
            if row.tenant_id not in (None, tenant_id):
                continue
            if not threshold_applies(row, backend=backend, model=model, task_type=task_type):
                continue
            try:
                thresholds = thresholds.merged(row.values)
            except (TypeError, ValueError, AttributeError) as exc:  # values not an object, say
                logger.warning("thresholds %s ignored: %s", row, exc)
        configs[(tenant_id, backend, model, task_type)] = Config(
            thresholds=thresholds, tools=specs[tenant_id]
        )
    return configs


def threshold_applies(row: ThresholdSet, *, backend: str, model: str, task_type: str) -> bool:
    """Whether the row is among those config_for selects for this scope (its SQL filter, in Python)."""
    if not row.backend and not row.model:
        return row.task_type in ("", task_type)
    return row.backend == backend and row.model in ("", model) and not row.task_type


def threshold_weight(row: ThresholdSet) -> tuple[bool, int]:
    """The order rows apply in, weakest first: shared before the tenant's, then by scope."""
    scope = (
        (2 if row.backend else 0) + (1 if row.model else 0) + (1 if row.task_type else 0) * (not row.backend)
    )
    return (row.tenant_id is not None, scope)


def tool_specs(rows) -> dict[str, ToolSpec]:
    """The engine's tool specs by name: a tenant's row replaces the shared one of that name."""
    return {
        row.name: ToolSpec(
            kind=row.kind,
            core_args=tuple(row.core_args),
            noise_args=tuple(row.noise_args),
            cursor_args=tuple(row.cursor_args),
            casefold=row.casefold,
        )
        for row in sorted(rows, key=lambda r: r.tenant_id is not None)
    }
