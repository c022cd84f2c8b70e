"""Reads for the operator queue: writes whose outcome nobody knows yet, and runs waiting for a
person (the guard's handoff), of the user's tenants."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.utils import timezone

from dashboards.selectors import tenant_role, visible_to
from dashboards.selectors import user_tenants_with_roles as _tenants_with_roles
from ingest.ledger import reconciler_for
from ingest.models import Operation, Reconciler, Run, Tenant

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

S = Operation.Status
QUEUE_LIMIT = 500  # rows on one page: past this the filters narrow it, the total is still shown


def membership_role(*, user, tenant_id: int) -> str:
    """The user's role in the tenant, "" when not a member."""
    return tenant_role(user=user, tenant_id=tenant_id)


def has_reconciler() -> Exists:
    """Whether the operation's tenant has a reconciler for its tool (reconciler_for's rule)."""
    return Exists(Reconciler.objects.filter(tenant_id=OuterRef("tenant_id"), tool=OuterRef("tool")))


def needs_person_q() -> Q:
    """Open operations that wait for a person: reconciliation gave up on them (needs_person), or
    nothing will ever ask the downstream about them (no reconciler for the tool). The queue's count,
    its filter, its badges, the detail page and the overview all use this rule."""
    return cast(Q, Q(needs_person=True) | ~has_reconciler())  # Q | Exists is a Q (the stubs say Combinable)


def _pass_every_s(name: str) -> float:
    entry = settings.CELERY_BEAT_SCHEDULE.get(name, {})
    schedule: Any = entry.get("schedule", 15.0)  # seconds, a timedelta or a Celery schedule
    if hasattr(schedule, "total_seconds"):
        return float(schedule.total_seconds())
    if hasattr(schedule, "run_every"):
        return float(schedule.run_every.total_seconds())
    return float(schedule)


# Who runs the periodic passes: Celery beat, or in the embedded mode `manage.py demo_beat` (which
# `dev.py up` starts). A page cannot see either process, so a due time well past says which to check.
NO_PASS = "is Celery beat running (in the embedded mode `manage.py demo_beat`, which dev.py up starts)?"


def reconcile_schedule(op: Operation, now: datetime, *, reconciler: bool) -> dict[str, str]:
    """What the page says about the next reconciliation of an open operation: {text, why}. Never a
    time in the past without the reason: a pass is due at most one beat interval after the time it
    names; later than that, no pass has run."""
    if op.needs_person or not reconciler:
        return {"text": "", "why": "a person decides"}
    if op.status == S.RUNNING:
        every = _pass_every_s("ledger-expire-leases")
        expired = op.lease_expires_at or now
        if (now - expired).total_seconds() <= 2 * every:
            return {
                "text": "",
                "why": f"the lease ran out; the next pass (every {every:g} s) makes it UNKNOWN",
            }
        return {
            "text": "",
            "why": f"the lease ran out at {expired:%H:%M:%S} UTC and no pass took it since: {NO_PASS}",
        }
    at = op.next_reconcile_at
    if at is None:
        return {"text": "", "why": "not scheduled"}
    if at > now:
        return {"text": f"{at:%Y-%m-%d %H:%M:%S} UTC", "why": ""}
    every = _pass_every_s("ledger-reconcile")
    if (now - at).total_seconds() <= 2 * every:
        return {"text": "", "why": f"due now: reconciliation passes every {every:g} s"}
    return {
        "text": "",
        "why": f"due since {at:%H:%M:%S} UTC and no reconciliation pass has run since: {NO_PASS} "
        "Meanwhile retry it now or decide.",
    }


def _open(now: datetime) -> Q:
    # The same rule as the navigation count (dashboards.context_processors.nav).
    return Q(status=S.UNKNOWN) | Q(status=S.RUNNING, lease_expires_at__lt=now)


@dataclass(frozen=True)
class QueueFilters:
    needs_person: bool = False
    tool: str = ""
    tenant: str = ""  # slug
    q: str = ""  # part of the operation key, the external request id or the run id


class QueueAnnotations(TypedDict):
    reconciler_exists: bool  # has_reconciler()


def queue_operations(
    *, user, filters: QueueFilters, now: datetime | None = None
) -> QuerySet[WithAnnotations[Operation, QueueAnnotations]]:
    """Open operations (UNKNOWN, or RUNNING past its lease) of the user's tenants, oldest first."""
    now = now or timezone.now()
    qs = Operation.objects.filter(_open(now), visible_to(user))
    qs = qs.annotate(reconciler_exists=has_reconciler())
    if filters.needs_person:
        qs = qs.filter(needs_person_q())
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
    qs = Run.objects.filter(visible_to(user), status=Run.Status.WAITING)
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
        Operation.objects.filter(_open(now), visible_to(user))
        .values_list("tool", flat=True)
        .distinct()
        .order_by("tool")
    )


def queue_operation_get(*, user, pk: int) -> Operation | None:
    """One operation of the user's tenants, whatever its state (a resolved one stays readable)."""
    return Operation.objects.filter(visible_to(user), pk=pk).select_related("tenant", "run").first()


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
    return [(access.tenant, access.role) for access in _tenants_with_roles(user=user)]
