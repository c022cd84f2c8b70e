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
# Rollout modes of a detection kind: `shadow` records what it would have done (stored as observe,
# never acted on), `correct-only` gives hints but never hands off or terminates, `full` escalates.
MODES = ("shadow", "correct-only", "full")
MODE_PREFIX = "mode_"
# A tool's description (ToolSpec.from_dict): the kinds a tool_call may say, the argument lists.
TOOL_KINDS = ("read", "write", "poll", "other")
TOOL_LISTS = ("core_args", "noise_args", "cursor_args")
TOOL_FIELDS = ("kind", *TOOL_LISTS, "casefold")


@dataclass(frozen=True)
class Thresholds:
    """Conservative defaults: a legitimate run must never be interrupted by them."""

    # Identical read with an unchanged result: observe the 2nd (may be a retry), correct the 3rd.
    repeat_tolerance: int = 3
    # The same for a call that acts (write without an idempotency key, other): a runtime re-sends an
    # action it cannot confirm, and three identical sends that then stop are common in real runs.
    action_repeat_tolerance: int = 4
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
    # Retries a transient/rate-limited failure gets before a correction naming backoff (one try
    # and three retries, as common retry policies do).
    transient_retries: int = 3
    # Failures of class `other`: unknown, so one more than the non-retryable ones.
    other_error_repeats: int = 3
    # Steps (calls, or rounds when counting by round) in a row without progress.
    no_progress_steps: int = 10
    # A poll repeating one signature without any change in its result: count and wall-clock budget.
    poll_max_unchanged: int = 15
    poll_max_wall_s: float = 900.0
    # The same request to the user again after they answered it (similarity 0..1); the same text
    # again while the user brings nothing new.
    text_similarity: float = 0.85
    monologue_repeats: int = 2
    # Announcements ("let me…", "I will…") in a row without a tool call or news from the user.
    announcement_rounds: int = 3
    # Requests to the user in a row that the user answers only by repeating themselves.
    question_rounds: int = 3
    empty_rounds: int = 3
    # The same message from the harness (not the user: "No tool calls found…") in a row: the model's
    # replies keep being rejected for the same reason.
    harness_repeats: int = 5
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
    # Rollout mode per detection kind (see MODES). Kinds whose interventions were wrong too often on
    # recorded real runs start in shadow: they are measured (operators' verdicts) before they act.
    mode_exact_repeat: str = "full"
    mode_oscillation: str = "full"
    mode_interval_loop: str = "full"
    mode_perturbation: str = "full"
    mode_repeated_error: str = "full"
    mode_clarification: str = "full"
    mode_monologue: str = "full"
    mode_empty_responses: str = "full"
    mode_no_progress: str = "full"
    mode_poll_budget: str = "full"
    mode_duplicate_write: str = "full"
    mode_budget: str = "full"

    def mode(self, kind: str) -> str:
        """The rollout mode of a detection kind; a kind without its own field is in shadow."""
        return getattr(self, MODE_PREFIX + kind, "shadow")

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """What is wrong with these values, as `field: reason`."""
        out = []
        for name in ("repeat_tolerance", "action_repeat_tolerance"):
            if getattr(self, name) < 2:
                out.append(f"{name}: must be at least 2 (the 2nd identical call may be a retry)")
        for f in fields(self):
            if f.name.startswith(MODE_PREFIX) and getattr(self, f.name) not in MODES:
                out.append(f"{f.name}: must be one of {', '.join(MODES)}")
        for name in (
            "escalate_every",
            "oscillation_cycles",
            "perturbation_calls",
            "error_repeats",
            "empty_rounds",
            "harness_repeats",
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
            elif wanted is str and value not in MODES:
                raise ValueError(f"{name}: must be one of {', '.join(MODES)}")
            clean[name] = value
        return replace(self, **clean)


@dataclass(frozen=True)
class ToolSpec:
    """What the engine knows of one tool; every field optional."""

    # read | write | poll | other: used when the tool_call does not say; "": inferred (kinds.py)
    kind: str = ""
    core_args: tuple[str, ...] = ()  # the arguments that say what is asked; empty: all of them
    noise_args: tuple[str, ...] = ()  # dropped from the signature, beyond the usual noise
    cursor_args: tuple[str, ...] = ()  # beyond the usual page/offset/cursor/start/after/since
    casefold: bool = False  # compare string arguments without case

    @classmethod
    def from_dict(cls, data: object) -> ToolSpec:
        """From JSON: a tool row, a replay's tools file or the tool form all come through here.

        A problem is a ValueError `field: reason` naming the first wrong field: not an object, an
        unknown field, a kind not in TOOL_KINDS, a list that is not of non-empty argument names.
        """
        if not isinstance(data, dict):
            raise ValueError(": must be an object")
        for key, value in data.items():
            if key not in TOOL_FIELDS:
                raise ValueError(f"{key}: not a tool field (known: {', '.join(TOOL_FIELDS)})")
            if key == "kind" and value not in ("", *TOOL_KINDS):
                raise ValueError(f"kind: must be one of {', '.join(TOOL_KINDS)}")
            if key in TOOL_LISTS and (
                not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value)
            ):
                raise ValueError(f"{key}: must be a list of argument names")
            if key == "casefold" and not isinstance(value, bool):
                raise ValueError("casefold: must be true or false")
        return cls(
            kind=data.get("kind", ""),
            core_args=tuple(data.get("core_args", ())),
            noise_args=tuple(data.get("noise_args", ())),
            cursor_args=tuple(data.get("cursor_args", ())),
            casefold=data.get("casefold", False),
        )


@dataclass(frozen=True)
class Config:
    thresholds: Thresholds = field(default_factory=Thresholds)
    tools: dict[str, ToolSpec] = field(default_factory=dict)

    def tool(self, name: str) -> ToolSpec:
        return self.tools.get(name) or _NO_SPEC


_NO_SPEC = ToolSpec()
DEFAULT_CONFIG = Config()
