"""Reads, always scoped to one tenant."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Q, QuerySet

from ingest.bulk import of_tenant
from ingest.detection import KINDS, Config, Thresholds, ToolSpec
from ingest.detection.config import MODE_PREFIX
from ingest.models import Detection, Event, Run, Tenant, ThresholdSet, ToolConfig

logger = logging.getLogger(__name__)


def run_list(
    *,
    tenant: Tenant,
    filters: dict[str, str] | None = None,
    limit: int = 100,
    after: tuple[datetime | None, int] | None = None,
) -> QuerySet[Run]:
    """The tenant's runs, the latest started first (then the latest created), `limit` of them;
    with `after` (the started_at and pk of the last run of the page before), the page after it."""
    qs = Run.objects.filter(tenant=tenant)
    for name, value in (filters or {}).items():
        if name in ("status", "backend", "task_type", "agent", "model") and value:
            qs = qs.filter(**{name: value})
        elif name == "detection" and value == "failed":  # quarantined (RunCursor.failures)
            qs = qs.filter(cursor__failures__gt=0)
    if after is not None:
        started, pk = after
        if started is None:  # runs without a start come first
            qs = qs.filter(Q(started_at__isnull=True, pk__lt=pk) | Q(started_at__isnull=False))
        else:
            qs = qs.filter(Q(started_at__lt=started) | Q(started_at=started, pk__lt=pk))
    # NULLS FIRST as PostgreSQL sorts DESC by default (the (tenant, -started_at) indexes serve it),
    # said so that SQLite sorts the same.
    return qs.order_by(F("started_at").desc(nulls_first=True), "-pk")[:limit]


def run_get(*, tenant: Tenant, run_id: str) -> Run | None:
    return Run.objects.filter(of_tenant(tenant), run_id=run_id).select_related("cursor").first()


def run_events(*, run: Run, after_seq: int = 0, limit: int = 1000) -> QuerySet[Event]:
    return Event.objects.filter(run=run, seq__gt=after_seq).order_by("seq")[:limit]


def detection_config(*, run: Run) -> Config:
    """Thresholds and tools for the run (see ThresholdSet for the order of resolution)."""
    return config_for(tenant_id=run.tenant_id, backend=run.backend, model=run.model, task_type=run.task_type)


Scope = tuple[int, str, str, str]  # (tenant_id, backend, model, task_type)


def config_for(*, tenant_id: int, backend: str, model: str, task_type: str) -> Config:
    """Defaults < rows for every tenant < the tenant's rows; within each, by scope:
    global < task type < backend < (backend, model). A tenant's tool row replaces the shared one."""
    scope = (tenant_id, backend, model, task_type)
    return configs_for(scopes={scope})[scope]


def configs_for(*, scopes: set[Scope]) -> dict[Scope, Config]:
    """config_for of several scopes with three queries for all of them (the detection task resolves
    the scopes of every run of a pass at once): the rows of the tenants and the shared ones, each
    scope's picked in memory by threshold_applies; the tools; the operators' verdicts per kind
    (a kind they judged wrong too often goes back to shadow: modes_measured)."""
    tenants = {tenant_id for tenant_id, _, _, _ in scopes}
    backends = {backend for _, backend, _, _ in scopes}
    rows = list(
        ThresholdSet.objects.filter(
            Q(tenant__isnull=True) | Q(tenant_id__in=tenants), backend__in=["", *sorted(backends)]
        )
    )
    rows.sort(key=threshold_weight)
    tools = list(ToolConfig.objects.filter(Q(tenant__isnull=True) | Q(tenant_id__in=tenants)))
    specs = {
        tenant_id: tool_specs([t for t in tools if t.tenant_id in (None, tenant_id)]) for tenant_id in tenants
    }
    verdicts = verdict_rows(tenant_ids=tenants)
    configs = {}
    for tenant_id, backend, model, task_type in scopes:
        resolved = thresholds_resolve(
            [row for row in rows if row.tenant_id in (None, tenant_id)],
            backend=backend,
            model=model,
            task_type=task_type,
            verdicts=verdicts.get(tenant_id, []),
        )
        for row, problem in resolved.skipped:
            logger.warning("thresholds %s ignored: %s", row, problem)
        configs[(tenant_id, backend, model, task_type)] = Config(
            thresholds=resolved.thresholds, tools=specs[tenant_id]
        )
    return configs


# --- resolution: pure, over rows already read -----------------------------------------------------

