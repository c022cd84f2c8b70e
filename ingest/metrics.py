"""Prometheus metrics: ingest, detection, the guard, the ledger, rate limits (docs/metrics.md).

With several processes (uvicorn --workers, Celery), set PROMETHEUS_MULTIPROC_DIR to a shared empty
folder: prometheus-client then adds up every process's figures at /metrics. Figures read from the
database or Redis when scraped (detection lag, ledger states) are gauges of a collector of their
own (LiveCollector), asked by the process that answers the scrape: no process keeps them.

Labels are bounded: every label value is a series in every process and in every scrape, and tool
names come from tenants' traces. A tool is labelled by name while the process has seen fewer than
LOOPWATCH_METRICS_MAX_TOOLS names, at most a fifth of them from one tenant, and as OTHER past
that; every label whose values come from traffic goes through a BoundedLabel too. A tenant is
labelled by its slug only when LOOPWATCH_METRICS_TENANTS names it, the others as OTHER: the set is
the operator's, the same in every process (a first-come bound would label a tenant in one process
and not in another, and its figures would not add up), and a tenant's own figures are on its pages.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import UTC

from django.conf import settings
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

from ingest.detection.policy import ACTIONS as POLICY_ACTIONS

OTHER = "other"  # the label value of everything past the bound

logger = logging.getLogger(__name__)


class BoundedLabel:
    """Values of one label, first come first labelled: at most `limit()` distinct ones per process,
    at most a fifth of them (at least one) brought by one tenant; the rest are OTHER."""

    def __init__(self, limit) -> None:
        self._limit = limit
        self._values: set[str] = set()
        self._by_tenant: dict[int, int] = {}
        self._lock = threading.Lock()

    def __call__(self, value: str, *, tenant_id: int) -> str:
        if value in self._values:  # the usual case, without the lock (a set lookup is atomic)
            return value
        limit = self._limit()
        with self._lock:
            if value in self._values:
                return value
            mine = self._by_tenant.get(tenant_id, 0)
            if len(self._values) >= limit or mine >= max(1, limit // 5):
                return OTHER
            self._values.add(value)
            self._by_tenant[tenant_id] = mine + 1
            return value


TOOL = BoundedLabel(lambda: settings.LOOPWATCH_METRICS_MAX_TOOLS)
# The field a refused event was refused on (`args`, `ts`, …): names come from the traces (an unknown
# field is named), so they are bounded like tools.
REASON = BoundedLabel(lambda: MAX_REASONS)
MAX_REASONS = 40
# Notification channels are the notifying code's; bounded anyway, like every label of a new metric.
CHANNEL = BoundedLabel(lambda: 20)


def tenant_label(tenant) -> str:
    """The tenant's slug when LOOPWATCH_METRICS_TENANTS names it, else OTHER."""
    return tenant.slug if tenant.slug in settings.LOOPWATCH_METRICS_TENANTS else OTHER


LABELS = ("tool",)

