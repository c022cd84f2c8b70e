"""Reads for the operator queue: writes whose outcome nobody knows yet, and runs waiting for a
person (the guard's handoff), of the user's tenants."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.utils import timezone

from dashboards.models import Membership
from ingest.ledger import reconciler_for
from ingest.models import Operation, Reconciler, Run, Tenant

S = Operation.Status
QUEUE_LIMIT = 500  # rows on one page: past this the filters narrow it, the total is still shown


def membership_role(*, user, tenant_id: int) -> str:
    """The user's role in the tenant, "" when not a member."""
    return (
        Membership.objects.filter(user=user, tenant_id=tenant_id).values_list("role", flat=True).first() or ""
    )


def _open(now: datetime) -> Q:
    # The same rule as the navigation count (dashboards.context_processors.nav).
    return Q(status=S.UNKNOWN) | Q(status=S.RUNNING, lease_expires_at__lt=now)


@dataclass(frozen=True)
class QueueFilters:
    needs_person: bool = False
    tool: str = ""
    tenant: str = ""  # slug
    q: str = ""  # part of the operation key, the external request id or the run id


def queue_operations(*, user, filters: QueueFilters, now: datetime | None = None) -> QuerySet[Operation]:
    """Open operations (UNKNOWN, or RUNNING past its lease) of the user's tenants, oldest first."""
    now = now or timezone.now()
    qs = Operation.objects.filter(_open(now), tenant__memberships__user=user)
    if filters.needs_person:
        qs = qs.filter(needs_person=True)
    if filters.tool:
        qs = qs.filter(tool=filters.tool)
    if filters.tenant:
        qs = qs.filter(tenant__slug=filters.tenant)
    if filters.q:
        qs = qs.filter(
            Q(operation_key__icontains=filters.q)
            | Q(external_request_id__icontains=filters.q)
            | Q(run__run_id__icontains=filters.q)
        )
    # Oldest first by the moment nobody knew any more: an expired RUNNING has no unknown_since yet.
    return (
        qs.select_related("tenant", "run")
        .annotate(open_since=Coalesce("unknown_since", "lease_expires_at", "created_at"))
        .order_by("open_since", "pk")
    )


def queue_waiting_runs(*, user, filters: QueueFilters) -> QuerySet[Run]:
    """Runs of the user's tenants waiting for a person, the longest waiting first.

    The tenant and the search (by run id) filter them; tool and *needs a person* are the writes'.
    """
    qs = Run.objects.filter(status=Run.Status.WAITING, tenant__memberships__user=user)
    if filters.tenant:
        qs = qs.filter(tenant__slug=filters.tenant)
    if filters.q:
        qs = qs.filter(run_id__icontains=filters.q)
    # handoff.at is the guard's timezone.now().isoformat(): always UTC, so text order is time order.
    return (
        qs.select_related("tenant")
        .annotate(waiting_since=KT("handoff__at"))
        .order_by("waiting_since", "last_event_at", "pk")
    )


def queue_tools(*, user, now: datetime | None = None) -> list[str]:
    """Tools with open operations, for the filter."""
    now = now or timezone.now()
    return list(
        Operation.objects.filter(_open(now), tenant__memberships__user=user)
        .values_list("tool", flat=True)
        .distinct()
        .order_by("tool")
    )


def queue_operation_get(*, user, pk: int) -> Operation | None:
    """One operation of the user's tenants, whatever its state (a resolved one stays readable)."""
    return (
        Operation.objects.filter(pk=pk, tenant__memberships__user=user)
        .select_related("tenant", "run")
        .first()
    )


def operation_is_open(op: Operation, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    return op.status == S.UNKNOWN or (
        op.status == S.RUNNING and op.lease_expires_at is not None and op.lease_expires_at < now
    )


def open_since(op: Operation) -> datetime | None:
    """Since when nobody knows: the UNKNOWN period, or the moment an expired lease ran out."""
    if op.status == S.RUNNING:
        return op.lease_expires_at
    return op.unknown_since or op.updated_at


def operation_reconciler(*, op: Operation) -> Reconciler | None:
    return reconciler_for(op)


def user_tenants_with_roles(*, user) -> list[tuple[Tenant, str]]:
    return [
        (m.tenant, m.role)
        for m in Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug")
    ]
