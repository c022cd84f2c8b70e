"""Thresholds and tool descriptions: every default in one place, with the reason beside it.

The engine takes a resolved `Config`; where the values come from (database rows per backend,
model and task type, or a replay's thresholds file) is the caller's business.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

BUDGET_TYPES = (
    "max_rounds",
    "max_tool_calls",
    "max_same_tool_retries",
    "max_tokens",
    "max_cost_usd",
    "max_wall_s",
)
NON_RETRYABLE = ("invalid_argument", "permission", "not_found", "empty_result", "parse_error")
RETRYABLE = ("transient", "rate_limited")


@dataclass(frozen=True)
class Thresholds:
    """Conservative defaults: a legitimate run must never be interrupted by them."""

    # Identical read with an unchanged result: observe the 2nd (may be a retry), correct the 3rd.
    repeat_tolerance: int = 3
    # Occurrences of a problem after its first correction before the next step up (handoff, terminate).
    escalate_every: int = 2
    # A->B->A->B: full cycles of unchanged results before a correction.
    oscillation_cycles: int = 3
    # Near-identical calls of one tool that bring nothing new, in a row, before a correction.
    perturbation_calls: int = 3
    # How alike two argument sets must be (0..1) to count as the same request nudged.
    similarity: float = 0.85
    # Identical failures of a non-retryable class before a correction (the issue: the 2nd).
    error_repeats: int = 2
    # Retries a transient/rate-limited failure gets before a correction naming backoff.
    transient_retries: int = 2
    # Failures of class `other`: unknown, so one more than the non-retryable ones.
    other_error_repeats: int = 3
    # Steps (calls, or rounds when counting by round) in a row without progress.
    no_progress_steps: int = 10
    # A poll repeating one signature without any change in its result: count and wall-clock budget.
    poll_max_unchanged: int = 15
    poll_max_wall_s: float = 900.0
    # The same question to the user again (similarity 0..1), and repeated announcements without action.
    text_similarity: float = 0.85
    monologue_repeats: int = 2
    # Announcements ("let me…", "I will…") in a row without a tool call, worded differently.
    announcement_rounds: int = 3
    # Questions to the user in a row, each answered, about the same thing, without a tool call.
    question_rounds: int = 3
    empty_rounds: int = 3
    # Calls for one goal (tool + core arguments, cursors left out) in one run.
    max_goal_calls: int = 60
    # Windows: parallel calls of one round count as one step when true (some backends batch).
    count_by_round: bool = False
    # Global budgets; run_started.budgets overrides them per run.
    max_rounds: int = 150
    max_tool_calls: int = 300
    # The same call again right away, or a call of a tool right after it failed (above poll_max_unchanged).
    max_same_tool_retries: int = 20
    max_tokens: int = 5_000_000
    max_cost_usd: float = 25.0
    max_wall_s: float = 6 * 3600.0

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """What is wrong with these values, as `field: reason`."""
        out = []
        if self.repeat_tolerance < 2:
            out.append("repeat_tolerance: must be at least 2 (the 2nd identical call may be a retry)")
        for name in (
            "escalate_every",
            "oscillation_cycles",
            "perturbation_calls",
            "error_repeats",
            "empty_rounds",
        ):
            if getattr(self, name) < 1:
                out.append(f"{name}: must be at least 1")
        if self.oscillation_cycles < 2:
            out.append("oscillation_cycles: must be at least 2")
        for name in ("similarity", "text_similarity"):
            if not 0.5 <= getattr(self, name) <= 1.0:
                out.append(f"{name}: must be between 0.5 and 1")
        for name in (
            "no_progress_steps",
            "poll_max_unchanged",
            "max_goal_calls",
            "max_rounds",
            "max_tool_calls",
        ):
            if getattr(self, name) < 2:
                out.append(f"{name}: must be at least 2")
        for name in ("poll_max_wall_s", "max_cost_usd", "max_wall_s", "max_tokens"):
            if getattr(self, name) <= 0:
                out.append(f"{name}: must be positive")
        return out

    def merged(self, overrides: dict[str, Any]) -> Thresholds:
        """These thresholds with some values replaced; unknown names are an error."""
        known = {f.name: f for f in fields(self)}
        clean: dict[str, Any] = {}
        for name, value in overrides.items():
            if name not in known:
                raise ValueError(f"{name}: not a threshold")
            wanted = type(getattr(self, name))
            if wanted is bool:
                if not isinstance(value, bool):
                    raise ValueError(f"{name}: must be true or false")
            elif wanted is float:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"{name}: must be a number")
                value = float(value)
            elif wanted is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name}: must be an integer")
            clean[name] = value
        return replace(self, **clean)


@dataclass(frozen=True)
class ToolSpec:
    """What the engine knows of one tool; every field optional."""

    kind: str = ""  # read | write | poll | other: used when the tool_call does not say
    core_args: tuple[str, ...] = ()  # the arguments that say what is asked; empty: all of them
    noise_args: tuple[str, ...] = ()  # dropped from the signature, beyond the usual noise
    cursor_args: tuple[str, ...] = ()  # beyond the usual page/offset/cursor/start/after/since
    casefold: bool = False  # compare string arguments without case

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolSpec:
        """From JSON; a wrong type is a ValueError naming the field."""
        if data.get("kind", "") not in ("", "read", "write", "poll", "other"):
            raise ValueError("kind: must be read, write, poll or other")
        for name in ("core_args", "noise_args", "cursor_args"):
            value = data.get(name, [])
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name}: must be a list of argument names")
        if not isinstance(data.get("casefold", False), bool):
            raise ValueError("casefold: must be true or false")
        return cls(
            kind=str(data.get("kind", "")),
            core_args=tuple(data.get("core_args", ())),
            noise_args=tuple(data.get("noise_args", ())),
            cursor_args=tuple(data.get("cursor_args", ())),
            casefold=bool(data.get("casefold", False)),
        )


@dataclass(frozen=True)
class Config:
    thresholds: Thresholds = field(default_factory=Thresholds)
    tools: dict[str, ToolSpec] = field(default_factory=dict)

    def tool(self, name: str) -> ToolSpec:
        return self.tools.get(name) or _NO_SPEC


_NO_SPEC = ToolSpec()
DEFAULT_CONFIG = Config()
