"""Reads for the runs pages: search, recent runs, and one run's detail, scoped to the user's tenants."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from django.db.models import QuerySet

from dashboards.selectors import visible_to
from ingest.detection import Config, RunState
from ingest.detection.budgets import consumed, run_budgets
from ingest.detection.config import BUDGET_TYPES
from ingest.detection.normalize import CURSOR_KEYS, canonical, digest, split_cursor
from ingest.models import Detection, Event, ModelRound, Operation, Run, ToolCall

SEARCH_MAX = 50  # runs listed for a prefix; a longer list means the prefix is too short
RECENT_PAGE = 50
TIMELINE_EVENTS = 200  # events per timeline page: a round of a busy run is a few, a run hundreds
LONG_VALUE_CHARS = 300  # arguments, results and texts longer than this are folded in <details>
RUN_STATUSES = tuple(Run.Status.values)


def run_for_user(*, user, pk: int) -> Run | None:
    return Run.objects.filter(visible_to(user), pk=pk).select_related("tenant", "cursor").first()


def run_search(*, tenant_ids: list[int], q: str) -> tuple[list[Run], list[Run], bool]:
    """(runs whose run_id is q, runs whose run_id starts with q, whether the prefix list was cut)."""
    if not tenant_ids or not q:
        return [], [], False
    base = Run.objects.filter(tenant_id__in=tenant_ids).select_related("tenant", "cursor")
    exact = list(base.filter(run_id=q).order_by("-started_at", "-pk"))
    prefix = list(
        base.filter(run_id__startswith=q).exclude(run_id=q).order_by("run_id", "pk")[: SEARCH_MAX + 1]
    )
    return exact, prefix[:SEARCH_MAX], len(prefix) > SEARCH_MAX


def run_recent(
    *,
    tenant_ids: list[int],
    status: str = "",
    flagged: bool = False,
    detection_failed: bool = False,
    page: int = 1,
) -> tuple[list[Run], bool]:
    """A page of the most recent runs (by start), and whether there is a next page.
    detection_failed: only the runs whose detection is quarantined (ingest.models.RunCursor)."""
    if not tenant_ids:
        return [], False
    qs: QuerySet[Run] = Run.objects.filter(tenant_id__in=tenant_ids).select_related("tenant", "cursor")
    if status:
        qs = qs.filter(status=status)
    if flagged:
        qs = qs.filter(loop_flagged=True)
    if detection_failed:
        qs = qs.filter(cursor__failures__gt=0)
    start = (page - 1) * RECENT_PAGE
    rows = list(qs.order_by("-started_at", "-pk")[start : start + RECENT_PAGE + 1])
    return rows[:RECENT_PAGE], len(rows) > RECENT_PAGE


# --- one run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DetectionFailure:
    """Why detection is quarantined on a run (RunCursor), for its page."""

    error: str
    failures: int
    failed_at: datetime | None
    retry_at: datetime | None
    position: int


def run_detection_failure(*, run: Run) -> DetectionFailure | None:
    cursor = getattr(run, "cursor", None)
    if cursor is None or not cursor.failures:
        return None
    return DetectionFailure(
        error=cursor.error,
        failures=cursor.failures,
        failed_at=cursor.failed_at,
        retry_at=cursor.retry_at,
        position=cursor.position,
    )


def call_signature(config: Config, tool: str, args: Any) -> str:
    """The call's signature as the detection engine computes it (canonical arguments, noise and
    cursor fields left out, the tool's own noise/cursor/casefold settings applied)."""
    spec = config.tool(tool)
    clean = canonical(args if isinstance(args, dict) else {}, casefold=spec.casefold, noise=spec.noise_args)
    rest, _ = split_cursor(clean, CURSOR_KEYS | {c.lower() for c in spec.cursor_args})
    return digest([tool, rest])


@dataclass
class Budget:
    budget_type: str
    limit: float
    consumed: float
    source: str  # "run" (run_started.budgets) or "thresholds"

    @property
    def percent(self) -> int:
        if not self.limit:
            return 0
        share = 100 * self.consumed / self.limit
        # A use stored before the caps can be infinite (or NaN): round() of it raised.
        return min(100, round(share)) if math.isfinite(share) else 100


