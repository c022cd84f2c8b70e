"""Reads for threshold admin: the rows that apply to a tenant and how they resolve."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from django.db.models import F, Q, QuerySet

from dashboards.models import ConfigChange
from dashboards.selectors import TenantAccess, tenant_access, user_tenants_with_roles
from ingest.detection import KINDS, Config, Thresholds, ToolSpec
from ingest.detection.config import MODE_PREFIX
from ingest.models import Reconciler, Tenant, ThresholdSet, ToolConfig
from ingest.selectors import (
    MIN_VERDICTS,
    VerdictRow,
    Verdicts,
    kind_verdicts,
    modes_measured,
    threshold_applies,
    threshold_weight,
    verdict_rows,
)
from ingest.selectors import tool_specs as shared_tool_specs

THRESHOLD_NAMES = tuple(f.name for f in fields(Thresholds))
DEFAULTS = Thresholds()


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


def scope_label(
    row: ThresholdSet | None = None, *, backend: str = "", model: str = "", task_type: str = ""
) -> str:
    if row is not None:
        backend, model, task_type = row.backend, row.model, row.task_type
    if task_type:
        return f"task type {task_type}"
    if backend:
        return f"{backend}/{model}" if model else f"backend {backend}"
    return "global"


@dataclass(frozen=True)
class Resolved:
    thresholds: Thresholds
    sources: dict[str, str]  # threshold name -> where its value comes from ("default" or a row)


def thresholds_resolve(
    rows: list[ThresholdSet],
    *,
    backend: str,
    model: str,
    task_type: str,
    overrides: dict[int | None, Any] | None = None,
    verdicts: list[VerdictRow] | None = None,
) -> Resolved:
    """Resolve in memory as config_for does: defaults < shared rows < the tenant's, by scope; with
    `verdicts` (the tenant's, verdict_rows), a kind operators judged wrong too often in shadow.

    `overrides` replaces rows' values by pk (None: the row is left out). Rows whose values are
    invalid are skipped, as the pipeline skips them.
    """
    overrides = overrides or {}
    thresholds = DEFAULTS
    sources = dict.fromkeys(THRESHOLD_NAMES, "default")
    applying = (r for r in rows if threshold_applies(r, backend=backend, model=model, task_type=task_type))
    for row in sorted(applying, key=threshold_weight):
        values = overrides[row.pk] if row.pk in overrides else row.values
        if values is None:
            continue
        try:
            thresholds = thresholds.merged(values)
        except (TypeError, ValueError, AttributeError):
            continue
        origin = ("" if row.tenant_id else "shared ") + scope_label(row)
        for name in values:
            sources[name] = origin
    if verdicts is not None:
        explicit = {name for name, source in sources.items() if source != "default"}
        thresholds, demoted = modes_measured(
            thresholds,
            explicit=explicit,
            verdicts=verdicts,
            backend=backend,
            model=model,
            task_type=task_type,
        )
        for name, found in demoted.items():
            sources[name] = (
                f"measured: precision {found.precision:.2f} over {found.total} verdicts ({found.scope})"
            )
    return Resolved(thresholds, sources)


def tool_rows(*, tenant: Tenant) -> list[ToolConfig]:
    return list(
        ToolConfig.objects.filter(Q(tenant__isnull=True) | Q(tenant=tenant)).order_by(
            "name", F("tenant_id").asc(nulls_first=True)
        )
    )


def tool_specs(
    rows: list[ToolConfig], *, replace: dict[str, ToolSpec | None] | None = None
) -> dict[str, ToolSpec]:
    """Tool specs as config_for builds them, with some replaced (None: removed) for a preview."""
    specs = shared_tool_specs(rows)
    for name, spec in (replace or {}).items():
        if spec is None:
            specs.pop(name, None)
        else:
            specs[name] = spec
    return specs


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
