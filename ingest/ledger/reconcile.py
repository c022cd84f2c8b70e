"""Reconciliation (Celery beat): leases expired, UNKNOWN operations asked about downstream, old
operations purged."""

from __future__ import annotations

import hashlib
import http.client
import random
import time
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ingest.downstream import Refused, downstream_fetch, kept, target_for
from ingest.ledger.claims import MAX_LEASE_S, RECONCILE_BACKOFF_S, Actor, S, _lease_expired, _move
from ingest.models import Operation, Reconciler


def leases_expire(*, now: datetime | None = None, batch: int = 200) -> int:
    """RUNNING past its lease -> UNKNOWN."""
    now = now or timezone.now()
    done = 0
    with transaction.atomic():
        for op in Operation.objects.select_for_update(skip_locked=True).filter(
            status=S.RUNNING, lease_expires_at__lt=now
        )[:batch]:
            _lease_expired(op)
            op.save()
            done += 1
    return done


def reconcile_due(*, now: datetime | None = None, batch: int = 50, budget_s: float = 180.0) -> int:
    """Ask the downstream about UNKNOWN operations that are due; returns how many were asked.

    1. Claim one due UNKNOWN row at a time with SELECT ... FOR UPDATE SKIP LOCKED, in a transaction
       of its own: only the operation being asked about is locked, and others reconcile the rest.
    2. Call its tool's reconciler (a timeout per request).
    3. Done -> SUCCEEDED with the answer as evidence; provably not done -> RETRYABLE_FAILED;
       anything else -> stays UNKNOWN, next try after an exponential backoff with jitter, and after
       max_attempts or give_up_after_min the operation needs a person.
    Stops after `batch` operations or `budget_s` seconds, well inside the task's time limit, so that
    a hanging downstream cannot roll back what was already decided.
    """
    started = time.monotonic()
    asked = 0
    # A tenant's operations are asked of that tenant's reconcilers only (with its credentials).
    reconcilers = {
        (r.tenant_id, r.tool): r
        for r in Reconciler.objects.filter(tenant__isnull=False).select_related("tenant")
    }
    for _ in range(batch):
        if time.monotonic() - started > budget_s:
            break
        moment = now or timezone.now()
        with transaction.atomic():
            op = (
                Operation.objects.select_for_update(skip_locked=True)
                .filter(status=S.UNKNOWN, needs_person=False, next_reconcile_at__lte=moment)
                .order_by("next_reconcile_at")
                .first()
            )
            if op is None:
                break
            reconciler = reconcilers.get((op.tenant_id, op.tool))
            if reconciler is None:
                op.needs_person = True
                op.last_reconcile = {"answer": "no reconciler configured for this tool"}
                op.save(update_fields=["needs_person", "last_reconcile", "updated_at"])
                continue
            asked += 1
            verdict, answer = reconciler_ask(reconciler, op)
            _reconciled(op, reconciler, verdict, answer, moment)
    return asked


def reconciler_for(op: Operation) -> Reconciler | None:
    """The reconciler of the operation's tenant for its tool (another tenant's never)."""
    return Reconciler.objects.filter(tenant_id=op.tenant_id, tool=op.tool).select_related("tenant").first()


def _quiet_at(op: Operation, reconciler: Reconciler) -> datetime:
    """When no attempt can still act: the end of the last lease (or the moment it became UNKNOWN,
    when the holder itself reported) plus the reconciler's grace for requests still under way."""
    base = op.lease_expires_at or op.unknown_since or timezone.now()
    return base + timedelta(seconds=reconciler.grace_s)


