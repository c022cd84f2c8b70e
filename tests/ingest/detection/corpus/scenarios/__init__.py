"""The corpus's scenarios, one module per family.

A family's scenarios are the `Scenario` objects its module declares (`@loop(...)` / `@ok(...)` over
a play function), in the order it declares them. The README lists the loops, then the legitimate
runs, family by family in the order of `FAMILIES`.
"""

from __future__ import annotations

from types import ModuleType

from tests.ingest.detection.corpus.builder import Scenario
from tests.ingest.detection.corpus.scenarios import (
    budgets,
    conversation,
    duplicate_writes,
    errors,
    exploration,
    interval,
    near_misses,
    no_progress,
    oscillation,
    paging,
    perturbation,
    polling,
    repeats,
    writes,
)

FAMILIES: tuple[ModuleType, ...] = (
    repeats,
    oscillation,
    interval,
    perturbation,
    errors,
    conversation,
    no_progress,
    polling,
    duplicate_writes,
    budgets,
    paging,
    writes,
    exploration,
    near_misses,
)


def scenarios_all() -> list[Scenario]:
    """Every scenario, family by family, each family's in the order its module declares them."""
    return [value for family in FAMILIES for value in vars(family).values() if isinstance(value, Scenario)]