DEFAULTS = Thresholds()
THRESHOLD_NAMES = tuple(f.name for f in fields(Thresholds))


def scope_label(
    row: ThresholdSet | None = None, *, backend: str = "", model: str = "", task_type: str = ""
) -> str:
    if row is not None:
        backend, model, task_type = row.backend, row.model, row.task_type
    if task_type:
        return f"task type {task_type}"
    if backend:
        return f"{backend}/{model}" if model else f"backend {backend}"
    return "global"


@dataclass(frozen=True)
class Resolved:
    thresholds: Thresholds
    sources: dict[str, str]  # threshold name -> where its value comes from ("default" or a row)
    skipped: tuple[tuple[ThresholdSet, str], ...] = ()  # applying rows whose values are invalid, why


def thresholds_resolve(
    rows: Iterable[ThresholdSet],
    *,
    backend: str,
    model: str,
    task_type: str,
    overrides: Mapping[int | None, dict[str, Any] | None] | None = None,
    verdicts: list[VerdictRow] | None = None,
) -> Resolved:
    """The one resolution of thresholds, for the pipeline (configs_for), the guard, the threshold
    page and its preview: defaults < shared rows < the tenant's, each by scope (global < task type <
    backend < backend + model); with `verdicts` (the tenant's, verdict_rows), a kind operators
    judged wrong too often goes to shadow unless an applying row set its mode (modes_measured).

    `rows` are the shared ones and one tenant's. `overrides` replaces rows' values by pk (None: the
    row is left out), for a preview. Rows whose values are invalid are skipped (and listed).
    """
    overrides = overrides or {}
    thresholds = DEFAULTS
    sources = dict.fromkeys(THRESHOLD_NAMES, "default")
    skipped: list[tuple[ThresholdSet, str]] = []
    applying = (r for r in rows if threshold_applies(r, backend=backend, model=model, task_type=task_type))
    for row in sorted(applying, key=threshold_weight):
        values = overrides[row.pk] if row.pk in overrides else row.values
        if values is None:
            continue
        try:
            thresholds = thresholds.merged(values)
        except (TypeError, ValueError, AttributeError) as exc:  # values not an object, say
            skipped.append((row, str(exc)))
            continue
        origin = ("" if row.tenant_id else "shared ") + scope_label(row)
        for name in values:
            sources[name] = origin
    if verdicts is not None:
        explicit = {name for name, source in sources.items() if source != "default"}
        thresholds, demoted = modes_measured(
            thresholds,
            explicit=explicit,
            verdicts=verdicts,
            backend=backend,
            model=model,
            task_type=task_type,
        )
        for name, found in demoted.items():
            sources[name] = (
                f"measured: precision {found.precision:.2f} over {found.total} verdicts ({found.scope})"
            )
    return Resolved(thresholds, sources, tuple(skipped))


# --- operators' verdicts: the measured precision of each kind ------------------------------------

# A kind whose interventions operators called false alarms at least as often as true loops, in a
# scope, goes back to shadow there (recorded, never acted on) unless a threshold row sets its mode:
# it stays measured until someone decides it is right.
PRECISION_FLOOR = 0.5
MIN_VERDICTS = 10  # fewer verdicts say little either way
INTERVENTION_ACTIONS = ("correct", "handoff", "terminate")


@dataclass(frozen=True)
class VerdictRow:
    kind: str
    backend: str
    model: str
    task_type: str
    true_loops: int
    false_alarms: int


@dataclass(frozen=True)
class Verdicts:
    """Operators' verdicts on one kind's interventions (and on what it would have done in shadow)."""

    true_loops: int = 0
    false_alarms: int = 0
    scope: str = "global"  # whose verdicts: the most specific scope with enough of them

    @property
    def total(self) -> int:
        return self.true_loops + self.false_alarms

    @property
    def precision(self) -> float | None:
        return self.true_loops / self.total if self.total else None

    @property
    def low(self) -> bool:
        return self.total >= MIN_VERDICTS and (self.precision or 0.0) < PRECISION_FLOOR


