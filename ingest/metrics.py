"""Prometheus metrics of the ledger, labelled by tool.

With several processes (uvicorn --workers, Celery), set PROMETHEUS_MULTIPROC_DIR to a shared empty
folder: prometheus-client then adds up every process's figures at /metrics.

Labels are bounded: every label value is a series in every process and in every scrape, and tool
names come from tenants' traces. Tenant ids are no label at all (tenants' figures are on their
pages); a tool is labelled by name while the process has seen fewer than
LOOPWATCH_METRICS_MAX_TOOLS names, at most a fifth of them from one tenant, and as OTHER past
that. Every new label of a new metric goes through a BoundedLabel too.
"""

from __future__ import annotations

import os
import threading

from django.conf import settings
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

OTHER = "other"  # the label value of everything past the bound


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
    """The metrics text and its content type."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


# Not labelled by tenant or run: the runs themselves are listed on the runs page (detection failed).
DETECTION_QUARANTINED = Counter(
    "detection_quarantined_total", "Detection passes that failed on a run, which was quarantined."
)


def detection_quarantined() -> None:
    DETECTION_QUARANTINED.inc()
