"""otlp_traces_ingest: an export's spans stored as trace events, through events_ingest.

An export is mapped and stored in one transaction that holds its runs: concurrent exports of one
trace (a collector's parallel exporters) take turns, so that each finds what the other stored
(the run, its rounds so far, the spans waiting for it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django.db import connection, transaction
from django.db.models import Exists, F, IntegerField, OuterRef, Q, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Greatest
from django.utils import timezone

from ingest.bulk import TENANT_PK, statements_run
from ingest.models import Event, ParkedSpan, Run, RunCursor, Tenant, ToolConfig
from ingest.otlp.mapping import (
    LLM,
    Built,
    KnownRun,
    SpanIn,
    SpanPlan,
    SpanRefused,
    events_build,
    span_dump,
    span_load,
    span_role,
    spans_plan,
    spans_read,
)
from ingest.otlp.wire import OtlpError
from ingest.services import EventTooLarge, events_ingest, runs_drop_empty, runs_hold

logger = logging.getLogger(__name__)

# Refusals quoted in partial_success.error_message; the count says how many there were in all.
MESSAGE_REFUSALS = 5
TENANT_ATTRIBUTE = "loopwatch.tenant"


@dataclass
class OtlpResult:
    """What became of an export's spans."""

    spans: int = 0
    accepted: int = 0  # spans with events stored now
    duplicate: int = 0  # spans whose events were all stored before (a redelivery)
    waiting: int = 0  # root and agent spans of a run no export has started yet: parked
    ignored: int = 0  # spans without agent semantics (HTTP, database, embeddings…)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (span label, "field: reason")
    runs: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        return len(self.refused)

    def message(self) -> str:
        if not self.refused:
            return ""
        shown = "; ".join(f"{label}: {error}" for label, error in self.refused[:MESSAGE_REFUSALS])
        more = len(self.refused) - MESSAGE_REFUSALS
        tail = f"; and {more} more" if more > 0 else ""
        return f"{len(self.refused)} of {self.spans} spans rejected: {shown}{tail}"


def otlp_traces_ingest(
    *,
    tenant: Tenant,
    request: Any,
    run_id_sources: tuple[str, ...],
    max_event_bytes: int,
    ledger_scope: bool = True,
) -> OtlpResult:
    """Map an ExportTraceServiceRequest to trace events v1 and store them like a REST batch.

    1. Read the spans; a resource naming another tenant refuses the whole export (403).
    2. Plan each span's role and run.
    3. In one transaction (_plans_store): hold the export's runs, read what is stored of them,
       build the events (docs/otlp.md) with the spans that waited for these runs, store them with
       events_ingest (duplicates by event_id, detection queued after the commit; ledger_scope as
       there), park the root and agent spans whose run no export has started yet.
    """
    spans = spans_read(request)
    for span in spans:
        named = span.resource.get(TENANT_ATTRIBUTE)
        if named is not None and named != tenant.slug:
            raise OtlpError(
                403,
                "wrong_tenant",
                f"{span.path.split('.')[0]}.resource.attributes[{TENANT_ATTRIBUTE!r}]",
                f"names tenant {str(named)[:100]!r}, but the API key is tenant {tenant.slug!r}'s",
            )
    plans = spans_plan(spans, run_id_sources)
    built, statuses, _ = _plans_store(
        tenant, plans, max_event_bytes=max_event_bytes, ledger_scope=ledger_scope
    )
    result = OtlpResult(spans=len(spans))
    waiting, repeated = set(built.waiting), set(built.repeated)
    for index, span in enumerate(spans):
        problem = built.refused.get(index)
        if problem is not None:
            result.refused.append((span.label(), f"{problem.field}: {problem.reason}"))
            continue
        seen = statuses.get(index)
        if index in waiting:
            result.waiting += 1
        elif index in repeated:
            result.duplicate += 1
        elif seen is None:
            result.ignored += 1
        elif "rejected" in seen:
            result.refused.append((span.label(), seen["rejected"]))
        elif "accepted" in seen:
            result.accepted += 1
        else:
            result.duplicate += 1
    result.runs = sorted({event["run_id"] for event in built.events})
    return result


