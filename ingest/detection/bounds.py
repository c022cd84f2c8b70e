"""Bounds on the engine's counts and sums, whatever an event holds.

The way in refuses numbers past their caps (docs/limits.md), but events stored before it did, and
callers that skip it (replaying a file, the simulator), still reach the engine. A count here always
fits the integer columns detections are stored in, and a sum stays a finite number that orjson
writes (it refuses integers past 64 bits; JSON has no infinity).
"""

from __future__ import annotations

import math
from typing import Any

MAX_COUNT = 2**31 - 1  # Detection.count, at_call, at_round: PostgreSQL integer columns
MAX_TOTAL = 2**53  # a sum of counts (tokens): exact as a float too, far inside 64 bits
MAX_TOTAL_USD = 1e15  # a sum of costs: finite, and past any budget anyone sets


def count(value: Any) -> int:
    """A count from 0 to MAX_COUNT: a number clamped (infinity to the top), anything else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float):
        if math.isnan(value):
            return 0
        value = min(max(value, 0.0), float(MAX_COUNT))
    return int(min(max(value, 0), MAX_COUNT))


def total(current: int, value: Any) -> int:
    """current + count(value), at most MAX_TOTAL."""
    return min(current + count(value), MAX_TOTAL)


def amount_add(current: float, value: Any) -> float:
    """current + a non-negative finite amount (money), at most MAX_TOTAL_USD. An infinite or huge
    amount counts as the cap (a budget on it must still fire); a negative one, NaN or a value that
    is not a number, as nothing."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return current
    return min(current + min(float(value), MAX_TOTAL_USD), MAX_TOTAL_USD)
