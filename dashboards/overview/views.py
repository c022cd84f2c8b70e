"""The overview page: loops, budgets, long tails, cost, the ledger's UNKNOWN writes, feedback."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from dashboards.overview import charts
from dashboards.overview.filters import (
    METRICS,
    RANGES,
    BadParameter,
    FilterOptions,
    OverviewFilters,
    filters_parse,
)
from dashboards.overview.plotlyjs import plotlyjs_version
from dashboards.overview.selectors import (
    REPEAT_KINDS,
    buckets,
    coverage,
    detection_rows,
    filter_options,
    last_run_started,
    latest_runs,
    page_reads,
    run_figures,
    settings_changes,
    tail_histograms,
    tail_runs,
    unknown_operations,
)
from dashboards.selectors import user_tenants

CACHED_CHOICES = {"backend", "model", "task_type", "agent", "bin_task"}
REFRESH_S = 45  # the page redraws itself (static/js/overview.js): a minute-old overview is still news
OPTIONS_MAX = 200  # values of a filter offered as a menu; past that the filter is typed
# At most LOOPWATCH_OVERVIEW_RENDERS renders at once in a process (issue 11: eight heavy loads starved
# uvicorn's health ping); the next waits RENDER_WAIT_S, then is told to come back.
RENDERS = threading.BoundedSemaphore(settings.LOOPWATCH_OVERVIEW_RENDERS)
RENDER_WAIT_S = 10.0
RETRY_AFTER_S = 5


def _parse(request: HttpRequest, now: datetime) -> tuple[OverviewFilters, FilterOptions, dict[str, int]]:
    tenants = dict(user_tenants(user=request.user).order_by("slug").values_list("slug", "pk"))
    ids = tuple(tenants.values())
    options = replace(filter_options(tenant_ids=ids), tenants=tuple(tenants))
    try:
        return filters_parse(params=request.GET, tenants=tenants, options=options, now=now), options, tenants
    except BadParameter as exc:
        if exc.name not in CACHED_CHOICES:
            raise
    # A value newer than the cached options (a backend that appeared this minute) is not a mistake.
    options = replace(filter_options(tenant_ids=ids, fresh=True), tenants=tuple(tenants))
    return filters_parse(params=request.GET, tenants=tenants, options=options, now=now), options, tenants


def _bad_request(request: HttpRequest, exc: BadParameter, *, fragment: bool = False) -> HttpResponse:
    if fragment:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    context = {"field": exc.name, "detail": str(exc)}
    return render(request, "dashboards/overview/error.html", context, status=400)


def _busy(request: HttpRequest) -> HttpResponse:
    detail = (
        f"The overview is being drawn for {settings.LOOPWATCH_OVERVIEW_RENDERS} other requests of this "
        f"server process; it reloads in {RETRY_AFTER_S} s."
    )
    response = render(request, "error.html", {"title": "Busy", "detail": detail}, status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    response["Refresh"] = str(RETRY_AFTER_S)
    return response


@login_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    try:
        f, options, tenants = _parse(request, now)
    except BadParameter as exc:
        return _bad_request(request, exc)
    context: dict = {
        "f": f,
        "options": options,
        "tenants": list(tenants),
        "ranges": list(RANGES),
        "metrics": METRICS,
        "metric_label": METRICS[f.metric],
        "plotly_src": reverse("plotlyjs", args=[plotlyjs_version()]),
        "tail_url": reverse("overview-tail"),
        "figures": {},
        "refresh_s": REFRESH_S,
        "options_max": OPTIONS_MAX,
        "max_facets": charts.MAX_FACETS,
        "now": now,
    }
    if not options.task_types:  # no run at all in the user's tenants; writes claimed through the API may be
        context["unknown"] = unknown_operations(f=f, now=now) if tenants else None
        return render(request, "dashboards/overview/index.html", context)
    if not RENDERS.acquire(timeout=RENDER_WAIT_S):
        return _busy(request)
    try:
        with page_reads():
            _figures(f, context, now)
    finally:
        RENDERS.release()
    context["figure_scripts"] = [(f"fig-{name}", figure) for name, figure in context["figures"].items()]
    return render(request, "dashboards/overview/index.html", context)


def _figures(f: OverviewFilters, context: dict, now: datetime) -> None:
    figures = context["figures"]
    time_axis = buckets(f=f)
    cover = coverage(f=f)
    runs = run_figures(f=f, cover=cover)
    totals = runs["totals"]
    by_backend = charts.backends_bounded(runs["by_backend"])
    changes = settings_changes(f=f)
    context.update(totals=totals, by_backend=by_backend, changes=changes)
    if not totals["runs"]:
        context["last_started"] = last_run_started(f=f)
    else:
        figures["cost_success"], figures["cost_burned"] = charts.cost_charts(by_backend)
        budget_type, budget_task = charts.budget_share_charts(runs["budget_rows"], time_axis)
        figures["budget_type"] = charts.with_change_marks(budget_type, changes)
        figures["budget_task"] = charts.with_change_marks(budget_task, changes)
        histograms = tail_histograms(f=f, cover=cover)
        context["tail_table"] = charts.tail_table(histograms)
        if histograms[f.metric]:
            figures["tail"] = charts.long_tail_chart(
                histograms[f.metric],
                metric_label=METRICS[f.metric],
                selected=f.bin.task_type if f.bin else f.task_type,
            )
        context["latest"] = latest_runs(f=f)
        totals["per_success"] = totals["cost"] / totals["succeeded"] if totals["succeeded"] else None
        totals["budget_share"] = 100 * totals["budget"] / totals["finished"] if totals["finished"] else None
    detections = detection_rows(f=f, cover=cover)
    found = detections["totals"]
    context["detections"] = sum(r["n"] for r in found)
    context["interventions"] = sum(r["n"] for r in found if r["action"] != "observe")
    if context["interventions"]:
        figures["loops"] = charts.with_change_marks(
            charts.loop_events_chart(detections["series"], time_axis, f.step), changes
        )
    context["action_table"] = charts.action_table(found)
    if any(r["kind"] in REPEAT_KINDS for r in found):
        figures["repeats"] = charts.repeat_triggers_chart(
            found, by_backend, REPEAT_KINDS, window=(f.start, f.end)
        )
    figures["false_alarms"], context["feedback_table"], context["feedback"] = charts.false_alarm_figures(
        found
    )
    if not context["feedback"]["reviewed"]:
        del figures["false_alarms"]
    unknown = unknown_operations(f=f, now=now)
    context["unknown"] = unknown
    if unknown["open"]:
        figures["unknown_ages"] = charts.unknown_age_chart(unknown["ages"])
    if f.bin is not None:
        context["tail_runs"], context["tail_total"] = tail_runs(f=f)


@login_required
@require_GET
def tail(request: HttpRequest) -> HttpResponse:
    """The runs behind one bar of the long-tail chart (an HTML fragment the page inserts)."""
    try:
        f, _, _ = _parse(request, timezone.now())
        if f.bin is None:
            raise BadParameter("bin_task", "required: the task type of the bar")
    except BadParameter as exc:
        return _bad_request(request, exc, fragment=True)
    listed, total = tail_runs(f=f)
    context = {"f": f, "tail_runs": listed, "tail_total": total, "metric_label": METRICS[f.metric]}
    return render(request, "dashboards/overview/_tail_runs.html", context)
