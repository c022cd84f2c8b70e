"""Writes of a tenant's detection settings, each with its ConfigChange (who, what, before, after)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from dashboards.models import ConfigChange
from dashboards.thresholds.selectors import scope_label
from ingest.models import Tenant, ThresholdSet, ToolConfig


def _threshold_state(row: ThresholdSet) -> dict[str, Any]:
    return {"backend": row.backend, "model": row.model, "task_type": row.task_type, "values": row.values}


def _tool_state(row: ToolConfig) -> dict[str, Any]:
    return {
        "kind": row.kind,
        "core_args": row.core_args,
        "noise_args": row.noise_args,
        "cursor_args": row.cursor_args,
        "casefold": row.casefold,
    }


def threshold_set_save(
    *,
    tenant: Tenant,
    user,
    row: ThresholdSet | None,
    backend: str,
    model: str,
    task_type: str,
    values: dict[str, Any],
    note: str = "",
) -> ThresholdSet:
    """Create or update one of the tenant's threshold rows; records the change."""
    with transaction.atomic():
        if row is None:
            row = ThresholdSet(
                tenant=tenant, backend=backend, model=model, task_type=task_type, values=values
            )
            before = None
            action = ConfigChange.Action.CREATE
        else:
            row = ThresholdSet.objects.select_for_update().get(pk=row.pk, tenant=tenant)
            before = _threshold_state(row)
            row.values = values
            action = ConfigChange.Action.UPDATE
        row.full_clean()
        row.save()
        ConfigChange.objects.create(
            tenant=tenant,
            user=user,
            target=f"thresholds {scope_label(row)}",
            action=action,
            before=before,
            after=_threshold_state(row),
            note=note,
        )
    return row


def threshold_set_delete(*, tenant: Tenant, user, row: ThresholdSet, note: str = "") -> None:
    with transaction.atomic():
        row = ThresholdSet.objects.select_for_update().get(pk=row.pk, tenant=tenant)
        ConfigChange.objects.create(
            tenant=tenant,
            user=user,
            target=f"thresholds {scope_label(row)}",
            action=ConfigChange.Action.DELETE,
            before=_threshold_state(row),
            after=None,
            note=note,
        )
        row.delete()


def tool_config_save(
    *, tenant: Tenant, user, row: ToolConfig | None, name: str, fields: dict[str, Any], note: str = ""
) -> ToolConfig:
    with transaction.atomic():
        if row is None:
            row = ToolConfig(tenant=tenant, name=name)
            before = None
            action = ConfigChange.Action.CREATE
        else:
            row = ToolConfig.objects.select_for_update().get(pk=row.pk, tenant=tenant)
            before = _tool_state(row)
            action = ConfigChange.Action.UPDATE
        for key, value in fields.items():
            setattr(row, key, value)
        row.full_clean()
        row.save()
        ConfigChange.objects.create(
            tenant=tenant,
            user=user,
            target=f"tool {row.name}",
            action=action,
            before=before,
            after=_tool_state(row),
            note=note,
        )
    return row


def tool_config_delete(*, tenant: Tenant, user, row: ToolConfig, note: str = "") -> None:
    with transaction.atomic():
        row = ToolConfig.objects.select_for_update().get(pk=row.pk, tenant=tenant)
        ConfigChange.objects.create(
            tenant=tenant,
            user=user,
            target=f"tool {row.name}",
            action=ConfigChange.Action.DELETE,
            before=_tool_state(row),
            after=None,
            note=note,
        )
        row.delete()
