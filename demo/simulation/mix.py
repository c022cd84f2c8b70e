"""The mix: which scenario a generated run comes from, by weight."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from demo.simulation.runs import Event
from demo.simulation.scenarios import (
    scenario_budget_exhausted,
    scenario_failed_permission,
    scenario_legit_double_purchase,
    scenario_legit_paging,
    scenario_legit_polling,
    scenario_legit_transient_retry,
    scenario_loop_arg_jitter,
    scenario_loop_clarification,
    scenario_loop_exact_repeat,
    scenario_loop_oscillation,
    scenario_loop_same_error,
    scenario_normal,
    scenario_user_abandoned,
    scenario_write_timeout,
)

ScenarioFn = Callable[..., list[Event]]


@dataclass(frozen=True)
class Scenario:
    """A named scenario, its weight in the mix and what a detector should make of it."""

    name: str
    fn: ScenarioFn
    weight: int
    expect: str


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("normal", scenario_normal, 45, "ok"),
    Scenario("failed_permission", scenario_failed_permission, 3, "ok"),
    Scenario("user_abandoned", scenario_user_abandoned, 2, "ok"),
    Scenario("loop_exact_repeat", scenario_loop_exact_repeat, 5, "loop"),
    Scenario("loop_oscillation", scenario_loop_oscillation, 4, "loop"),
    Scenario("loop_arg_jitter", scenario_loop_arg_jitter, 5, "loop"),
    Scenario("loop_same_error", scenario_loop_same_error, 4, "loop"),
    Scenario("loop_clarification", scenario_loop_clarification, 3, "loop"),
    Scenario("budget_exhausted", scenario_budget_exhausted, 5, "budget"),
    Scenario("legit_polling", scenario_legit_polling, 6, "ok"),
    Scenario("legit_paging", scenario_legit_paging, 6, "ok"),
    Scenario("legit_double_purchase", scenario_legit_double_purchase, 3, "ok"),
    Scenario("legit_transient_retry", scenario_legit_transient_retry, 5, "ok"),
    Scenario("write_timeout", scenario_write_timeout, 4, "unknown_write"),
)
SCENARIOS_BY_NAME: dict[str, Scenario] = {s.name: s for s in SCENARIOS}


@dataclass(frozen=True)
class SimRun:
    """One generated run: the scenario it came from and its events in sending order."""

    scenario: str
    run_id: str
    events: list[Event]


def scenario_pick(rng: random.Random) -> Scenario:
    return rng.choices(SCENARIOS, weights=[s.weight for s in SCENARIOS])[0]


def run_generate(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> SimRun:
    """A run of a scenario picked from the weighted mix."""
    scenario = scenario_pick(rng)
    events = scenario.fn(rng, start, run_prefix=run_prefix)
    return SimRun(scenario=scenario.name, run_id=events[0]["run_id"], events=events)
