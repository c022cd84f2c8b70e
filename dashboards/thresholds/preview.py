"""What a threshold change would have done: the last stored runs replayed with both configurations.

Reads only. The engine is pure and runs in this process; nothing is stored, no task is queued.
Within a time budget (a web process must not replay for minutes): the runs not replayed by then
are left out of the figures, and the preview says it was cut short.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from ingest.detection import ACTIONS, Config, Detection, Engine, RunState
from ingest.models import Detection as StoredDetection
from ingest.models import Event, ModelRound, Run

PREVIEW_RUNS = 200  # the default: enough for a signal, about a second of replay on this machine
PREVIEW_MAX_RUNS = 1000  # past this the page would wait too long; bench/ measures the figures
INTERVENTION = ("correct", "handoff", "terminate")
PREVIEW_BUDGET_S = 10.0  # the default; LOOPWATCH_PREVIEW_BUDGET_MS sets the pages' (docs/limits.md)
RUNS_PER_READ = 25  # runs whose events are read at once: the clock is looked at between reads
CLOCK_EVERY = 256  # events replayed between two looks at the clock


@dataclass(frozen=True)
class First:
    """A run's first intervention and its strongest action."""

    kind: str
    action: str
    at_round: int
    at_call: int
    strongest: str

    @property
    def label(self) -> str:
        return f"{self.action} ({self.kind}) at round {self.at_round}, call {self.at_call}"


@dataclass(frozen=True)
class RunChange:
    run: Run
    change: str  # gains | loses | earlier | later | stronger | weaker
    before: First | None
    after: First | None
    feedback: str  # "", "false_alarm", "true_loop" (operators' word on the run's stored detections)


@dataclass
class Preview:
    runs: int = 0
    replayed: int = 0  # runs whose configuration differs (the others cannot change: not replayed)
    events: int = 0
    before_interventions: int = 0  # of the replayed runs
    after_interventions: int = 0
    changes: list[RunChange] = field(default_factory=list)
    feedback_runs: dict[str, int] = field(default_factory=dict)
    # Of the replayed runs with operators' feedback: (feedback, intervened now, would intervene).
    verdicts: list[tuple[str, bool, bool]] = field(default_factory=list)
    elapsed_ms: float = 0.0
    # The time budget ran out: only `done` of the `replayed` runs were replayed (the figures are theirs).
    cut_short: bool = False
    done: int = 0
    budget_s: float = PREVIEW_BUDGET_S

    def count(self, change: str) -> int:
        return sum(1 for c in self.changes if c.change == change)

    @property
    def count_gains(self) -> int:
        return self.count("gains")

    @property
    def count_loses(self) -> int:
        return self.count("loses")

    @property
    def count_moved(self) -> int:
        return sum(1 for c in self.changes if c.change not in ("gains", "loses"))

    @property
    def false_alarms_still_firing(self) -> int:
        return sum(1 for f, _, after in self.verdicts if f == "false_alarm" and after)

    @property
    def true_loops_still_caught(self) -> int:
        return sum(1 for f, _, after in self.verdicts if f == "true_loop" and after)

    @property
    def false_alarms_fixed(self) -> int:
        return sum(1 for c in self.changes if c.feedback == "false_alarm" and c.change == "loses")

    @property
    def true_loops_lost(self) -> int:
        return sum(1 for c in self.changes if c.feedback == "true_loop" and c.change == "loses")


def _first(found: list[Detection]) -> First | None:
    interventions = [d for d in found if d.action in INTERVENTION]
    if not interventions:
        return None
    first = interventions[0]
    strongest = max(interventions, key=lambda d: d.level).action
    return First(first.kind, first.action, first.at_round, first.at_call, strongest)


def _compare(before: First | None, after: First | None) -> str:
    if before is None and after is None:
        return ""
    if before is None:
        return "gains"
    if after is None:
        return "loses"
    if (after.at_round, after.at_call) != (before.at_round, before.at_call):
        return "earlier" if (after.at_round, after.at_call) < (before.at_round, before.at_call) else "later"
    level_before, level_after = ACTIONS.index(before.strongest), ACTIONS.index(after.strongest)
    if level_after != level_before:
        return "stronger" if level_after > level_before else "weaker"
    return ""


