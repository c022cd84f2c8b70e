"""The overview's query parameters: a time range and filters, checked against what exists."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.http import QueryDict

RANGES = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(days=7)}
DEFAULT_RANGE = "day"
# A custom range is read from per-run and per-detection rows: a year of them is still one indexed
# range scan, but a longer span is a report, not a page.
MAX_SPAN = timedelta(days=366)
METRICS = {"rounds": "model rounds", "tool_calls": "tool calls"}
# Time buckets of the charts, finest first; a range gets the finest giving at most MAX_BUCKETS.
STEPS = (
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=15),
    timedelta(minutes=30),
    timedelta(hours=1),
    timedelta(hours=3),
    timedelta(hours=6),
    timedelta(hours=12),
    timedelta(days=1),
    timedelta(days=7),
)
MAX_BUCKETS = 96
MAX_VALUE = 2**31 - 1
FORMATS = ("%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d")


class BadParameter(ValueError):
    """A query parameter the page cannot use; the message names it."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name


@dataclass(frozen=True)
class FilterOptions:
    """The values the filters can take: what exists in the user's tenants."""

    tenants: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    models: tuple[tuple[str, str], ...] = ()  # (backend, model)
    task_types: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()

    def models_of(self, backend: str) -> list[str]:
        return sorted({m for b, m in self.models if not backend or b == backend})


@dataclass(frozen=True)
class TailBin:
    """A bar of the long-tail chart: runs of a task type whose metric lies in [lo, hi]."""

    task_type: str
    lo: int
    hi: int


@dataclass(frozen=True)
class OverviewFilters:
    range: str
    start: datetime
    end: datetime
    step: timedelta
    tenant_ids: tuple[int, ...]
    tenant: str = ""
    backend: str = ""
    model: str = ""
    task_type: str = ""
    agent: str = ""
    metric: str = "rounds"
    bin: TailBin | None = None
    query: dict[str, str] = field(default_factory=dict)  # the parameters given, for links

    @property
    def filtered(self) -> bool:
        return bool(self.tenant or self.backend or self.model or self.task_type or self.agent)


def step_for(span: timedelta) -> timedelta:
    for step in STEPS:
        if span / step <= MAX_BUCKETS:
            return step
    return STEPS[-1]


def _one(params: QueryDict, name: str) -> str:
    values = params.getlist(name)
    if len(values) > 1:
        raise BadParameter(name, "give one value")
    return values[0].strip() if values else ""


def _when(params: QueryDict, name: str) -> datetime:
    raw = _one(params, name)
    if not raw:
        raise BadParameter(name, "required with range=custom (e.g. 2026-11-29T08:00, UTC)")
    text = raw.removesuffix("Z").removesuffix("+00:00")
    for fmt in FORMATS:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise BadParameter(name, f"{raw!r} is not a time like 2026-11-29T08:00 (UTC)")


def _int(params: QueryDict, name: str) -> int:
    raw = _one(params, name)
    if not raw.isdigit() or int(raw) > MAX_VALUE:
        raise BadParameter(name, f"must be a whole number from 0 to {MAX_VALUE}")
    return int(raw)


def _choice(params: QueryDict, name: str, allowed, what: str) -> str:
    value = _one(params, name)
    if value and value not in allowed:
        raise BadParameter(name, f"no {what} {value!r} in your tenants' runs")
    return value


def filters_parse(
    *, params: QueryDict, tenants: dict[str, int], options: FilterOptions, now: datetime
) -> OverviewFilters:
    """The filters of a request; BadParameter names the first parameter that cannot be used.

    tenants: the user's tenants (slug -> pk); a tenant outside them is as unknown as a made-up one.
    """
    name = _one(params, "range") or DEFAULT_RANGE
    if name == "custom":
        start, end = _when(params, "from"), _when(params, "to")
        if end <= start:
            raise BadParameter("to", "must be after from")
        if end - start > MAX_SPAN:
            raise BadParameter("to", f"a range spans at most {MAX_SPAN.days} days")
    elif name in RANGES:
        end = now
        start = now - RANGES[name]
    else:
        raise BadParameter("range", "one of hour, day, week, custom")
    tenant = _one(params, "tenant")
    if tenant and tenant not in tenants:
        raise BadParameter("tenant", f"{tenant!r} is not one of your tenants")
    backend = _choice(params, "backend", options.backends, "backend")
    model = _one(params, "model")
    if model and model not in options.models_of(backend):
        where = f" of backend {backend!r}" if backend else ""
        raise BadParameter("model", f"no model {model!r}{where} in your tenants' runs")
    task_type = _choice(params, "task_type", options.task_types, "task type")
    agent = _choice(params, "agent", options.agents, "agent")
    metric = _one(params, "metric") or "rounds"
    if metric not in METRICS:
        raise BadParameter("metric", "rounds or tool_calls")
    tail = None
    bin_task = _one(params, "bin_task")
    if bin_task or "bin_lo" in params or "bin_hi" in params:
        if bin_task not in options.task_types:
            raise BadParameter("bin_task", f"no task type {bin_task!r} in your tenants' runs")
        lo, hi = _int(params, "bin_lo"), _int(params, "bin_hi")
        if hi < lo:
            raise BadParameter("bin_hi", "must not be below bin_lo")
        tail = TailBin(bin_task, lo, hi)
    query = {
        key: value
        for key, value in (
            ("range", name),
            ("from", _one(params, "from") if name == "custom" else ""),
            ("to", _one(params, "to") if name == "custom" else ""),
            ("tenant", tenant),
            ("backend", backend),
            ("model", model),
            ("task_type", task_type),
            ("agent", agent),
            ("metric", metric),
        )
        if value
    }
    return OverviewFilters(
        range=name,
        start=start,
        end=end,
        step=step_for(end - start),
        tenant_ids=(tenants[tenant],) if tenant else tuple(sorted(tenants.values())),
        tenant=tenant,
        backend=backend,
        model=model,
        task_type=task_type,
        agent=agent,
        metric=metric,
        bin=tail,
        query=query,
    )
