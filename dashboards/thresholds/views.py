"""Threshold admin: a tenant's detection settings, read by every member, edited by its admins."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from dashboards.models import Membership
from dashboards.thresholds.forms import (
    BACKEND_FIELDS,
    LABELS,
    MODE_FIELDS,
    TASK_FIELDS,
    ThresholdSetForm,
    ToolConfigForm,
    named_errors,
)
from dashboards.thresholds.preview import PREVIEW_RUNS, Preview, preview_replay
from dashboards.thresholds.selectors import (
    DEFAULTS,
    config_changes,
    config_resolve,
    kind_modes,
    reconcilers_by_tool,
    scope_label,
    tenant_for_user,
    tenant_verdicts,
    threshold_rows,
    thresholds_resolve,
    tool_rows,
    tool_specs,
    user_memberships,
)
from dashboards.thresholds.services import (
    threshold_set_delete,
    threshold_set_save,
    tool_config_delete,
    tool_config_save,
)
from ingest.models import Run, ThresholdSet, ToolConfig
from ingest.selectors import MIN_VERDICTS, PRECISION_FLOOR

ADMIN = Membership.Role.ADMIN
HISTORY_ON_INDEX = 15
HISTORY_PAGE = 200


def _tenant(request, slug: str):
    found = tenant_for_user(user=request.user, slug=slug)
    if found is None:
        raise Http404("no such tenant")
    return found


def _admin_only(role: str) -> None:
    if role != ADMIN:
        raise PermissionDenied("only the tenant's admins change detection settings")


def _scope(source) -> tuple[str, str, str]:
    return tuple((source.get(name) or "").strip()[:200] for name in ("backend", "model", "task_type"))  # type: ignore[return-value]


def _scope_choices(tenant) -> dict[str, list[str]]:
    runs = Run.objects.filter(tenant=tenant)
    return {
        "backends": sorted(set(runs.values_list("backend", flat=True).distinct()[:200])),
        "models": sorted({m for m in runs.values_list("model", flat=True).distinct()[:200] if m}),
        "task_types": sorted(set(runs.values_list("task_type", flat=True).distinct()[:200])),
    }


def _diff(before: dict | None, after: dict | None) -> list[tuple[str, Any, Any]]:
    """Changed keys, with a row's `values` spread out so that each threshold reads on its own."""

    def flat(state: dict | None) -> dict[str, Any]:
        if not state:
            return {}
        out = {k: v for k, v in state.items() if k != "values"}
        out.update(state.get("values") or {})
        return out

    b, a = flat(before), flat(after)
    return [(k, b.get(k, "—"), a.get(k, "—")) for k in sorted(set(b) | set(a)) if b.get(k) != a.get(k)]


def _changes(tenant, limit: int) -> list[dict[str, Any]]:
    return [{"c": c, "diff": _diff(c.before, c.after)} for c in config_changes(tenant=tenant, limit=limit)]


@login_required
def index(request):
    first = next(iter(user_memberships(user=request.user)), None)
    if first is None:
        return render(request, "dashboards/thresholds/no_tenant.html")
    return redirect("thresholds:tenant", slug=first.tenant.slug)


