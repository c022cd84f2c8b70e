"""The live alerts page (incidents), an incident, and verdicts (true loop / false alarm) on incidents
and, for integrations scripted against it, on single alerts."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from dashboards.alerts.selectors import (
    ALERT_KINDS,
    RANGES,
    AlertFilterError,
    IncidentFilters,
    backends_seen,
    detection_for_user,
    feedback_tenant_ids,
    incident_detail,
    incident_for_user,
    incident_list,
    latest_alert_id,
    user_tenant_ids,
)
from dashboards.alerts.services import (
    CLEAR,
    NOTE_MAX_CHARS,
    detection_feedback_set,
    feedback_payload,
    incident_verdict_payload,
    incident_verdict_set,
)
from dashboards.selectors import user_tenants
from ingest.models import Detection, Incident

# A kind in shadow: what it would have done, as the row says it (static/js/alerts.js says the same).
SHADOW_LABELS = {
    "correct": "would have corrected",
    "handoff": "would have handed off",
    "terminate": "would have terminated",
}


def _bad_request(request: HttpRequest, field: str, detail: str, *, as_json: bool) -> HttpResponse:
    if as_json:
        return JsonResponse({"error": "invalid", "field": field, "detail": detail}, status=400)
    return render(request, "dashboards/alerts/error.html", {"field": field, "detail": detail}, status=400)


ROW_WHEN = 19  # "YYYY-MM-DD HH:MM:SS" of an ISO time


def _when(value: str) -> str:
    return value[:ROW_WHEN].replace("T", " ")


def _incident_row(
    incident: dict[str, Any], *, tenants: dict[int, str], can_mark: list[int]
) -> dict[str, Any]:
    """An incident as the row template shows it (the page's script fills the same fields live)."""
    verdict = incident.get("verdict", "")
    return {
        **incident,
        "first_when": _when(incident["first_seen"]),
        "last_when": _when(incident["last_seen"]),
        "tenant": tenants.get(incident["tenant_id"], ""),
        "can_mark": incident["tenant_id"] in can_mark,
        "verdict_label": Detection.Feedback(verdict).label if verdict else "",
        "shadow_label": SHADOW_LABELS.get(incident.get("shadow", ""), ""),
        "path": " → ".join(dict.fromkeys(s["shadow"] or s["action"] for s in incident.get("steps", []))),
        "last_step": (incident.get("steps") or [{}])[-1],
    }


def _before(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise AlertFilterError("before", "must be an incident id (a whole number)")
    return int(raw)


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """Incidents of the user's tenants, newest first, live; older ones a page at a time."""
    try:
        filters = IncidentFilters.parse(request.GET)
        before = _before(request.GET.get("before"))
    except AlertFilterError as exc:
        return _bad_request(request, exc.field, str(exc), as_json=False)
    tenant_ids = user_tenant_ids(user=request.user)
    tenants = {t.pk: t.slug for t in user_tenants(user=request.user)}
    # The socket's starting point is read before the list: an alert committed in between comes
    # twice (the page keeps one row per incident), never not at all.
    after = latest_alert_id(tenant_ids=tenant_ids)
    incidents, more = incident_list(tenant_ids=tenant_ids, filters=filters, before=before, now=timezone.now())
    can_mark = feedback_tenant_ids(user=request.user)
    rows = [_incident_row(i, tenants=tenants, can_mark=can_mark) for i in incidents]
    older = {**filters.as_query(), "before": str(incidents[-1]["id"])} if more else None
    return render(
        request,
        "dashboards/alerts/index.html",
        {
            "incidents": rows,
            "blank_incident": {"id": 0, "can_mark": True, "steps": []},
            "filters": filters,
            "filter_query": filters.as_query(),
            "kinds": ALERT_KINDS,
            "actions": Detection.Action.values,
            "statuses": Incident.Status.choices,
            "ranges": RANGES,
            "backends": sorted(set(backends_seen(tenant_ids=tenant_ids)) | {filters.backend} - {""}),
            "older_query": urlencode(older) if older else "",
            "before": before,
            "page_config": {
                "after": after,
                "live": before is None,
                "query": filters.socket_query(),
                "status": filters.status,
                "can_mark": can_mark,
                "tenants": {str(k): v for k, v in tenants.items()},
                "multi_tenant": len(tenants) > 1,
                "runs_url": reverse("runs:index"),
                "incident_url": reverse("alerts:incident", args=[0]),
                "verdict_url": reverse("alerts:verdict", args=[0]),
            },
            "multi_tenant": len(tenants) > 1,
            "no_tenant": not tenants,
            "note_max": NOTE_MAX_CHARS,
        },
    )


@login_required
@require_GET
def incident(request: HttpRequest, pk: int) -> HttpResponse:
    """One incident: its steps, what reached the agent, its verdict."""
    found = incident_for_user(user=request.user, pk=pk)
    if found is None:
        raise Http404("no such incident")
    tenants = {t.pk: t.slug for t in user_tenants(user=request.user)}
    can_mark = feedback_tenant_ids(user=request.user)
    detail = incident_detail(incident=found)
    return render(
        request,
        "dashboards/alerts/incident.html",
        {
            "i": _incident_row(detail, tenants=tenants, can_mark=can_mark),
            "deliveries": detail["deliveries"],
            "reached_summary": detail["reached_summary"],
            "note_max": NOTE_MAX_CHARS,
            "multi_tenant": len(tenants) > 1,
        },
    )


@login_required
@require_POST
def verdict(request: HttpRequest, pk: int) -> HttpResponse:
    """The verdict on an incident (true loop / false alarm / clear), with a note. The form names the
    incident it was shown (`incident`): one sent for another incident than the row's is refused (409)."""
    as_json = "application/json" in request.headers.get("Accept", "")
    found = incident_for_user(user=request.user, pk=pk)
    if found is None:
        if as_json:
            return JsonResponse({"error": "not_found", "detail": "no such incident"}, status=404)
        raise Http404("no such incident")
    if found.tenant_id not in feedback_tenant_ids(user=request.user):
        detail = "giving verdicts needs the operator or admin role in this tenant"
        if as_json:
            return JsonResponse({"error": "forbidden", "detail": detail}, status=403)
        return HttpResponse(detail, status=403, content_type="text/plain; charset=utf-8")
    named = request.POST.get("incident", "")
    if not named:
        return _bad_request(
            request, "incident", "incident: the id of the incident shown is required", as_json=as_json
        )
    if named != str(found.pk):
        detail = (
            f"incident: this verdict names incident {named[:20]!r}, but was sent for incident {found.pk}: "
            "nothing was changed; reload the page"
        )
        if as_json:
            return JsonResponse({"error": "mismatch", "field": "incident", "detail": detail}, status=409)
        return HttpResponse(detail, status=409, content_type="text/plain; charset=utf-8")
    choice = request.POST.get("verdict", "")
    if choice not in (*Detection.Feedback.values, CLEAR):
        choices = ", ".join((*Detection.Feedback.values, CLEAR))
        return _bad_request(request, "verdict", f"verdict: must be one of {choices}", as_json=as_json)
    note = request.POST.get("note", "")
    if len(note) > NOTE_MAX_CHARS:
        return _bad_request(request, "note", f"note: at most {NOTE_MAX_CHARS} characters", as_json=as_json)
    found = incident_verdict_set(incident=found, user=request.user, verdict=choice, note=note)
    label = Detection.Feedback(choice).label if choice != CLEAR else "verdict taken back"
    said = f"Incident {found.pk} ({found.kind} on {found.run.run_id}): {label}."
    if as_json:
        return JsonResponse({**incident_verdict_payload(found), "message": said})
    messages.success(request, said)
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        target = reverse("alerts:index")
    return redirect(target)


@login_required
@require_POST
def feedback(request: HttpRequest, pk: int) -> HttpResponse:
    """Mark an alert a true loop or a false alarm, with a note. Operators and admins of its tenant."""
    as_json = "application/json" in request.headers.get("Accept", "")
    detection = detection_for_user(user=request.user, pk=pk)
    if detection is None:
        if as_json:
            return JsonResponse({"error": "not_found", "detail": "no such alert"}, status=404)
        raise Http404("no such alert")
    if detection.tenant_id not in feedback_tenant_ids(user=request.user):
        detail = "marking alerts needs the operator or admin role in this tenant"
        if as_json:
            return JsonResponse({"error": "forbidden", "detail": detail}, status=403)
        return HttpResponse(detail, status=403, content_type="text/plain; charset=utf-8")
    verdict = request.POST.get("verdict", "")
    if verdict not in (*Detection.Feedback.values, CLEAR):
        choices = ", ".join((*Detection.Feedback.values, CLEAR))
        return _bad_request(request, "verdict", f"verdict: must be one of {choices}", as_json=as_json)
    note = request.POST.get("note", "")
    if len(note) > NOTE_MAX_CHARS:
        return _bad_request(request, "note", f"note: at most {NOTE_MAX_CHARS} characters", as_json=as_json)
    detection = detection_feedback_set(detection=detection, user=request.user, verdict=verdict, note=note)
    if as_json:
        return JsonResponse(feedback_payload(detection))
    label = Detection.Feedback(verdict).label if verdict != CLEAR else "unmarked"
    messages.success(request, f"Alert {detection.pk} ({detection.kind} on {detection.run.run_id}): {label}.")
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        target = reverse("alerts:index")
    return redirect(target)
