"""Reads for pages, scoped to the tenants of the user."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet, Sum

from ingest.models import Run, Tenant


def user_tenants(*, user) -> QuerySet[Tenant]:
    return Tenant.objects.filter(memberships__user=user)


def overview_figures(*, tenants: QuerySet[Tenant]) -> dict:
    runs = Run.objects.filter(tenant__in=tenants)
    totals = runs.aggregate(
        runs=Count("pk"),
        running=Count("pk", filter=Q(status=Run.Status.RUNNING)),
        truncated=Count("pk", filter=Q(terminated_by="budget")),
        events=Sum("events_count"),
        cost=Sum("cost_usd"),
    )
    by_backend = list(
        runs.values("backend")
        .annotate(runs=Count("pk"), cost=Sum("cost_usd"), rounds=Sum("rounds"))
        .order_by("backend")
    )
    recent = runs.order_by("-last_event_at")[:25]
    return {"totals": totals, "by_backend": by_backend, "recent": recent}
