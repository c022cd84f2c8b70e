"""The operator queue: runs waiting for a person and open writes of the user's tenants, and the
decisions on the writes (a run is answered on its own page, dashboards.runs.views.detail)."""

from __future__ import annotations

import orjson
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from dashboards.models import OPERATOR_ROLES
from dashboards.queue.forms import ACTIONS, DecisionForm, named_errors
from dashboards.queue.selectors import (
    QUEUE_LIMIT,
    QueueFilters,
    membership_role,
    needs_person_q,
    open_since,
    operation_is_open,
    operation_reconciler,
    queue_operation_get,
    queue_operations,
    queue_tools,
    queue_waiting_runs,
    reconcile_schedule,
    user_tenants_with_roles,
)
from dashboards.queue.services import queue_decide
from dashboards.runs.selectors import run_handoff_view
from ingest.ledger import AlreadyResolved, TransitionRefused

# The list reloads itself so that a reconciled write leaves it; never the detail page (a note being typed).
QUEUE_REFRESH_S = 30


def _pretty(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


@login_required
def index(request):
    filters = QueueFilters(
        needs_person=request.GET.get("needs_person") == "1",
        tool=request.GET.get("tool", "").strip(),
        tenant=request.GET.get("tenant", "").strip(),
        q=request.GET.get("q", "").strip()[:200],
    )
    now = timezone.now()
    qs = queue_operations(user=request.user, filters=filters, now=now)
    total = qs.count()
    needs_person = total if filters.needs_person else qs.filter(needs_person_q()).count()
    rows = [
        {
            "op": op,
            "since": open_since(op),
            "args": orjson.dumps(op.args, option=orjson.OPT_SORT_KEYS).decode(),
            "person": op.needs_person or not op.reconciler_exists,
            "schedule": reconcile_schedule(op, now, reconciler=op.reconciler_exists),
        }
        for op in qs[:QUEUE_LIMIT]
    ]
    waiting_qs = queue_waiting_runs(user=request.user, filters=filters)
    waiting_total = waiting_qs.count()
    waiting = [(run, run_handoff_view(run.handoff)) for run in waiting_qs[:QUEUE_LIMIT]]
    return render(
        request,
        "dashboards/queue/index.html",
        {
            "rows": rows,
            "total": total,
            "waiting": waiting,
            "waiting_total": waiting_total,
            "needs_person": needs_person,
            "refresh": QUEUE_REFRESH_S,
            "limit": QUEUE_LIMIT,
            "filters": filters,
            "tools": queue_tools(user=request.user, now=now),
            "tenants": user_tenants_with_roles(user=request.user),
            "now": now,
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def detail(request, pk: int):
    op = queue_operation_get(user=request.user, pk=pk)
    if op is None:
        raise Http404("no such operation")
    role = membership_role(user=request.user, tenant_id=op.tenant_id)
    can_decide = role in OPERATOR_ROLES
    reconciler = operation_reconciler(op=op)
    form = None
    status = 200
    if request.method == "POST":
        if not can_decide:
            raise PermissionDenied("operators and admins decide on operations")
        form = DecisionForm(request.POST, reconciler=reconciler is not None, tool=op.tool)
        if form.is_valid():
            data = form.cleaned_data
            try:
                decided = queue_decide(
                    operation=op,
                    user=request.user,
                    action=data["action"],
                    note=data["note"],
                    shown_status=data["shown_status"],
                    external_reference=data["external_reference"],
                )
            except AlreadyResolved as exc:
                messages.warning(request, f"Nothing done: {op.operation_key} was {exc}.")
            except TransitionRefused as exc:
                messages.error(request, f"Nothing done: {exc}.")
            else:
                messages.success(request, decided.message)
            return redirect("queue:detail", pk=op.pk)
        status = 400
    now = timezone.now()
    history = [
        (t, orjson.dumps(t.evidence, option=orjson.OPT_SORT_KEYS).decode() if t.evidence else "")
        for t in op.history.order_by("pk")
    ]
    references = [t for t, _ in history if t.operator_reference]
    next_open = (
        queue_operations(user=request.user, filters=QueueFilters(), now=now).exclude(pk=op.pk).first()
        if not operation_is_open(op, now)
        else None
    )
    return render(
        request,
        "dashboards/queue/detail.html",
        {
            "op": op,
            "open": operation_is_open(op, now),
            "lease_live": op.status == "RUNNING" and not operation_is_open(op, now),
            "since": open_since(op),
            "now": now,
            "role": role,
            "can_decide": can_decide,
            "form": form,
            "errors": named_errors(form) if form is not None else [],
            "failed_action": form.data.get("action") if form is not None else "",
            # Asking the downstream needs a reconciler: not offered without one.
            "actions": [
                (key, label) for key, (label, _) in ACTIONS.items() if key != "reconcile" or reconciler
            ],
            "operator_reference": references[-1] if references else None,
            "needs_person": op.needs_person or reconciler is None,
            "schedule": reconcile_schedule(op, now, reconciler=reconciler is not None),
            "history": history,
            "args_json": _pretty(op.args),
            "last_reconcile_json": _pretty(op.last_reconcile) if op.last_reconcile else "",
            "result_json": op.result_json,
            "error_json": _pretty(op.error) if op.error is not None else "",
            "reconciler": reconciler,
            "next_open": next_open,
        },
        status=status,
    )