@login_required
def tenant_index(request, slug: str):
    tenant, role = _tenant(request, slug)
    rows = threshold_rows(tenant=tenant)
    backend, model, task_type = _scope(request.GET)
    verdicts = tenant_verdicts(tenant=tenant)
    resolved = thresholds_resolve(rows, backend=backend, model=model, task_type=task_type, verdicts=verdicts)
    effective = [
        {
            "name": name,
            "label": LABELS.get(name, name),
            "value": getattr(resolved.thresholds, name),
            "default": getattr(DEFAULTS, name),
            "source": resolved.sources[name],
        }
        for name in (*BACKEND_FIELDS, *TASK_FIELDS)
    ]
    tools = tool_rows(tenant=tenant)
    overridden = {t.name for t in tools if t.tenant_id}
    return render(
        request,
        "dashboards/thresholds/index.html",
        {
            "tenant": tenant,
            "role": role,
            "is_admin": role == ADMIN,
            "memberships": user_memberships(user=request.user),
            "shared_rows": [r for r in rows if r.tenant_id is None],
            "tenant_rows": [r for r in rows if r.tenant_id is not None],
            "scope": {"backend": backend, "model": model, "task_type": task_type},
            "scope_label": scope_label(backend=backend, model=model, task_type=task_type),
            "scope_choices": _scope_choices(tenant),
            "effective": effective,
            "modes": kind_modes(resolved, verdicts, backend=backend, model=model, task_type=task_type),
            "min_verdicts": MIN_VERDICTS,
            "precision_floor": PRECISION_FLOOR,
            "tools": [{"row": t, "overridden": t.tenant_id is None and t.name in overridden} for t in tools],
            "reconcilers": reconcilers_by_tool(tenant=tenant, names=[t.name for t in tools]),
            "changes": _changes(tenant, HISTORY_ON_INDEX),
        },
    )


def _threshold_preview(
    tenant, rows, row, *, scope: tuple[str, str, str], values: dict | None, limit: int
) -> Preview:
    """Replay the scope's last runs with the rows as they are and with `row` (or a new row of that
    scope) holding `values`; `values` None: with `row` removed."""
    backend, model, task_type = scope
    runs = Run.objects.filter(tenant=tenant)
    if task_type:
        runs = runs.filter(task_type=task_type)
    if backend:
        runs = runs.filter(backend=backend)
    if model:
        runs = runs.filter(model=model)
    tools = tool_specs(tool_rows(tenant=tenant))
    verdicts = tenant_verdicts(tenant=tenant)  # the preview resolves modes as the pipeline does
    if row is None:
        proposed_rows = [
            *rows,
            ThresholdSet(tenant=tenant, backend=backend, model=model, task_type=task_type, values=values),
        ]
        overrides = None
    else:
        proposed_rows, overrides = rows, {row.pk: values}
    cache: dict[tuple, Any] = {}

    def resolve(which: str, run: Run):
        key = (which, run.backend, run.model, run.task_type)
        if key not in cache:
            cache[key] = config_resolve(
                proposed_rows if which == "new" else rows,
                tools,
                backend=run.backend,
                model=run.model,
                task_type=run.task_type,
                overrides=overrides if which == "new" else None,
                verdicts=verdicts,
            )
        return cache[key]

    return preview_replay(
        runs=runs,
        limit=limit,
        current=lambda run: resolve("now", run),
        proposed=lambda run: resolve("new", run),
        budget_s=settings.LOOPWATCH_PREVIEW_BUDGET_MS / 1000,
    )


