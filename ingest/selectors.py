"""Reads, always scoped to one tenant."""

from __future__ import annotations

from django.db.models import QuerySet

from ingest.models import Event, Run, Tenant


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
