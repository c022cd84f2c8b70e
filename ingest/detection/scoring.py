"""Detections scored against labelled runs: loops caught on time, late or missed; healthy runs
intervened on. Pure, like the rest of the engine: `manage.py replay --labels`, the real-corpus test
and the bench share it.

A label says whether a run loops and, for a loop, the point by which an intervention (`correct` or
stronger) must have fired: `flag_by_call`, the 1-based index of the run's `tool_call` events, or of
its `model_round` events when `count` is `"round"` (loops in the agent's words). A loop is caught
on time when the first intervention fired with at most that many such events seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ingest.detection.policy import CORRECT, Detection

LOOP_OUTCOMES = ("on_time", "late", "missed")
NO_KIND = "none"


@dataclass(frozen=True)
class Label:
    """What people who read the run said about it."""

    loop: bool
    kind: str = NO_KIND
    flag_by: int | None = None  # loops: tool calls (or model rounds) by which to intervene
    by_round: bool = False
    borderline: bool = False

    @classmethod
    def from_dict(cls, data: Any) -> Label:
        """From a labels file's entry; ValueError naming the field."""
        if not isinstance(data, dict):
            raise ValueError("must be an object")
        loop = data.get("loop")
        if not isinstance(loop, bool):
            raise ValueError("loop: must be true or false")
        kind = data.get("kind") or NO_KIND
        if not isinstance(kind, str):
            raise ValueError("kind: must be a string")
        flag_by = data.get("flag_by_call")
        if loop and (isinstance(flag_by, bool) or not isinstance(flag_by, int) or flag_by < 1):
            raise ValueError("flag_by_call: a loop needs a positive integer")
        count = data.get("count", "call")
        if count not in ("call", "round"):
            raise ValueError('count: must be "call" or "round"')
        return cls(
            loop=loop,
            kind=kind if loop else NO_KIND,
            flag_by=flag_by if loop else None,
            by_round=count == "round",
            borderline=bool(data.get("borderline", False)),
        )


class Position:
    """How many tool calls and model rounds a run has shown so far (labels count events)."""

    __slots__ = ("calls", "rounds")

    def __init__(self) -> None:
        self.calls = 0
        self.rounds = 0

    def see(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "tool_call":
            self.calls += 1
        elif kind == "model_round":
            self.rounds += 1


@dataclass(frozen=True)
class Fired:
    """A run's first intervention and where in the run it fired."""

    kind: str
    action: str
    calls: int  # tool_call events seen when it fired
    rounds: int  # model_round events seen

    @classmethod
    def first(cls, found: list[tuple[Detection, int, int]]) -> Fired | None:
        """The first intervention among (detection, calls seen, rounds seen), or None."""
        for detection, calls, rounds in found:
            if detection.level >= CORRECT:
                return cls(detection.kind, detection.action, calls, rounds)
        return None


def outcome(label: Label, first: Fired | None) -> str:
    """on_time / late / missed for a loop; intervened / quiet for a healthy run."""
    if not label.loop:
        return "intervened" if first is not None else "quiet"
    if first is None:
        return "missed"
    seen = first.rounds if label.by_round else first.calls
    return "on_time" if label.flag_by is not None and seen <= label.flag_by else "late"


@dataclass
class Tally:
    """Counts of one source or one kind, with the run ids behind every count but the good ones."""

    loops: int = 0
    on_time: int = 0
    late: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    healthy: int = 0
    intervened: list[str] = field(default_factory=list)

    def add(self, run_id: str, result: str) -> None:
        if result in LOOP_OUTCOMES:
            self.loops += 1
            if result == "on_time":
                self.on_time += 1
            else:
                getattr(self, result).append(run_id)
        elif result == "intervened":
            self.healthy += 1
            self.intervened.append(run_id)
        else:
            self.healthy += 1

    @property
    def recall(self) -> float | None:
        return self.on_time / self.loops if self.loops else None

    @property
    def false_rate(self) -> float | None:
        return len(self.intervened) / self.healthy if self.healthy else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "loops": self.loops,
            "on_time": self.on_time,
            "late": len(self.late),
            "missed": len(self.missed),
            "recall": self.recall,
            "healthy": self.healthy,
            "intervened": len(self.intervened),
            "false_rate": self.false_rate,
            "late_runs": self.late,
            "missed_runs": self.missed,
            "intervened_runs": self.intervened,
        }


@dataclass
class RunScore:
    run_id: str
    source: str
    label: Label
    first: Fired | None
    result: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "source": self.source,
            "loop": self.label.loop,
            "label_kind": self.label.kind,
            "flag_by": self.label.flag_by,
            "count": "round" if self.label.by_round else "call",
            "outcome": self.result,
            "first": None
            if self.first is None
            else {
                "kind": self.first.kind,
                "action": self.first.action,
                "calls": self.first.calls,
                "rounds": self.first.rounds,
            },
        }


@dataclass
class Scoreboard:
    """Per source, per kind (the label's for loops, the first intervention's for healthy runs) and
    in all."""

    total: Tally = field(default_factory=Tally)
    sources: dict[str, Tally] = field(default_factory=dict)
    kinds: dict[str, Tally] = field(default_factory=dict)
    runs: list[RunScore] = field(default_factory=list)

    def add(self, *, run_id: str, source: str, label: Label, first: Fired | None) -> RunScore:
        result = outcome(label, first)
        score = RunScore(run_id, source, label, first, result)
        self.runs.append(score)
        self.total.add(run_id, result)
        self.sources.setdefault(source, Tally()).add(run_id, result)
        if label.loop:
            self.kinds.setdefault(label.kind, Tally()).add(run_id, result)
        elif first is not None:
            self.kinds.setdefault(first.kind, Tally()).add(run_id, result)
        return score

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total.as_dict(),
            "sources": {name: t.as_dict() for name, t in sorted(self.sources.items())},
            "kinds": {name: t.as_dict() for name, t in sorted(self.kinds.items())},
            "runs": [r.as_dict() for r in self.runs],
        }


def run_source(events: list[dict[str, Any]]) -> str:
    """Which source a run is scored under: run_started.labels.source, else its agent."""
    for event in events:
        if event.get("type") == "run_started":
            labels = event.get("labels")
            source = labels.get("source") if isinstance(labels, dict) else None
            if isinstance(source, str) and source:
                return source
            agent = event.get("agent")
            return agent if isinstance(agent, str) and agent else "-"
    return "-"