@login_required
@require_http_methods(["GET", "POST"])
def threshold_edit(request, slug: str, pk: int | None = None):
    tenant, role = _tenant(request, slug)
    # Only the tenant's own rows are edited here; shared rows are staff's (the Django admin).
    row = get_object_or_404(ThresholdSet, pk=pk, tenant=tenant) if pk is not None else None
    rows = threshold_rows(tenant=tenant)
    preview = None
    removing = False
    status = 200
    if request.method == "POST":
        _admin_only(role)
        intent = request.POST.get("intent", "preview")
        note = request.POST.get("note", "").strip()
        if intent == "delete" and row is not None and note:
            threshold_set_delete(tenant=tenant, user=request.user, row=row, note=note[:2000])
            messages.success(
                request, f"Removed the {scope_label(row)} overrides: the inherited values apply."
            )
            return redirect("thresholds:tenant", slug=tenant.slug)
        form = ThresholdSetForm(request.POST, tenant=tenant, row=row)
        if intent == "delete" and row is not None:
            # Like saving: a removal says why (the history keeps it) and is shown with its preview.
            form.is_valid()
            form.add_error("note", "note: required to remove overrides — say why (the history keeps it).")
            status = 400
        if intent in ("preview_delete", "delete") and row is not None:
            try:
                limit = form.fields["preview_runs"].clean(request.POST.get("preview_runs") or PREVIEW_RUNS)
            except ValidationError:
                limit = PREVIEW_RUNS  # the form beside it names the bad value
            preview = _threshold_preview(
                tenant, rows, row, scope=(row.backend, row.model, row.task_type), values=None, limit=limit
            )
            removing = True
        elif form.is_valid():
            data = form.cleaned_data
            if intent == "save":
                saved = threshold_set_save(
                    tenant=tenant,
                    user=request.user,
                    row=row,
                    backend=data["backend"] if row is None else row.backend,
                    model=data["model"] if row is None else row.model,
                    task_type=data["task_type"] if row is None else row.task_type,
                    values=form.values(),
                    note=data["note"],
                )
                messages.success(request, f"Saved the {scope_label(saved)} thresholds of {tenant.slug}.")
                # Back to the effective values of the scope just changed.
                query = urlencode(
                    {"backend": saved.backend, "model": saved.model, "task_type": saved.task_type}
                )
                return redirect(f"{reverse('thresholds:tenant', kwargs={'slug': tenant.slug})}?{query}")
            preview = _threshold_preview(
                tenant,
                rows,
                row,
                scope=(row.backend, row.model, row.task_type)
                if row
                else (data["backend"], data["model"], data["task_type"]),
                values=form.values(),
                limit=data["preview_runs"],
            )
        else:
            status = 400
        scope = (row.backend, row.model, row.task_type) if row else _scope(request.POST)
    else:
        scope = (row.backend, row.model, row.task_type) if row else _scope(request.GET)
        initial: dict[str, Any] = {"preview_runs": PREVIEW_RUNS}
        if row is not None:
            initial.update({"backend": row.backend, "model": row.model, "task_type": row.task_type})
            for name, value in row.values.items():
                initial[name] = ("true" if value else "false") if isinstance(value, bool) else value
        else:
            initial.update(dict(zip(("backend", "model", "task_type"), scope, strict=True)))
        form = ThresholdSetForm(initial=initial, tenant=tenant, row=row, read_only=role != ADMIN)
    inherited = thresholds_resolve(
        rows,
        backend=scope[0],
        model=scope[1],
        task_type=scope[2],
        overrides={row.pk: None} if row else None,
        verdicts=tenant_verdicts(tenant=tenant),
    )
    hints = {
        name: {"value": getattr(inherited.thresholds, name), "source": inherited.sources[name]}
        for name in (*BACKEND_FIELDS, *TASK_FIELDS, *MODE_FIELDS)
    }
    return render(
        request,
        "dashboards/thresholds/edit.html",
        {
            "tenant": tenant,
            "row": row,
            "is_admin": role == ADMIN,
            "role": role,
            "form": form,
            "errors": named_errors(form) if form.is_bound else [],
            "hints": hints,
            "groups": [
                (title, help_text, [(form[name], hints[name]) for name in names])
                for title, help_text, names in (
                    ("Per backend and model", "how calls repeat and how windows count", BACKEND_FIELDS),
                    ("Per task type", "budgets and no-progress K", TASK_FIELDS),
                    (
                        "Rollout modes",
                        "per detection kind: shadow records what it would have done, correct-only "
                        "gives hints but never hands off or stops, full escalates",
                        MODE_FIELDS,
                    ),
                )
            ],
            "scope_label": scope_label(backend=scope[0], model=scope[1], task_type=scope[2]),
            "scope_choices": _scope_choices(tenant),
            "preview": preview,
            "removing": removing,
        },
        status=status,
    )


