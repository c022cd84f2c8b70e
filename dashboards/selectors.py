"""Reads for pages, scoped to the tenants of the user."""

from __future__ import annotations

from django.db.models import QuerySet

from ingest.models import Tenant


def user_tenants(*, user) -> QuerySet[Tenant]:
    return Tenant.objects.filter(memberships__user=user)