def _plans_store(
    tenant: Tenant,
    plans: list[SpanPlan],
    *,
    max_event_bytes: int,
    ledger_scope: bool,
    run_ids: AbstractSet[str] = frozenset(),
) -> tuple[Built, dict[int, dict[str, str]], int]:
    """Build and store the events of these plans (and of the spans waiting for their runs, or for
    `run_ids`), in one transaction. Returns what was built, the verdicts per span index and how
    many waiting spans were placed. ledger_scope: as events_ingest takes it."""
    with transaction.atomic():
        held = sorted({plan.run_id for plan in plans if plan.problem is None} | set(run_ids))
        created = runs_hold(tenant=tenant, run_ids=held)
        state = _runs_read(tenant, plans, run_ids)
        waited = [
            SpanPlan(
                span=span,
                index=len(plans) + n,
                role=span_role(span),
                run_id=run_id,
                run_from_trace=run_id == span.trace_id,
            )
            for n, (_, run_id, span) in enumerate(state.parked)
        ]
        built = events_build(
            plans + waited, runs=state.runs, tool_kinds=state.tool_kinds, max_event_bytes=max_event_bytes
        )
        statuses = _store(tenant, built, max_event_bytes, ledger_scope) if built.events else {}
        still = set(built.waiting)
        placed = [pk for n, (pk, _, _) in enumerate(state.parked) if len(plans) + n not in still]
        for n, (_, run_id, span) in enumerate(state.parked):
            problem = built.refused.get(len(plans) + n)
            if problem is not None:  # nobody to tell: the export that sent it had its answer
                logger.warning(
                    "otlp span %s of run %r refused after waiting: %s", span.span_id, run_id, problem
                )
        _parked_write(tenant, [plans[i] for i in built.waiting if i < len(plans)], placed)
        runs_drop_empty(run_pks=created)  # held for spans that wait, or were refused: no run yet
    return built, statuses, len(placed)


@dataclass
class _RunsState:
    runs: dict[str, KnownRun]
    parked: list[tuple[int, str, SpanIn]]  # (pk, run id, span)
    tool_kinds: dict[str, str]