DEDUPE_HIT = Counter("dedupe_hit_total", "A claim found the operation already known.", LABELS)
PAYLOAD_CONFLICT = Counter("payload_conflict_total", "The same key with other arguments.", LABELS)
LEASE_CONTENTION = Counter("lease_contention_total", "A claim found a live lease of another worker.", LABELS)
UNKNOWN_OUTCOME = Counter("unknown_outcome_total", "Operations whose outcome became UNKNOWN.", LABELS)
COMPENSATION = Counter("compensation_total", "Operations compensated.", LABELS)
RESULT_REUSE_LATENCY = Histogram(
    "result_reuse_latency_seconds",
    "Time to answer a repeat with the stored result.",
    LABELS,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
UNKNOWN_RECONCILE = Histogram(
    "unknown_reconcile_seconds",
    "How long an operation stayed UNKNOWN.",
    LABELS,
    buckets=(1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
)


def _labels(op) -> dict[str, str]:
    return {"tool": TOOL(op.tool, tenant_id=op.tenant_id)}


def dedupe_hit(op) -> None:
    DEDUPE_HIT.labels(**_labels(op)).inc()


def payload_conflict(op) -> None:
    PAYLOAD_CONFLICT.labels(**_labels(op)).inc()


def lease_contention(op) -> None:
    LEASE_CONTENTION.labels(**_labels(op)).inc()


def unknown_outcome(op) -> None:
    UNKNOWN_OUTCOME.labels(**_labels(op)).inc()


def unknown_reconciled(op, seconds: float) -> None:
    UNKNOWN_RECONCILE.labels(**_labels(op)).observe(seconds)


def compensation(op) -> None:
    COMPENSATION.labels(**_labels(op)).inc()


def result_reused(op, seconds: float) -> None:
    RESULT_REUSE_LATENCY.labels(**_labels(op)).observe(seconds)


def exposition() -> tuple[bytes, str]:
    """The metrics text and its content type: every process's counters (multi-process mode) or
    this one's, and the figures read now (LiveCollector)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry) + generate_latest(_live_registry()), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY) + generate_latest(_live_registry()), CONTENT_TYPE_LATEST


def _live_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LIVE)
    return registry


# Not labelled by tenant or run: the runs themselves are listed on the runs page (detection failed).
DETECTION_QUARANTINED = Counter(
    "detection_quarantined_total", "Detection passes that failed on a run, which was quarantined."
)


def detection_quarantined() -> None:
    DETECTION_QUARANTINED.inc()


# --- ingest ----------------------------------------------------------------------------------------
TRANSPORTS = ("rest", "websocket", "otlp")
EVENTS = Counter(
    "loopwatch_events",
    "Events sent, by what became of them: accepted, duplicate, rejected (reason: the field, or "
    "rate_limited, too_large).",
    ("tenant", "outcome", "reason"),
)
INGEST_BATCH = Histogram(
    "loopwatch_ingest_batch_seconds",
    "Time to validate and store one batch (a REST request, a WebSocket message, an OTLP export).",
    ("transport",),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


def events_counted(*, tenant, verdicts: list) -> None:
    """Count a batch's verdicts (ingest.services.Verdict)."""
    label = tenant_label(tenant)
    counts: dict[tuple[str, str], int] = {}
    for verdict in verdicts:
        status = verdict["status"]
        reason = ""
        if status == "rejected":
            path = verdict.get("field", "")
            name = path.split("]", 1)[-1].lstrip(".").split(".", 1)[0].split("[", 1)[0] if path else ""
            reason = REASON(name or "event", tenant_id=tenant.pk)
        counts[status, reason] = counts.get((status, reason), 0) + 1
    for (status, reason), n in counts.items():
        EVENTS.labels(tenant=label, outcome=status, reason=reason).inc(n)


def events_refused(*, tenant, count: int, reason: str) -> None:
    """A whole batch refused before its events got verdicts (reason: rate_limited, too_large)."""
    EVENTS.labels(tenant=tenant_label(tenant), outcome="rejected", reason=reason).inc(count)


def events_counted_otlp(*, tenant, accepted: int, duplicate: int, rejected: int) -> None:
    label = tenant_label(tenant)
    for outcome, n, reason in (
        ("accepted", accepted, ""),
        ("duplicate", duplicate, ""),
        ("rejected", rejected, "span"),
    ):
        if n:
            EVENTS.labels(tenant=label, outcome=outcome, reason=reason).inc(n)


def ingest_batch_timed(transport: str, seconds: float) -> None:
    INGEST_BATCH.labels(transport=transport).observe(seconds)


# --- rate limits (ingest.quotas) ---------------------------------------------------------------
RATE_LIMITED = Counter(
    "loopwatch_rate_limited",
    "Requests refused with 429, by the limit they were over (tenant.events_per_s, key.checks_per_s, …).",
    ("tenant", "limit"),
)
RATE_LIMIT_FAIL_OPEN = Counter(
    "loopwatch_rate_limit_fail_open",
    "Requests let through unlimited because Redis, which keeps the limits, did not answer.",
)


def rate_limited(*, limit: str, tenant) -> None:
    RATE_LIMITED.labels(tenant=tenant_label(tenant), limit=limit).inc()


def rate_limit_fail_open() -> None:
    RATE_LIMIT_FAIL_OPEN.inc()


# --- detection -----------------------------------------------------------------------------------
PASS_SECONDS = Histogram(
    "loopwatch_detection_pass_seconds",
    "Time of one detection pass (runs_process), whatever the number of runs it took.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
PASS_RUNS = Histogram(
    "loopwatch_detection_pass_runs",
    "Runs one detection pass processed.",
    buckets=(0, 1, 2, 5, 10, 25, 50, 100, 250, 500),
)
PASS_EVENTS = Counter("loopwatch_detection_events", "Events processed by detection passes.")
ALERTS = Counter(
    "loopwatch_alerts_published", "Alerts (detections) published to the live pages, by action.", ("action",)
)
ACTIONS = frozenset(POLICY_ACTIONS)


def detection_pass(*, seconds: float, runs: int, events: int) -> None:
    PASS_SECONDS.observe(seconds)
    PASS_RUNS.observe(runs)
    if events:
        PASS_EVENTS.inc(events)


def alerts_published(alerts: list) -> None:
    """(tenant_id, alert payload) pairs, as ingest.services.alerts_publish_all sends them."""
    for _, alert in alerts:
        action = alert.get("action", "")
        ALERTS.labels(action=action if action in ACTIONS else OTHER).inc()


# --- the guard -----------------------------------------------------------------------------------
GUARD_SECONDS = Histogram(
    "loopwatch_guard_check_seconds",
    "Time to answer a guard check (POST /api/v1/runs/{run_id}/check), its catch-up included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
)
GUARD_ANSWERS = Counter("loopwatch_guard_answers", "Guard checks answered, by decision.", ("decision",))
DECISIONS = frozenset(
    {
        "allow",
        "reuse",
        "correct",
        "handoff",
        "terminate",
        "execute",
        "wait",
        "reconcile",
        "failed",
        "compensated",
        "conflict",
    }
)


def guard_answered(*, decision: str, seconds: float) -> None:
    GUARD_SECONDS.observe(seconds)
    GUARD_ANSWERS.labels(decision=decision if decision in DECISIONS else OTHER).inc()


# --- notifications (counted by the code that delivers them) --------------------------------------
NOTIFICATION_OUTCOMES = ("sent", "failed", "dropped")
NOTIFICATIONS = Counter(
    "loopwatch_notification_deliveries",
    "Notifications delivered or not, by channel (webhook, email, …) and outcome: sent, failed (to be "
    "tried again), dropped (given up).",
    ("channel", "outcome"),
)


def notification_delivery(*, channel: str, outcome: str, tenant_id: int = 0) -> None:
    """Count one delivery attempt of a notification. outcome: one of NOTIFICATION_OUTCOMES."""
    if outcome not in NOTIFICATION_OUTCOMES:
        raise ValueError(f"outcome: {outcome!r} is not one of {NOTIFICATION_OUTCOMES}")
    NOTIFICATIONS.labels(channel=CHANNEL(channel, tenant_id=tenant_id), outcome=outcome).inc()


# --- HTTP ----------------------------------------------------------------------------------------
HTTP_RESPONSES = Counter(
    "loopwatch_http_responses",
    "HTTP answers by status class (2xx … 5xx) and view (its URL name).",
    ("view", "status"),
)


class ResponsesMiddleware:
    """Counts every answer of the Django views by status class and view name (bounded by the URL
    configuration)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        view = (match.url_name or "page") if match is not None else "unresolved"
        HTTP_RESPONSES.labels(view=view, status=f"{response.status_code // 100}xx").inc()
        return response


# --- read when scraped ---------------------------------------------------------------------------
LIVE_CACHE_S = 5.0  # a scrape per process within this reuses the figures: the queries scan tables
LIVE_TIMEOUT_MS = 2000  # the most the lag query may take; past it the figures are left out


class LiveCollector:
    """Gauges read from the database and Redis when /metrics is scraped:

    - loopwatch_detection_lag_seconds: age of the oldest event not processed yet. An event's age is
      counted from the later of its `ts` and its run's last pass (or first store), so that an agent
      sending old events (a replay, a late export) does not look like a late pipeline.
    - loopwatch_detection_runs_waiting: runs whose cursor is behind their events.
    - loopwatch_detection_queue_runs: runs in Redis's set of runs waiting for a task (ingest.pending).
    - loopwatch_ledger_operations{status}: operations by state; needs_person ones in
      loopwatch_ledger_needs_person.
    """

    def __init__(self) -> None:
        self._cache: tuple[float, list] | None = None
        self._lock = threading.Lock()

    def collect(self):
        with self._lock:
            if self._cache is not None and time.monotonic() - self._cache[0] < LIVE_CACHE_S:
                return list(self._cache[1])
            families = self._read()
            self._cache = (time.monotonic(), families)
            return list(families)

    def _read(self) -> list:
        from prometheus_client.core import GaugeMetricFamily

        families = []
        try:
            waiting, lag, states, needs_person = _database_figures()
        except Exception as exc:  # a scrape answers what it can: the database may be away
            logger.warning("metrics: reading detection lag and ledger states failed: %s", exc)
        else:
            families.append(
                GaugeMetricFamily(
                    "loopwatch_detection_lag_seconds",
                    "Age of the oldest event detection has not processed.",
                    value=lag,
                )
            )
            families.append(
                GaugeMetricFamily(
                    "loopwatch_detection_runs_waiting",
                    "Runs whose detection cursor is behind their events.",
                    value=waiting,
                )
            )
            operations = GaugeMetricFamily(
                "loopwatch_ledger_operations", "Ledger operations by state.", labels=["status"]
            )
            for status, count in sorted(states.items()):
                operations.add_metric([status], count)
            families.append(operations)
            families.append(
                GaugeMetricFamily(
                    "loopwatch_ledger_needs_person",
                    "Ledger operations waiting for a person.",
                    value=needs_person,
                )
            )
        if settings.REDIS_URL:
            try:
                from ingest.pending import pending_count

                queued = pending_count()
            except Exception as exc:
                logger.warning("metrics: reading the runs waiting in Redis failed: %s", exc)
            else:
                families.append(
                    GaugeMetricFamily(
                        "loopwatch_detection_queue_runs",
                        "Runs in Redis waiting for a detection task.",
                        value=queued,
                    )
                )
        return families

    def forget(self) -> None:
        self._cache = None


LIVE = LiveCollector()


def _database_figures() -> tuple[int, float, dict[str, int], int]:
    """(runs waiting, lag in seconds, {operation status: count}, operations needing a person)."""
    from django.db import connection, transaction
    from django.db.models import Count
    from django.utils import timezone

    from ingest.models import Event, Operation, Run, RunCursor

    now = timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET LOCAL statement_timeout = %s", [LIVE_TIMEOUT_MS])
            cursor.execute(
                f"""
                SELECT count(*), min(GREATEST(e.ts, c.updated_at))
                FROM {RunCursor._meta.db_table} c
                JOIN {Run._meta.db_table} r ON r.id = c.run_id
                LEFT JOIN {Event._meta.db_table} e ON e.run_id = c.run_id AND e.seq = c.position + 1
                WHERE c.position < r.events_count
                """
                if connection.vendor == "postgresql"
                else f"""
                SELECT count(*), min(max(e.ts, c.updated_at))
                FROM {RunCursor._meta.db_table} c
                JOIN {Run._meta.db_table} r ON r.id = c.run_id
                LEFT JOIN {Event._meta.db_table} e ON e.run_id = c.run_id AND e.seq = c.position + 1
                WHERE c.position < r.events_count
                """
            )
            waiting, oldest = cursor.fetchone()
        # Every state, 0 included: an alert on the UNKNOWN backlog needs the series before the first one.
        states = dict.fromkeys(Operation.Status.values, 0)
        states.update(Operation.objects.values_list("status").annotate(n=Count("pk")).order_by())
        needs_person = Operation.objects.filter(needs_person=True).count()
    if isinstance(oldest, str):  # SQLite answers text
        from django.utils.dateparse import parse_datetime

        oldest = parse_datetime(oldest)
        if oldest is not None and timezone.is_naive(oldest):
            oldest = timezone.make_aware(oldest, UTC)
    lag = max(0.0, (now - oldest).total_seconds()) if waiting and oldest is not None else 0.0
    return int(waiting or 0), lag, states, needs_person


# --- series that exist before their first count ----------------------------------------------------
# A series appears when first counted; until then rate() over it is empty and an alert on it cannot
# fire. Those whose label values are known here start at 0 (the tenant ones as OTHER).
LIMITS = tuple(
    f"{owner}.{field}"
    for owner in ("tenant", "key")
    for field in ("events_per_s", "events_per_day", "checks_per_s")
)
for _counter in (DEDUPE_HIT, PAYLOAD_CONFLICT, LEASE_CONTENTION, UNKNOWN_OUTCOME, COMPENSATION):
    _counter.labels(tool=OTHER)
for _limit in LIMITS:
    RATE_LIMITED.labels(tenant=OTHER, limit=_limit)
for _action in ACTIONS:
    ALERTS.labels(action=_action)
for _decision in DECISIONS:
    GUARD_ANSWERS.labels(decision=_decision)
for _outcome in ("accepted", "duplicate"):
    EVENTS.labels(tenant=OTHER, outcome=_outcome, reason="")
