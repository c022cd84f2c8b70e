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


def _target(row: ThresholdSet | ToolConfig) -> str:
    return f"tool {row.name}" if isinstance(row, ToolConfig) else f"thresholds {scope_label(row)}"


def _state(row: ThresholdSet | ToolConfig) -> dict[str, Any]:
    return _tool_state(row) if isinstance(row, ToolConfig) else _threshold_state(row)


def _save(*, tenant: Tenant, user, row, new_row, fields: dict[str, Any], note: str):
    """Create `new_row` (row None) or update the locked `row` with `fields`; record the change."""
    with transaction.atomic():
        if row is None:
            row, before, action = new_row, None, ConfigChange.Action.CREATE
        else:
            row = type(row).objects.select_for_update().get(pk=row.pk, tenant=tenant)
            before, action = _state(row), ConfigChange.Action.UPDATE
        for key, value in fields.items():
            setattr(row, key, value)
        row.full_clean()
        row.save()
        ConfigChange.objects.create(
            tenant=tenant,
            user=user,
            target=_target(row),
            action=action,
            before=before,
            after=_state(row),
            note=note,
        )
    return row


def _delete(*, tenant: Tenant, user, row, note: str) -> None:
    with transaction.atomic():
        row = type(row).objects.select_for_update().get(pk=row.pk, tenant=tenant)
        ConfigChange.objects.create(
            tenant=tenant,
            user=user,
            target=_target(row),
            action=ConfigChange.Action.DELETE,
            before=_state(row),
            after=None,
            note=note,
        )
        row.delete()


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
    new_row = ThresholdSet(tenant=tenant, backend=backend, model=model, task_type=task_type)
    return _save(tenant=tenant, user=user, row=row, new_row=new_row, fields={"values": values}, note=note)


def threshold_set_delete(*, tenant: Tenant, user, row: ThresholdSet, note: str = "") -> None:
    _delete(tenant=tenant, user=user, row=row, note=note)


def tool_config_save(
    *, tenant: Tenant, user, row: ToolConfig | None, name: str, fields: dict[str, Any], note: str = ""
) -> ToolConfig:
    """Create or update the tenant's description of tool `name`; records the change."""
    new_row = ToolConfig(tenant=tenant, name=name)
    return _save(tenant=tenant, user=user, row=row, new_row=new_row, fields=fields, note=note)


def tool_config_delete(*, tenant: Tenant, user, row: ToolConfig, note: str = "") -> None:
    _delete(tenant=tenant, user=user, row=row, note=note)
