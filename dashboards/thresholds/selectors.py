"""Reads for threshold admin: the rows that apply to a tenant and how they resolve."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import F, Q, QuerySet

from dashboards.models import ConfigChange
from dashboards.selectors import TenantAccess, tenant_access, user_tenants_with_roles
from ingest.detection import KINDS, Config, ToolSpec
from ingest.detection.config import MODE_PREFIX
from ingest.models import Reconciler, Tenant, ThresholdSet, ToolConfig
from ingest.selectors import (
    DEFAULTS,
    MIN_VERDICTS,
    THRESHOLD_NAMES,
    Resolved,
    VerdictRow,
    Verdicts,
    kind_verdicts,
    scope_label,
    thresholds_resolve,
    tool_specs,
    verdict_rows,
)

# The resolution itself is ingest.selectors.thresholds_resolve: the page shows what the pipeline uses.
__all__ = ["DEFAULTS", "THRESHOLD_NAMES", "Resolved", "scope_label", "thresholds_resolve", "tool_specs"]


def tenant_for_user(*, user, slug: str) -> tuple[Tenant, str] | None:
    """The tenant by slug with the user's role in it; None when the user does not see it."""
    access = tenant_access(user=user, slug=slug)
    return (access.tenant, access.role) if access else None


def user_memberships(*, user) -> list[TenantAccess]:
    """The tenants the user sees, each with .tenant and .role (a superuser: every tenant, as admin)."""
    return user_tenants_with_roles(user=user)


def threshold_rows(*, tenant: Tenant) -> list[ThresholdSet]:
    """Shared rows (tenant NULL) and the tenant's own, shared first, then by scope."""
    return list(
        ThresholdSet.objects.filter(Q(tenant__isnull=True) | Q(tenant=tenant)).order_by(
            F("tenant_id").asc(nulls_first=True), "task_type", "backend", "model"
        )
    )


def tool_rows(*, tenant: Tenant) -> list[ToolConfig]:
    return list(
        ToolConfig.objects.filter(Q(tenant__isnull=True) | Q(tenant=tenant)).order_by(
            "name", F("tenant_id").asc(nulls_first=True)
        )
    )


def config_resolve(
    rows: list[ThresholdSet],
    tools: dict[str, ToolSpec],
    *,
    backend: str,
    model: str,
    task_type: str,
    overrides=None,
    verdicts: list[VerdictRow] | None = None,
) -> Config:
    resolved = thresholds_resolve(
        rows, backend=backend, model=model, task_type=task_type, overrides=overrides, verdicts=verdicts
    )
    return Config(thresholds=resolved.thresholds, tools=tools)


def tenant_verdicts(*, tenant: Tenant) -> list[VerdictRow]:
    return verdict_rows(tenant_ids=[tenant.pk]).get(tenant.pk, [])


@dataclass(frozen=True)
class KindMode:
    """One detection kind on the threshold page: its mode in the scope, and how right it has been."""

    kind: str
    mode: str
    source: str  # where the mode comes from: default, a row, or the measured precision
    default: str
    verdicts: Verdicts

    @property
    def suggestion(self) -> str:
        v = self.verdicts
        if v.total < MIN_VERDICTS:
            return f"fewer than {MIN_VERDICTS} verdicts: not enough to judge"
        if v.low:
            return "precision low: keep in shadow until it is fixed"
        if self.mode == "shadow":
            return "precision good: ready for correct-only"
        return ""


def kind_modes(
    resolved: Resolved, verdicts: list[VerdictRow], *, backend: str, model: str, task_type: str
) -> list[KindMode]:
    return [
        KindMode(
            kind=kind,
            mode=resolved.thresholds.mode(kind),
            source=resolved.sources.get(MODE_PREFIX + kind, "default"),
            default=DEFAULTS.mode(kind),
            verdicts=kind_verdicts(verdicts, kind=kind, backend=backend, model=model, task_type=task_type),
        )
        for kind in KINDS
    ]


def reconcilers_by_tool(*, tenant: Tenant, names: list[str]) -> dict[str, Reconciler]:
    """The tenant's reconcilers of these tools (another tenant's are not even shown)."""
    return {r.tool: r for r in Reconciler.objects.filter(tenant=tenant, tool__in=names)}


def config_changes(*, tenant: Tenant, limit: int = 50) -> QuerySet[ConfigChange]:
    return ConfigChange.objects.filter(tenant=tenant).select_related("user").order_by("-at", "-pk")[:limit]
