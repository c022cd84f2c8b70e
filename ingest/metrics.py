"""Prometheus metrics of the ledger, labelled by tenant and tool.

With several processes (uvicorn --workers, Celery), set PROMETHEUS_MULTIPROC_DIR to a shared empty
folder: prometheus-client then adds up every process's figures at /metrics.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

LABELS = ("tenant", "tool")

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
    return {"tenant": str(op.tenant_id), "tool": op.tool}


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