def _reconciled(
    op: Operation, reconciler: Reconciler, verdict: str, answer: dict[str, Any], now: datetime
) -> None:
    op.reconcile_attempts += 1
    op.last_reconcile = {"at": now.isoformat(), "verdict": verdict, "acted": verdict != "unknown", **answer}
    if verdict == "done":
        _move(
            op, S.SUCCEEDED, actor=Actor.RECONCILER, note="the downstream says it happened", evidence=answer
        )
        if op.result_json is None:
            # The tool's own answer never came: the downstream's verdict and the fields the
            # reconciler declares are the result (never the downstream's whole body).
            record = {answer.get("field", reconciler.field): answer.get("value"), **answer.get("kept", {})}
            op.result_json = orjson.dumps(record).decode()
            op.result_digest = hashlib.sha256(op.result_json.encode()).hexdigest()
    elif verdict == "not_done" and now < (quiet := _quiet_at(op, reconciler)):
        # True now, but the holder may still be running (or its request still on the way): not a
        # licence to execute again. Asked again once nobody can act any more.
        op.next_reconcile_at = quiet
        op.last_reconcile.update(
            acted=False,
            note=f"not done yet, but an attempt may still act until {quiet:%Y-%m-%d %H:%M:%S} UTC: asked again then",
        )
    elif verdict == "not_done":
        _move(
            op,
            S.RETRYABLE_FAILED,
            actor=Actor.RECONCILER,
            note="the downstream says it did not happen",
            evidence=answer,
        )
    else:
        delay = RECONCILE_BACKOFF_S[min(op.reconcile_attempts - 1, len(RECONCILE_BACKOFF_S) - 1)]
        op.next_reconcile_at = now + timedelta(seconds=delay * random.uniform(0.5, 1.5))
        age_min = (now - (op.unknown_since or now)).total_seconds() / 60
        if op.reconcile_attempts >= reconciler.max_attempts or age_min >= reconciler.give_up_after_min:
            op.needs_person = True
    op.save()


def reconciler_ask(reconciler: Reconciler, op: Operation) -> tuple[str, dict[str, Any]]:
    """('done' | 'not_done' | 'unknown', what the downstream answered, reduced to the verdict's field
    and the reconciler's keep_fields). The request is the reconciler's tenant's, with its headers,
    checked by ingest.downstream (no redirects, no private targets unless allowed, encoded ids)."""
    try:
        target = target_for(
            reconciler.url_template,
            operation_key=op.operation_key,
            external_request_id=op.external_request_id,
        )
    except Refused as exc:
        return "unknown", {"error": f"not asked: {exc}"}
    slug = reconciler.tenant.slug if reconciler.tenant_id else ""
    headers = settings.LOOPWATCH_RECONCILER_HEADERS.get(slug, {}).get(reconciler.headers_name, {})
    try:
        status, raw = downstream_fetch(
            target, method=reconciler.method, headers=headers, timeout=reconciler.timeout_s
        )
    except (OSError, http.client.HTTPException) as exc:
        return "unknown", {"url": target.url, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if 300 <= status < 400:
        return "unknown", {"url": target.url, "status": status, "error": "a redirect is not followed"}
    if status == 404 and reconciler.not_found_means_not_done:
        return "not_done", {"url": target.url, "status": 404}
    if not 200 <= status < 300:
        return "unknown", {"url": target.url, "status": status}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "unknown", {"url": target.url, "status": status, "error": "answer is not JSON"}
    value = kept(body, [reconciler.field])[reconciler.field]
    answer = {
        "url": target.url,
        "status": status,
        "field": reconciler.field,
        "value": value,
        "kept": kept(body, reconciler.keep_fields),
    }
    if value in reconciler.done_values:
        return "done", answer
    if value in reconciler.not_done_values:
        return "not_done", answer
    return "unknown", answer


def operations_purge(*, now: datetime | None = None) -> int:
    """Drop finished operations past their retention; never RUNNING, UNKNOWN or PENDING.

    Nothing younger than the longest retry window (leases and reconciliation backoff) goes either.
    """
    now = now or timezone.now()
    floor = timedelta(seconds=max(MAX_LEASE_S, sum(RECONCILE_BACKOFF_S)))
    ttl_days = settings.LOOPWATCH_LEDGER_TTL_DAYS
    deleted = 0
    for tool_kind, days in ttl_days.items():
        cutoff = now - max(timedelta(days=days), floor)
        qs = Operation.objects.filter(
            status__in=[S.SUCCEEDED, S.FAILED, S.RETRYABLE_FAILED, S.COMPENSATED], updated_at__lt=cutoff
        )
        if tool_kind != "default":
            qs = qs.filter(tool=tool_kind)
        else:
            qs = qs.exclude(tool__in=[k for k in ttl_days if k != "default"])
        deleted += qs.delete()[1].get(Operation._meta.label, 0)
    return deleted
