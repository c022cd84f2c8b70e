"""The live alerts page and the verdict on an alert (true loop / false alarm)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from dashboards.alerts.selectors import (
    ALERT_KINDS,
    Alert,
    AlertFilterError,
    AlertFilters,
    alert_list,
    backends_seen,
    detection_for_user,
    feedback_tenant_ids,
    latest_alert_id,
    user_tenant_ids,
)
from dashboards.alerts.services import CLEAR, NOTE_MAX_CHARS, detection_feedback_set, feedback_payload
from dashboards.selectors import user_tenants
from ingest.models import Detection

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


def _row(alert: Alert, *, tenants: dict[int, str], can_mark: list[int]) -> dict[str, Any]:
    """An alert as the row template shows it (the page's script fills the same fields live)."""
    feedback = alert.get("feedback", "")
    return {
        **alert,
        "when": alert["ts"][:19].replace("T", " "),
        "tenant": tenants.get(alert["tenant_id"], ""),
        "can_mark": alert["tenant_id"] in can_mark,
        "feedback_label": Detection.Feedback(feedback).label if feedback else "",
        "shadow_label": SHADOW_LABELS.get(alert.get("shadow", ""), ""),
    }


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    try:
        filters = AlertFilters.parse(request.GET)
    except AlertFilterError as exc:
        return _bad_request(request, exc.field, str(exc), as_json=False)
    tenant_ids = user_tenant_ids(user=request.user)
    tenants = {t.pk: t.slug for t in user_tenants(user=request.user)}
    # The socket's starting point is read before the list: one committed in between comes twice
    # (the page keeps one per id), never not at all.
    after = latest_alert_id(tenant_ids=tenant_ids)
    alerts = alert_list(tenant_ids=tenant_ids, filters=filters)
    can_mark = feedback_tenant_ids(user=request.user)
    rows = [_row(alert, tenants=tenants, can_mark=can_mark) for alert in alerts]
    return render(
        request,
        "dashboards/alerts/index.html",
        {
            "alerts": rows,
            "blank_alert": {"id": 0, "can_mark": True},
            "filters": filters,
            "filter_query": filters.as_query(),
            "kinds": ALERT_KINDS,
            "actions": Detection.Action.values,
            "backends": sorted(set(backends_seen(tenant_ids=tenant_ids)) | {filters.backend} - {""}),
            "page_config": {
                "after": after,
                "query": filters.as_query(),
                "can_mark": can_mark,
                "tenants": {str(k): v for k, v in tenants.items()},
                "multi_tenant": len(tenants) > 1,
                "runs_url": reverse("runs:index"),
                "feedback_url": reverse("alerts:feedback", args=[0]),
            },
            "multi_tenant": len(tenants) > 1,
            "no_tenant": not tenants,
            "note_max": NOTE_MAX_CHARS,
        },
    )


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
