"""Signals are evidence; the policy turns them into actions, escalating on repeated evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ingest.detection.bounds import MAX_COUNT
from ingest.detection.bounds import count as bounded_count

ACTIONS = ("observe", "correct", "handoff", "terminate")
OBSERVE, CORRECT, HANDOFF, TERMINATE = 1, 2, 3, 4
KINDS = (
    "exact_repeat",
    "oscillation",
    "interval_loop",
    "perturbation",
    "repeated_error",
    "clarification",
    "monologue",
    "empty_responses",
    "no_progress",
    "poll_budget",
    "duplicate_write",
    "budget",
)


@dataclass(frozen=True)
class Detection:
    """One finding: what fired, what to do, where, and why."""

    kind: str
    action: str
    at_call: int
    at_round: int
    count: int
    signature: str = ""
    tool: str = ""
    hint: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Stored in integer columns: a wall clock of a century, or a count from a value that slipped
        # past the way in, must still fit (bounds.count clamps).
        for name in ("at_call", "at_round", "count"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_COUNT:
                object.__setattr__(self, name, bounded_count(value))

    @property
    def level(self) -> int:
        return ACTIONS.index(self.action) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "action": self.action,
            "at_call": self.at_call,
            "at_round": self.at_round,
            "count": self.count,
            "signature": self.signature,
            "tool": self.tool,
            "evidence": self.evidence,
            "hint": self.hint,
        }


def level_for(occurrence: int, first: int, every: int) -> int:
    """The action for the `occurrence`-th sighting of a problem that warrants a correction at `first`.

    observe just before it, correct at it, then one step up every `every` sightings.
    """
    if occurrence < first:
        return OBSERVE if occurrence == first - 1 else 0
    return min(CORRECT + (occurrence - first) // every, TERMINATE)


def action_name(level: int) -> str:
    return ACTIONS[level - 1]


def short(value: Any, limit: int = 120) -> str:
    import orjson

    text = value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"
