"""Demo traffic: generators of realistic agent runs as trace events v1.

Pure Python — no Django, no clock, no I/O — so the scenarios are tested as bare
functions and `manage.py simulate` (or a bench script) only has to send them.
Every scenario is a function `(rng, start, *, run_prefix) -> list[event dict]`:
one run, in the order a runtime would send it, every event with an `event_id`
unique to the run (so a resent batch is counted once by the server).

The mix (SCENARIOS, scenario_pick, run_generate) is mostly ordinary successful
runs with a long tail of round counts, then the loops docs/detection.md names, the
legitimate repetition a detector must not stop, budget truncations and writes
that time out. Each run carries its ground truth in two labels, `sim_scenario`
and `sim_expect` (`ok`, `loop`, `budget`, `unknown_write`), so detection rate and
false-kill rate can be measured on simulated traffic.

The package, in the order a run is made:

- `catalogue`: task types, round counts, budgets, backends, prices and the deployed agents;
- `content`: customers, products, articles, research topics, sentences;
- `plans`: what an ordinary run of each task type reads and writes (`Step`, `Plan`);
- `runs`: `RunBuilder`, a run under construction, which emits the events;
- `scenarios`: one function per scenario;
- `mix`: the weighted mix, `run_generate`.
"""

from __future__ import annotations

from demo.simulation.catalogue import (
    AGENT_CHANNELS,
    AGENTS,
    ROUNDS,
    TASK_BUDGETS,
    TASK_TYPES,
    Agent,
    rounds_sample,
)
from demo.simulation.mix import SCENARIOS, SCENARIOS_BY_NAME, Scenario, SimRun, run_generate, scenario_pick
from demo.simulation.plans import Plan, Step
from demo.simulation.runs import Event, RunBuilder
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

__all__ = [
    "AGENTS",
    "AGENT_CHANNELS",
    "ROUNDS",
    "SCENARIOS",
    "SCENARIOS_BY_NAME",
    "TASK_BUDGETS",
    "TASK_TYPES",
    "Agent",
    "Event",
    "Plan",
    "RunBuilder",
    "Scenario",
    "SimRun",
    "Step",
    "rounds_sample",
    "run_generate",
    "scenario_budget_exhausted",
    "scenario_failed_permission",
    "scenario_legit_double_purchase",
    "scenario_legit_paging",
    "scenario_legit_polling",
    "scenario_legit_transient_retry",
    "scenario_loop_arg_jitter",
    "scenario_loop_clarification",
    "scenario_loop_exact_repeat",
    "scenario_loop_oscillation",
    "scenario_loop_same_error",
    "scenario_normal",
    "scenario_pick",
    "scenario_user_abandoned",
    "scenario_write_timeout",
]