def _tool_preview(tenant, row, form: ToolConfigForm) -> Preview:
    name = form.cleaned_data["name"] if row is None else row.name
    rows = threshold_rows(tenant=tenant)
    tool_list = tool_rows(tenant=tenant)
    current_tools = tool_specs(tool_list)
    proposed_tools = tool_specs(tool_list, replace={name: form.spec()})
    runs = Run.objects.filter(
        tenant=tenant, pk__in=Run.objects.filter(tenant=tenant, calls__tool=name).values("pk")
    )
    verdicts = tenant_verdicts(tenant=tenant)
    cache: dict[tuple, Any] = {}

    def resolve(tools, run: Run):
        key = (id(tools), run.backend, run.model, run.task_type)
        if key not in cache:
            cache[key] = config_resolve(
                rows, tools, backend=run.backend, model=run.model, task_type=run.task_type, verdicts=verdicts
            )
        return cache[key]

    return preview_replay(
        runs=runs,
        limit=form.cleaned_data["preview_runs"],
        current=lambda run: resolve(current_tools, run),
        proposed=lambda run: resolve(proposed_tools, run),
        budget_s=settings.LOOPWATCH_PREVIEW_BUDGET_MS / 1000,
    )


@login_required
@require_http_methods(["GET", "POST"])
def tool_edit(request, slug: str, pk: int | None = None):
    tenant, role = _tenant(request, slug)
    row = get_object_or_404(ToolConfig, pk=pk, tenant=tenant) if pk is not None else None
    preview = None
    status = 200
    if request.method == "POST":
        _admin_only(role)
        intent = request.POST.get("intent", "preview")
        if intent == "delete" and row is not None:
            tool_config_delete(tenant=tenant, user=request.user, row=row, note=request.POST.get("note", ""))
            messages.success(request, f"Removed {tenant.slug}'s description of {row.name}.")
            return redirect("thresholds:tenant", slug=tenant.slug)
        form = ToolConfigForm(request.POST, tenant=tenant, row=row)
        if form.is_valid():
            data = form.cleaned_data
            if intent == "save":
                saved = tool_config_save(
                    tenant=tenant,
                    user=request.user,
                    row=row,
                    name=data["name"] if row is None else row.name,
                    fields={
                        k: data[k] for k in ("kind", "core_args", "noise_args", "cursor_args", "casefold")
                    },
                    note=data["note"],
                )
                messages.success(request, f"Saved {tenant.slug}'s description of {saved.name}.")
                return redirect("thresholds:tenant", slug=tenant.slug)
            preview = _tool_preview(tenant, row, form)
        else:
            status = 400
    else:
        source = row
        if row is None and request.GET.get("name"):
            # "Override" of a shared description: start from it.
            source = ToolConfig.objects.filter(tenant__isnull=True, name=request.GET["name"]).first()
        initial: dict[str, Any] = {"preview_runs": PREVIEW_RUNS, "name": request.GET.get("name", "")}
        if source is not None:
            initial.update(
                name=source.name,
                kind=source.kind,
                core_args=", ".join(source.core_args),
                noise_args=", ".join(source.noise_args),
                cursor_args=", ".join(source.cursor_args),
                casefold=source.casefold,
            )
        form = ToolConfigForm(initial=initial, tenant=tenant, row=row, read_only=role != ADMIN)
    name = row.name if row else (form.data.get("name") if form.is_bound else form.initial.get("name", ""))
    shared = ToolConfig.objects.filter(tenant__isnull=True, name=name).first() if name else None
    return render(
        request,
        "dashboards/thresholds/tool.html",
        {
            "tenant": tenant,
            "row": row,
            "is_admin": role == ADMIN,
            "role": role,
            "form": form,
            "errors": named_errors(form) if form.is_bound else [],
            "shared": shared,
            "reconciler": reconcilers_by_tool(tenant=tenant, names=[name]).get(name) if name else None,
            "preview": preview,
        },
        status=status,
    )


@login_required
def history(request, slug: str):
    tenant, _ = _tenant(request, slug)
    return render(
        request,
        "dashboards/thresholds/history.html",
        {"tenant": tenant, "changes": _changes(tenant, HISTORY_PAGE), "limit": HISTORY_PAGE},
    )