def run_budget_use(*, run: Run, config: Config) -> list[Budget]:
    """Every budget of the run: its limit (the run's own, else the thresholds') and what was used.

    Use is the engine's own count when the run has been through detection, else the run's figures.
    """
    limits = run_budgets(config.thresholds, run.budgets or {})
    state = _engine_state(run)
    figures = {
        "max_rounds": run.rounds,
        "max_tool_calls": run.tool_calls,
        "max_tokens": run.input_tokens + run.output_tokens,
        "max_cost_usd": round(run.cost_usd, 6),
        "max_same_tool_retries": 0,
        "max_wall_s": (
            round((run.last_event_at - run.started_at).total_seconds(), 3)
            if run.started_at and run.last_event_at
            else 0
        ),
    }
    out = []
    for budget_type in BUDGET_TYPES:
        used = consumed(state, budget_type) if state is not None else figures[budget_type]
        source = "run" if budget_type in (run.budgets or {}) else "thresholds"
        out.append(Budget(budget_type=budget_type, limit=limits[budget_type], consumed=used, source=source))
    return out


def _engine_state(run: Run) -> RunState | None:
    cursor = getattr(run, "cursor", None)
    if cursor is None or not cursor.engine_state:
        return None
    try:
        return RunState.from_dict(cursor.engine_state)
    except (TypeError, ValueError, KeyError):
        return None


@dataclass
class Item:
    """One line of the timeline: a model round, a tool call with its result, a user message, the
    run's start or end, or a detection that fired on an event not shown by itself."""

    seq: int
    round: int
    type: str
    obj: Any = None
    body: dict[str, Any] = field(default_factory=dict)
    detections: list[Detection] = field(default_factory=list)
    signature: str = ""
    signature_count: int = 0
    args_missing: bool = False
    args_text: str = ""
    result_text: str = ""
    args_pretty: str = ""
    result_pretty: str = ""
    new_round: bool = False
    anchors: list[int] = field(default_factory=list)


@dataclass
class Timeline:
    items: list[Item]
    first: int  # first seq of the page
    last: int  # last seq of the page
    total: int  # events of the run
    processed: int  # events detection has processed (the timeline shows those)
    counted: int  # events the run's figures count (RunCursor.figures_seq)
    previous: int | None
    next: int | None
    page_size: int