def _runs_read(tenant: Tenant, plans: list[SpanPlan], extra: AbstractSet[str]) -> _RunsState:
    """Read what is stored of the plans' runs, which the caller holds (runs_hold: two exports of a
    trace take turns, or both would start its run, number the same rounds, or miss each other's
    waiting root span): the runs (their description and rounds so far), which of the export's model
    spans are stored already, the spans waiting for them, the tool registry's kinds. On PostgreSQL
    in one round trip."""
    run_ids = sorted({plan.run_id for plan in plans if plan.problem is None} | set(extra))
    rounds = sorted(
        {
            (plan.run_id, f"otel:{plan.span.trace_id}:{plan.span.span_id}:round")
            for plan in plans
            if plan.problem is None and plan.role == LLM
        }
    )
    tools = sorted({plan.tool for plan in plans if plan.tool})
    if not run_ids:
        return _RunsState({}, [], {})
    runs: Iterable[tuple[Any, ...]] | None
    stored: Iterable[tuple[Any, ...]] | None
    parked: Iterable[tuple[Any, ...]] | None
    kinds: Iterable[tuple[Any, ...]] | None
    if connection.vendor == "postgresql":
        runs, stored, parked, kinds = statements_run(
            [
                (_RUNS_SQL, [tenant.pk, run_ids]),
                (_STORED_ROUNDS_SQL, [[r for r, _ in rounds], [e for _, e in rounds], tenant.pk])
                if rounds
                else None,
                (_PARKED_SQL, [tenant.pk, run_ids]),
                (_TOOL_KINDS_SQL, [tenant.pk, tools]) if tools else None,
            ]
        )
    else:  # SQLite: its IMMEDIATE transactions already take turns
        uncounted = (
            Event.objects.filter(
                run_id=OuterRef("pk"),
                type="model_round",
                seq__gt=Coalesce(OuterRef("cursor__figures_seq"), 0),
            )
            .annotate(number=Cast(KT("body__round"), IntegerField()))
            .order_by("-number")
            .values("number")[:1]
        )
        runs = (
            Run.objects.filter(tenant=tenant, run_id__in=run_ids)
            .annotate(so_far=Greatest("rounds", Coalesce(Subquery(uncounted), 0)))
            .values_list(*("so_far" if name == "rounds" else name for name in _RUN_COLUMNS))
        )
        stored = Event.objects.filter(
            run__tenant=tenant, run__run_id__in=run_ids, event_id__in=[e for _, e in rounds]
        ).values_list("run__run_id", "event_id")
        parked = ParkedSpan.objects.filter(tenant=tenant, run_id__in=run_ids).values_list(
            "pk", "run_id", "span"
        )
        kinds = (
            ToolConfig.objects.filter(Q(tenant__isnull=True) | Q(tenant=tenant), name__in=tools)
            .order_by(F("tenant_id").asc(nulls_first=True))
            .values_list("name", "kind")
        )
    stored_by_run: dict[str, set[str]] = {}
    for run_id, event_id in stored or ():
        stored_by_run.setdefault(run_id, set()).add(event_id.split(":")[2])
    known = {}
    for run_id, agent, backend, model, count, labels, started_at, events_count in runs or ():
        if not events_count:
            continue  # created and left empty: nothing of it is stored
        labels = orjson.loads(labels) if isinstance(labels, str | bytes) else labels
        known[run_id] = KnownRun(
            agent,
            backend,
            model,
            count,
            service=str(labels.get("service.name", "")),
            from_otlp=labels.get("source") == "otlp",
            started_us=_unix_us(started_at),
            stored_rounds=frozenset(stored_by_run.get(run_id, ())),
        )
    waiting = [
        (pk, run_id, span_load(orjson.loads(span) if isinstance(span, str | bytes) else span))
        for pk, run_id, span in parked or ()
    ]
    tool_kinds: dict[str, str] = {}
    for name, kind in kinds or ():  # the shared rows first: the tenant's replace them
        # A blank kind (and an unknown tool) is left out: detection infers it from the name and
        # results, as for a tool_call without a kind (ingest.detection.kinds).
        if kind:
            tool_kinds[name] = kind
        else:
            tool_kinds.pop(name, None)  # the tenant's blank row replaces a shared kind too
    return _RunsState(known, waiting, tool_kinds)