def verdict_rows(*, tenant_ids: Iterable[int]) -> dict[int, list[VerdictRow]]:
    """Per tenant, verdict counts per (kind, backend, model, task type): interventions, and shadow
    detections (stored as observe) that would have been one."""
    out: dict[int, list[VerdictRow]] = {}
    counts = (
        Detection.objects.filter(tenant_id__in=list(tenant_ids))
        .exclude(feedback="")
        .filter(Q(action__in=INTERVENTION_ACTIONS) | Q(evidence__has_key="shadow"))
        .values("tenant_id", "kind", "backend", "model", "task_type")
        .annotate(
            true_loops=Count("pk", filter=Q(feedback=Detection.Feedback.TRUE_LOOP)),
            false_alarms=Count("pk", filter=Q(feedback=Detection.Feedback.FALSE_ALARM)),
        )
    )
    for c in counts:
        out.setdefault(c["tenant_id"], []).append(
            VerdictRow(
                c["kind"], c["backend"], c["model"], c["task_type"], c["true_loops"], c["false_alarms"]
            )
        )
    return out


def kind_verdicts(
    rows: list[VerdictRow], *, kind: str, backend: str = "", model: str = "", task_type: str = ""
) -> Verdicts:
    """A kind's verdicts in the most specific scope that has MIN_VERDICTS of them, as thresholds
    resolve: backend + model, backend, task type, then all of the tenant's."""
    levels = []
    if backend and model:
        levels.append((f"{backend}/{model}", lambda r: r.backend == backend and r.model == model))
    if backend:
        levels.append((f"backend {backend}", lambda r: r.backend == backend))
    if task_type:
        levels.append((f"task type {task_type}", lambda r: r.task_type == task_type))
    levels.append(("global", lambda r: True))
    mine = [r for r in rows if r.kind == kind]
    for label, match in levels:
        matched = [r for r in mine if match(r)]
        found = Verdicts(
            sum(r.true_loops for r in matched), sum(r.false_alarms for r in matched), scope=label
        )
        if found.total >= MIN_VERDICTS:
            return found
    return found


def modes_measured(
    thresholds: Thresholds,
    *,
    explicit: set[str],
    verdicts: list[VerdictRow],
    backend: str,
    model: str,
    task_type: str,
) -> tuple[Thresholds, dict[str, Verdicts]]:
    """The thresholds with each kind whose measured precision is low put in shadow, unless a row
    set its mode (`explicit`: the names the applying rows set); and the verdicts that did it."""
    demoted: dict[str, Verdicts] = {}
    for kind in KINDS:
        name = MODE_PREFIX + kind
        if name in explicit or thresholds.mode(kind) == "shadow":
            continue
        found = kind_verdicts(verdicts, kind=kind, backend=backend, model=model, task_type=task_type)
        if found.low:
            demoted[name] = found
    if demoted:
        thresholds = thresholds.merged(dict.fromkeys(demoted, "shadow"))
    return thresholds, demoted


def threshold_applies(row: ThresholdSet, *, backend: str, model: str, task_type: str) -> bool:
    """Whether the row is among those config_for selects for this scope (its SQL filter, in Python)."""
    if not row.backend and not row.model:
        return row.task_type in ("", task_type)
    return row.backend == backend and row.model in ("", model) and not row.task_type


def threshold_weight(row: ThresholdSet) -> tuple[bool, int]:
    """The order rows apply in, weakest first: shared before the tenant's, then by scope."""
    scope = (
        (2 if row.backend else 0) + (1 if row.model else 0) + (1 if row.task_type else 0) * (not row.backend)
    )
    return (row.tenant_id is not None, scope)


def tool_row_spec(row: ToolConfig) -> ToolSpec:
    """A tool row as the engine's ToolSpec, validated as every tool description is
    (ToolSpec.from_dict); a ValueError `field: reason` when the row is wrong."""
    return ToolSpec.from_dict(
        {
            "kind": row.kind,
            "core_args": row.core_args,
            "noise_args": row.noise_args,
            "cursor_args": row.cursor_args,
            "casefold": row.casefold,
        }
    )


def tool_specs(
    rows: Iterable[ToolConfig], *, replace: Mapping[str, ToolSpec | None] | None = None
) -> dict[str, ToolSpec]:
    """The engine's tool specs by name: a tenant's row replaces the shared one of that name (a row
    that is not valid is left out, as an invalid threshold row is); with `replace`, some replaced
    (None: removed), for the threshold page's preview."""
    specs: dict[str, ToolSpec] = {}
    for row in sorted(rows, key=lambda r: r.tenant_id is not None):
        try:
            specs[row.name] = tool_row_spec(row)
        except ValueError as exc:
            logger.warning("tool %s ignored: %s", row, exc)
    for name, spec in (replace or {}).items():
        if spec is None:
            specs.pop(name, None)
        else:
            specs[name] = spec
    return specs