def run_timeline(*, run: Run, config: Config, start: int = 1, size: int = TIMELINE_EVENTS) -> Timeline:
    """Events [start, start + size) of the run, round by round, with each detection beside the event
    that made it fire (a call's result counts as the call)."""
    start = max(1, start)
    end = start + size - 1
    rounds = list(ModelRound.objects.filter(run=run, seq__range=(start, end)))
    calls = list(ToolCall.objects.filter(run=run, seq__range=(start, end)))
    others = list(
        Event.objects.filter(
            run=run, seq__range=(start, end), type__in=("run_started", "user_message", "run_finished")
        ).only("seq", "type", "body")
    )
    # The OTLP bridge marks a call whose span carried no arguments (they are recorded only when the
    # instrumentation opts in) with args_captured: false; only such calls have empty args to check.
    uncaptured = set(
        Event.objects.filter(
            run=run, seq__in=[c.seq for c in calls if not c.args], body__args_captured=False
        ).values_list("seq", flat=True)
    )
    detections = list(
        Detection.objects.filter(run=run, seq__range=(start, end))
        .select_related("feedback_by")
        .order_by("seq", "pk")
    )

    items: list[Item] = []
    by_seq: dict[int, Item] = {}
    for r in rounds:
        by_seq[r.seq] = Item(seq=r.seq, round=r.round, type="model_round", obj=r)
    for c in calls:
        item = Item(seq=c.seq, round=c.round, type="tool_call", obj=c)
        item.signature = call_signature(config, c.tool, c.args)
        item.args_missing = c.seq in uncaptured
        item.args_text = _compact(c.args)
        item.result_text = _compact(c.result) if c.result_seq is not None else ""
        # Long values are folded; unfolded, they read better indented.
        item.args_pretty = _pretty(c.args) if len(item.args_text) > LONG_VALUE_CHARS else ""
        item.result_pretty = _pretty(c.result) if len(item.result_text) > LONG_VALUE_CHARS else ""
        by_seq[c.seq] = item
        if c.result_seq is not None:
            by_seq.setdefault(c.result_seq, item)
            item.anchors.append(c.result_seq)
    for e in others:
        by_seq[e.seq] = Item(seq=e.seq, round=0, type=e.type, body=e.body)
    for d in detections:
        if (
            d.seq not in by_seq
        ):  # fired on an event not shown by itself (a result whose call is on another page)
            by_seq[d.seq] = Item(seq=d.seq, round=d.at_round, type="detection")
        by_seq[d.seq].detections.append(d)
    seen: set[int] = set()
    for seq in sorted(by_seq):
        item = by_seq[seq]
        if id(item) in seen:
            continue
        seen.add(id(item))
        items.append(item)
    # Round of events without one (messages, start, end): the round they happened in.
    current = 0
    previous_round = None
    for item in items:
        if item.round:
            current = item.round
        else:
            item.round = current
        item.new_round = item.round != previous_round
        previous_round = item.round
    counts = Counter(i.signature for i in items if i.signature)
    for item in items:
        if item.signature:
            item.signature_count = counts[item.signature]
    total = run.events_count
    cursor = getattr(run, "cursor", None)
    return Timeline(
        items=items,
        first=start,
        last=min(end, total),
        total=total,
        processed=cursor.position if cursor else 0,
        counted=cursor.figures_seq if cursor else 0,
        previous=max(1, start - size) if start > 1 else None,
        next=end + 1 if end < total else None,
        page_size=size,
    )


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def timeline_start_for(seq: int, size: int = TIMELINE_EVENTS) -> int:
    """The first seq of the page that holds `seq`."""
    return ((max(1, seq) - 1) // size) * size + 1


def run_operations(*, run: Run) -> list[Operation]:
    return list(Operation.objects.filter(run=run, tenant_id=run.tenant_id).order_by("created_at", "pk"))


def run_detections(*, run: Run) -> list[Detection]:
    """Every detection of the run, for the summary above the timeline (with links into it)."""
    return list(Detection.objects.filter(run=run).order_by("seq", "pk").defer("evidence")[:500])


# --- a run waiting for a person ---------------------------------------------------------------


def handoff_time(value: Any) -> datetime | None:
    """A timestamp of Run.handoff (ISO text) as a datetime in UTC; None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)


@dataclass(frozen=True)
class HandoffView:
    """What a page shows of Run.handoff: why the run asked, since when, and the answer if any."""

    at: datetime | None
    kind: str
    tool: str
    count: int
    hint: str
    proposed: str  # the call the guard was asked about, compact
    shown_at: str  # handoff.at as stored: the answer form sends it back
    answered_by: str = ""
    answered_at: datetime | None = None
    resumed: bool = False
    note: str = ""

    @property
    def answered(self) -> bool:
        return bool(self.answered_by)

    @property
    def reason(self) -> str:
        head = f"{self.kind} ({self.tool}, {self.count} times)" if self.tool and self.count else self.kind
        return f"{head}: {self.hint}" if head and self.hint else head or self.hint


def run_handoff_view(handoff: Any) -> HandoffView | None:
    if not isinstance(handoff, dict):
        return None
    resolved: dict[str, Any] = handoff["resolved"] if isinstance(handoff.get("resolved"), dict) else {}
    proposed = handoff.get("proposed")
    proposed_text = ""
    if isinstance(proposed, dict) and proposed.get("tool"):
        proposed_text = f"{proposed['tool']}({_compact(proposed.get('args', {}))})"
    count = handoff.get("count")
    return HandoffView(
        at=handoff_time(handoff.get("at")),
        kind=str(handoff.get("kind") or ""),
        tool=str(handoff.get("tool") or ""),
        count=count if isinstance(count, int) else 0,
        hint=str(handoff.get("hint") or ""),
        proposed=proposed_text,
        shown_at=str(handoff.get("at") or ""),
        answered_by=str(resolved.get("by") or ""),
        answered_at=handoff_time(resolved.get("at")),
        resumed=bool(resolved.get("resume")),
        note=str(resolved.get("note") or ""),
    )