_RUN_COLUMNS = ("run_id", "agent", "backend", "model", "rounds", "labels", "started_at", "events_count")
# A run's rounds so far: its rounds figure, which the detection pass counts, or the greatest round
# of the model_round events stored since it last counted (the cursor's figures_seq on): an export
# stored before the pass has seen the previous one still numbers its rounds after that one's. A
# few events of the run, by its (run, seq) index.
_RUNS_SQL = f"""
SELECT r.run_id, r.agent, r.backend, r.model, GREATEST(r.rounds, COALESCE((
    SELECT max((e.body->>'round')::integer) FROM {Event._meta.db_table} AS e
    WHERE e.run_id = r.id AND e.seq > COALESCE(c.figures_seq, 0) AND e.type = 'model_round'
), 0)), r.labels, r.started_at, r.events_count
FROM {Run._meta.db_table} AS r LEFT JOIN {RunCursor._meta.db_table} AS c ON c.run_id = r.id
WHERE r.tenant_id = {TENANT_PK} AND r.run_id = ANY(%s)
"""
# The export's model spans already stored, by the (run, event_id) index: one probe per span.
_STORED_ROUNDS_SQL = f"""
SELECT v.run_id, e.event_id FROM unnest(%s::text[], %s::text[]) AS v(run_id, event_id)
JOIN {Run._meta.db_table} AS r ON r.tenant_id = {TENANT_PK} AND r.run_id = v.run_id
JOIN {Event._meta.db_table} AS e ON e.run_id = r.id AND e.event_id = v.event_id
"""
_PARKED_SQL = (
    f"SELECT id, run_id, span FROM {ParkedSpan._meta.db_table} WHERE tenant_id = %s AND run_id = ANY(%s)"
)
_TOOL_KINDS_SQL = (
    f"SELECT name, kind FROM {ToolConfig._meta.db_table} "
    "WHERE (tenant_id IS NULL OR tenant_id = %s) AND name = ANY(%s) ORDER BY tenant_id NULLS FIRST"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _unix_us(value: datetime | None) -> int | None:
    if value is None:
        return None
    return (value - _EPOCH) // timedelta(microseconds=1)


def _parked_write(tenant: Tenant, waiting: list[SpanPlan], placed: list[int]) -> None:
    """Park the spans that wait for their run (a span parked already stays as it is); drop the
    parked spans placed now."""
    if not waiting and not placed:
        return
    now = timezone.now()
    rows = [
        ParkedSpan(
            tenant=tenant,
            run_id=plan.run_id,
            span_key=plan.span.trace_id + plan.span.span_id,
            # Through orjson: a NaN attribute becomes null, which jsonb can store.
            span=orjson.loads(orjson.dumps(span_dump(plan.span))),
            parked_at=now,
        )
        for plan in waiting
    ]
    # Placed ones first: a span parked before and sent again in an export that still cannot place it
    # is read (and counted placed) and parked again.
    if placed:
        ParkedSpan.objects.filter(pk__in=placed).delete()
    if rows:
        ParkedSpan.objects.bulk_create(rows, ignore_conflicts=True)


def otlp_parked_sweep(
    *, max_age_s: float, max_event_bytes: int, now: datetime | None = None
) -> tuple[int, int]:
    """Place the parked spans whose run exists now (started over REST, say, with no later OTLP
    export to place them); drop those parked longer than max_age_s (their run never came: the
    root of a trace without agent semantics, mostly). Returns (placed, dropped)."""
    now = now or timezone.now()
    dropped, _ = ParkedSpan.objects.filter(parked_at__lt=now - timedelta(seconds=max_age_s)).delete()
    if dropped:
        logger.info("otlp: %d parked spans dropped after %s s without their run", dropped, max_age_s)
    ready = (
        ParkedSpan.objects.filter(
            Exists(
                Run.objects.filter(
                    tenant_id=OuterRef("tenant_id"), run_id=OuterRef("run_id"), events_count__gt=0
                )
            )
        )
        .values_list("tenant_id", "run_id")
        .distinct()
    )
    by_tenant: dict[int, set[str]] = {}
    for tenant_id, run_id in ready:
        by_tenant.setdefault(tenant_id, set()).add(run_id)
    placed = 0
    for tenant in Tenant.objects.filter(pk__in=by_tenant):
        # Whose key sent them is not kept: traced results placed now are evidence, not ledger verdicts.
        placed += _plans_store(
            tenant, [], max_event_bytes=max_event_bytes, ledger_scope=False, run_ids=by_tenant[tenant.pk]
        )[2]
    return placed, dropped


def _store(
    tenant: Tenant, built: Built, max_event_bytes: int, ledger_scope: bool
) -> dict[int, dict[str, str]]:
    """events_ingest the built events; per span index, its events' verdicts ({status: error})."""
    events, span_of = built.events, built.span_of
    while True:
        try:
            outcome = events_ingest(
                tenant=tenant, events=events, max_event_bytes=max_event_bytes, ledger_scope=ledger_scope
            )
            break
        except EventTooLarge as exc:
            # The mapping checks sizes as ingest does, so this is a backstop: refuse that span, retry.
            index = span_of[exc.index]
            if index is None:
                raise
            built.refused[index] = SpanRefused("event", str(exc).split(": ", 1)[-1])
            keep = [i for i, owner in enumerate(span_of) if owner != index]
            events, span_of = [events[i] for i in keep], [span_of[i] for i in keep]
    statuses: dict[int, dict[str, str]] = {}
    for verdict in outcome.verdicts:
        owner = span_of[verdict["index"]]
        if owner is None:
            continue
        statuses.setdefault(owner, {})[verdict["status"]] = verdict.get("error", "")
    return statuses
