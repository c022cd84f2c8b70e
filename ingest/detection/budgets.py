"""Budgets: the first one exhausted ends the run, with a structured diagnosis."""

from __future__ import annotations

from typing import Any

from ingest.detection import bounds
from ingest.detection.config import BUDGET_TYPES, Thresholds
from ingest.detection.policy import Detection
from ingest.detection.state import RunState

_UNITS = {
    "max_rounds": "model rounds",
    "max_tool_calls": "tool calls",
    "max_same_tool_retries": "retries of the same tool",
    "max_tokens": "tokens",
    "max_cost_usd": "USD",
    "max_wall_s": "seconds",
}


def run_budgets(t: Thresholds, overrides: dict[str, Any]) -> dict[str, float]:
    """The run's limits: the thresholds' defaults, replaced by run_started.budgets where given."""
    limits = {name: getattr(t, name) for name in BUDGET_TYPES}
    for name, value in overrides.items():
        if name in limits and isinstance(value, int | float) and not isinstance(value, bool):
            limits[name] = value
    return limits


def consumed(state: RunState, budget_type: str) -> float:
    if budget_type == "max_rounds":
        return state.round
    if budget_type == "max_tool_calls":
        return state.calls
    if budget_type == "max_same_tool_retries":
        return state.retries
    if budget_type == "max_tokens":
        return state.tokens
    if budget_type == "max_cost_usd":
        return round(state.cost_usd, 6)
    if state.start_ts is None or state.last_ts is None:
        return 0.0
    return round(state.last_ts - state.start_ts, 3)


def check_budgets(t: Thresholds, state: RunState) -> list[Detection]:
    for budget_type in BUDGET_TYPES:
        limit = state.budgets.get(budget_type)
        if limit is None or budget_type in state.budget_fired:
            continue
        used = consumed(state, budget_type)
        if used < limit:
            continue
        state.budget_fired.append(budget_type)
        since = state.step - state.last_progress_step
        hint = f"Budget {budget_type} exhausted: {used:g} of {limit:g} {_UNITS[budget_type]}."
        if since > 0:
            hint += f" No progress in the last {since} steps."
        return [
            Detection(
                kind="budget",
                action="terminate",
                at_call=state.calls,
                at_round=state.round,
                count=bounds.count(used),
                hint=hint,
                evidence={
                    "terminated_by": "budget",
                    "budget_type": budget_type,
                    "limit": limit,
                    "consumed": used,
                    "last_progress_step": state.last_progress_step,
                    "hint": hint,
                },
            )
        ]
    return []
