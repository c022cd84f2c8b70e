"""The runs pages: search and recent runs; one run's detail with its timeline, where a person
answers a run that waits for one."""

from __future__ import annotations

from typing import Any

import orjson
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from dashboards.alerts.selectors import incident_detail, user_tenant_ids
from dashboards.alerts.services import NOTE_MAX_CHARS
from dashboards.models import OPERATOR_ROLES
from dashboards.queue.forms import named_errors
from dashboards.queue.selectors import membership_role
from dashboards.runs.forms import ANSWERS, HandoffAnswerForm
from dashboards.runs.selectors import (
    LONG_VALUE_CHARS,
    RUN_STATUSES,
    TIMELINE_EVENTS,
    run_budget_use,
    run_detection_failure,
    run_detections,
    run_for_user,
    run_handoff_view,
    run_operations,
    run_recent,
    run_search,
    run_timeline,
    timeline_start_for,
)
from dashboards.runs.services import HandoffNotWaiting, run_handoff_answer
from ingest.models import Detection, Incident, Run
from ingest.selectors import detection_config

MAX_PAGE = 10_000


class BadParameter(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


def _bad_request(request: HttpRequest, exc: BadParameter) -> HttpResponse:
    return render(request, "dashboards/runs/error.html", {"field": exc.field, "detail": str(exc)}, status=400)


def _int(params, name: str, *, default: int | None, low: int = 1, high: int = 2**31 - 1) -> int | None:
    raw = params.get(name, "")
    if raw == "":
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise BadParameter(name, f"must be a whole number from {low} to {high}")
    return int(raw)


def _handoff_items(handoff: Any) -> list[tuple[str, str, bool]]:
    """(name, text, shown as a block) for each part of Run.handoff (free-form JSON)."""
    if not handoff:
        return []
    parts = handoff.items() if isinstance(handoff, dict) else [("handoff", handoff)]
    out = []
    for name, value in parts:
        if name == "resolved":  # shown as the answer, above the summary
            continue
        if isinstance(value, dict | list):
            out.append((str(name), orjson.dumps(value, option=orjson.OPT_INDENT_2).decode(), True))
        else:
            out.append((str(name), str(value), False))
    return out


def _run_incidents(*, run: Run, can_mark: bool) -> list[dict[str, Any]]:
    """The run's incidents, each with what reached the agent and a verdict form for operators."""
    rows = []
    for found in Incident.objects.filter(run=run).select_related("run", "verdict_by").order_by("pk"):
        detail = incident_detail(incident=found)
        verdict = detail["verdict"]
        rows.append(
            {
                **detail,
                "can_mark": can_mark,
                "verdict_label": Detection.Feedback(verdict).label if verdict else "",
                "path": " → ".join(dict.fromkeys(s["shadow"] or s["action"] for s in detail["steps"])),
            }
        )
    return rows


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    tenant_ids = user_tenant_ids(user=request.user)
    q = request.GET.get("q", "").strip()
    status = request.GET.get("status", "")
    flagged = request.GET.get("flagged", "") in ("1", "on", "true")
    detection = request.GET.get("detection", "")
    try:
        if len(q) > 200:
            raise BadParameter("q", "a run_id has at most 200 characters")
        if status and status not in RUN_STATUSES:
            raise BadParameter("status", f"one of {', '.join(RUN_STATUSES)}")
        if detection not in ("", "failed"):
            raise BadParameter("detection", "failed, or leave it out")
        page = _int(request.GET, "page", default=1, high=MAX_PAGE) or 1
    except BadParameter as exc:
        return _bad_request(request, exc)
    context: dict = {
        "q": q,
        "status": status,
        "flagged": flagged,
        "detection_failed": detection == "failed",
        "statuses": RUN_STATUSES,
    }
    if q:
        exact, prefix, cut = run_search(tenant_ids=tenant_ids, q=q)
        if len(exact) == 1 and not prefix:
            return redirect("runs:detail", pk=exact[0].pk)
        context.update(exact=exact, prefix=prefix, prefix_cut=cut, searched=True)
    else:
        runs, more = run_recent(
            tenant_ids=tenant_ids,
            status=status,
            flagged=flagged,
            detection_failed=detection == "failed",
            page=page,
        )
        context.update(runs=runs, page=page, more=more)
    context["multi_tenant"] = len(tenant_ids) > 1
    return render(request, "dashboards/runs/index.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = run_for_user(user=request.user, pk=pk)
    if run is None:
        raise Http404("no such run")
    role = membership_role(user=request.user, tenant_id=run.tenant_id)
    can_answer = role in OPERATOR_ROLES
    form = None
    status = 200
    if request.method == "POST":
        if not can_answer:
            raise PermissionDenied("operators and admins answer a run waiting for a person")
        form = HandoffAnswerForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                answered = run_handoff_answer(
                    run=run,
                    user=request.user,
                    resume=data["answer"] == "resume",
                    note=data["note"],
                    shown_at=data["shown_at"],
                )
            except HandoffNotWaiting as exc:
                messages.warning(request, f"Nothing done: {exc}.")
            else:
                messages.success(request, answered.message)
            return redirect("runs:detail", pk=run.pk)
        status = 400
    try:
        seq = _int(request.GET, "seq", default=None)
        start = _int(request.GET, "from", default=None)
    except BadParameter as exc:
        return _bad_request(request, exc)
    if start is None:
        start = timeline_start_for(seq) if seq else 1
    config = detection_config(run=run)
    timeline = run_timeline(run=run, config=config, start=start)
    return render(
        request,
        "dashboards/runs/detail.html",
        {
            "run": run,
            # Pairs, not run.labels.items in the template: a label named "items" (or "keys") would be
            # looked up first, and its string iterated.
            "labels": sorted(run.labels.items()) if isinstance(run.labels, dict) else [],
            "detection_failed": run_detection_failure(run=run),
            "timeline": timeline,
            "budgets": run_budget_use(run=run, config=config),
            "operations": run_operations(run=run),
            "detections": run_detections(run=run),
            "incidents": _run_incidents(run=run, can_mark=can_answer),
            "note_max": NOTE_MAX_CHARS,
            "page_size": TIMELINE_EVENTS,
            "long": LONG_VALUE_CHARS,
            "handoff_items": _handoff_items(run.handoff),
            "handoff": run_handoff_view(run.handoff),
            "waiting": run.status == Run.Status.WAITING,
            "role": role,
            "can_answer": can_answer,
            "form": form,
            "errors": named_errors(form) if form is not None else [],
            "answers": [(key, label, what) for key, (label, what) in ANSWERS.items()],
        },
        status=status,
    )
