"""Reads for pages, scoped to the tenants of the user.

Every page and socket asks here which tenants a user sees and with what role: a member sees the
tenants of their memberships with the membership's role; a superuser sees and administers every
tenant (the one `createsuperuser` makes included), as in the Django admin.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet

from dashboards.models import OPERATOR_ROLES, Membership
from ingest.models import Tenant


@dataclass(frozen=True)
class TenantAccess:
    """A tenant the user sees and the user's role in it."""

    tenant: Tenant
    role: str


def _everything(user) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_superuser)


def user_tenants(*, user) -> QuerySet[Tenant]:
    if _everything(user):
        return Tenant.objects.all()
    if not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(memberships__user=user)


def user_tenant_ids(*, user) -> list[int]:
    if _everything(user):
        return list(Tenant.objects.values_list("pk", flat=True))
    if not user.is_authenticated:
        return []
    return list(Membership.objects.filter(user=user).values_list("tenant_id", flat=True))


def operator_tenant_ids(*, user) -> list[int]:
    """Tenants in which the user acts (operator or admin): marks alerts, answers runs, decides writes."""
    if _everything(user):
        return list(Tenant.objects.values_list("pk", flat=True))
    if not user.is_authenticated:
        return []
    return list(
        Membership.objects.filter(user=user, role__in=OPERATOR_ROLES).values_list("tenant_id", flat=True)
    )


def tenant_role(*, user, tenant_id: int) -> str:
    """The user's role in the tenant ("admin" for a superuser), "" when the user does not see it."""
    if _everything(user):
        return Membership.Role.ADMIN
    if not user.is_authenticated:
        return ""
    return (
        Membership.objects.filter(user=user, tenant_id=tenant_id).values_list("role", flat=True).first() or ""
    )


def user_tenants_with_roles(*, user) -> list[TenantAccess]:
    """The tenants the user sees with the role in each, by slug."""
    if _everything(user):
        return [TenantAccess(t, Membership.Role.ADMIN) for t in Tenant.objects.order_by("slug")]
    if not user.is_authenticated:
        return []
    return [
        TenantAccess(m.tenant, m.role)
        for m in Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug")
    ]


def tenant_access(*, user, slug: str) -> TenantAccess | None:
    """A tenant by slug with the user's role in it; None when there is none the user sees."""
    if _everything(user):
        tenant = Tenant.objects.filter(slug=slug).first()
        return TenantAccess(tenant, Membership.Role.ADMIN) if tenant else None
    if not user.is_authenticated:
        return None
    membership = Membership.objects.filter(user=user, tenant__slug=slug).select_related("tenant").first()
    return TenantAccess(membership.tenant, membership.role) if membership else None


def visible_to(user, field: str = "tenant") -> Q:
    """The filter of rows whose `field` (a tenant foreign key) is a tenant the user sees."""
    if _everything(user):
        return Q()
    if not user.is_authenticated:
        return Q(pk__in=[])
    return Q(**{f"{field}__memberships__user": user})
