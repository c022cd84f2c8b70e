"""otlp_traces_ingest: an export's spans stored as trace events, through events_ingest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import F, Q

from ingest.models import Run, Tenant, ToolConfig
from ingest.otlp.mapping import (
    Built,
    KnownRun,
    SpanRefused,
    events_build,
    spans_plan,
    spans_read,
)
from ingest.otlp.wire import OtlpError
from ingest.services import EventTooLarge, events_ingest

# Refusals quoted in partial_success.error_message; the count says how many there were in all.
MESSAGE_REFUSALS = 5
TENANT_ATTRIBUTE = "loopwatch.tenant"


@dataclass
class OtlpResult:
    """What became of an export's spans."""

    spans: int = 0
    accepted: int = 0  # spans with events stored now
    duplicate: int = 0  # spans whose events were all stored before (a redelivery)
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
    2. Plan each span's role and run; look up the runs already stored (their description and
       rounds so far) and the tenant's tool registry (the kind of each tool).
    3. Build the events (docs/otlp.md) and store them with events_ingest: one transaction,
       duplicates by event_id, detection queued after the commit (ledger_scope as there).
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
    run_ids = {plan.run_id for plan in plans if plan.problem is None}
    runs = {
        run_id: KnownRun(
            agent,
            backend,
            model,
            rounds,
            service=str(labels.get("service.name", "")),
            from_otlp=labels.get("source") == "otlp",
        )
        for run_id, agent, backend, model, rounds, labels in Run.objects.filter(
            tenant=tenant, run_id__in=run_ids
        ).values_list("run_id", "agent", "backend", "model", "rounds", "labels")
    }
    tools = {plan.tool for plan in plans if plan.tool}
    built = events_build(
        plans, runs=runs, tool_kinds=tool_kinds(tenant=tenant, names=tools), max_event_bytes=max_event_bytes
    )
    result = OtlpResult(spans=len(spans))
    statuses = _store(tenant, built, max_event_bytes, ledger_scope)
    for index, span in enumerate(spans):
        problem = built.refused.get(index)
        if problem is not None:
            result.refused.append((span.label(), f"{problem.field}: {problem.reason}"))
            continue
        seen = statuses.get(index)
        if seen is None:
            result.ignored += 1
        elif "rejected" in seen:
            result.refused.append((span.label(), seen["rejected"]))
        elif "accepted" in seen:
            result.accepted += 1
        else:
            result.duplicate += 1
    result.runs = sorted({event["run_id"] for event in built.events})
    return result


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


def tool_kinds(*, tenant: Tenant, names: set[str]) -> dict[str, str]:
    """Tool name to kind from the registry: the tenant's row replaces the shared one. A blank kind
    (and an unknown tool) is left out: detection infers it from the name and results, as it does
    for a tool_call without a kind (ingest.detection.kinds)."""
    if not names:
        return {}
    kinds: dict[str, str] = {}
    rows = (
        ToolConfig.objects.filter(Q(tenant__isnull=True) | Q(tenant=tenant), name__in=names)
        .order_by(F("tenant_id").asc(nulls_first=True))
        .values_list("name", "kind")
    )
    for name, kind in rows:
        if kind:
            kinds[name] = kind
        else:
            kinds.pop(name, None)  # the tenant's blank row replaces a shared kind too
    return kinds