def _events(run_pks: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Each run's stored events in order, with the round costs detection counted (priced at ingest)."""
    costs = {
        (run_pk, seq): cost
        for run_pk, seq, cost in ModelRound.objects.filter(run_id__in=run_pks).values_list(
            "run_id", "seq", "cost_usd"
        )
    }
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    rows = (
        Event.objects.filter(run_id__in=run_pks)
        .order_by("run_id", "seq")
        .values_list("run_id", "seq", "type", "body")
    )
    for run_pk, seq, kind, body in rows.iterator(chunk_size=5000):
        if kind == "model_round" and "cost_usd" not in body and (run_pk, seq) in costs:
            body["cost_usd"] = costs[(run_pk, seq)]
        out[run_pk].append(body)
    return out


def _replay(events: list[dict[str, Any]], config: Config, deadline: float) -> list[Detection] | None:
    """The engine's replay_run, looking at the clock every CLOCK_EVERY events: None past deadline."""
    engine, state = Engine(config), RunState()
    found: list[Detection] = []
    for i, event in enumerate(events):
        if i % CLOCK_EVERY == 0 and time.perf_counter() > deadline:
            return None
        found += engine.feed(state, event)
    return found


def preview_replay(
    *,
    runs: QuerySet[Run],
    limit: int,
    current: Callable[[Run], Config],
    proposed: Callable[[Run], Config],
    budget_s: float = PREVIEW_BUDGET_S,
) -> Preview:
    """Replay the last `limit` runs of `runs` with the current and the proposed configuration, for
    `budget_s` seconds at most (then `cut_short`, the figures those of the runs replayed)."""
    started = time.perf_counter()
    deadline = started + budget_s
    picked = list(
        runs.order_by("-started_at", "-pk").only(
            "pk", "run_id", "backend", "model", "task_type", "agent", "status"
        )[:limit]
    )
    preview = Preview(runs=len(picked), budget_s=budget_s)
    differing = [(run, current(run), proposed(run)) for run in picked]
    differing = [(run, now, new) for run, now, new in differing if now != new]
    preview.replayed = len(differing)
    feedback: dict[int, str] = {}
    for run_pk, value in (
        StoredDetection.objects.filter(run_id__in=[r.pk for r in picked])
        .exclude(feedback="")
        .values_list("run_id", "feedback")
    ):
        # A run an operator called a true loop anywhere counts as one; else a false alarm.
        if feedback.get(run_pk) != StoredDetection.Feedback.TRUE_LOOP:
            feedback[run_pk] = value
    for value in feedback.values():
        label = StoredDetection.Feedback(value).label
        preview.feedback_runs[label] = preview.feedback_runs.get(label, 0) + 1
    events: dict[int, list[dict[str, Any]]] = {}
    for i, (run, now, new) in enumerate(differing):
        if i % RUNS_PER_READ == 0:
            if time.perf_counter() > deadline:
                preview.cut_short = True
                break
            events = _events([r.pk for r, _, _ in differing[i : i + RUNS_PER_READ]])
        run_events = events.get(run.pk, [])
        # The engine never mutates the events, so both replays can share them.
        found_before = _replay(run_events, now, deadline)
        found_after = _replay(run_events, new, deadline) if found_before is not None else None
        if found_before is None or found_after is None:
            preview.cut_short = True
            break
        preview.done += 1
        preview.events += len(run_events)
        before, after = _first(found_before), _first(found_after)
        preview.before_interventions += before is not None
        preview.after_interventions += after is not None
        change = _compare(before, after)
        if run.pk in feedback:
            preview.verdicts.append((feedback[run.pk], before is not None, after is not None))
        if change:
            preview.changes.append(RunChange(run, change, before, after, feedback.get(run.pk, "")))
    order = {"loses": 0, "gains": 1, "earlier": 2, "later": 3, "stronger": 4, "weaker": 5}
    preview.changes.sort(key=lambda c: (c.feedback == "", order[c.change], c.run.run_id))
    preview.elapsed_ms = (time.perf_counter() - started) * 1000
    return preview
