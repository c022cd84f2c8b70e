"""Validation of trace events v1 (docs/trace-events.md, ingest/spec/trace-events.schema.json).

Hand-written rather than a JSON Schema engine: it is on the hot path (a few
microseconds an event) and its messages name the field path and the reason the
way a client needs them: `[3].args: must be an object`. A test checks it
against trace-events.schema.json on generated events.

The limits of docs/limits.md keep every accepted event storable, readable and
cheap to process, whoever sent it: integers at most 2**31-1 (the database
column), numbers finite and capped (a cost of 1e308 overflowed every sum it
entered), `ts` with an offset within ±14:00 and a year from 2000 to 2100 (an
offset of +20:00 or a year 0001 with an offset is stored, then unreadable), and
no value nested deeper than MAX_DEPTH (orjson cannot write past 255 levels, and
each level is a recursion somewhere). The JSON Schema says the same where it
can; two checks it cannot say: nesting depth, and no string may hold U+0000
(PostgreSQL's jsonb cannot store it).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Any

from ingest.detection.config import TOOL_KINDS

EVENT_TYPES = ("run_started", "user_message", "model_round", "tool_call", "tool_result", "run_finished")
RESULT_STATUSES = ("ok", "error", "timeout")
ERROR_CLASSES = (
    "transient",
    "rate_limited",
    "invalid_argument",
    "permission",
    "not_found",
    "parse_error",
    "empty_result",
    "other",
)
RUN_STATUSES = ("succeeded", "failed", "truncated", "abandoned")
TERMINATED_BY = ("budget", "loop", "user", "error")
BUDGET_KEYS = (
    "max_rounds",
    "max_tool_calls",
    "max_same_tool_retries",
    "max_tokens",
    "max_cost_usd",
    "max_wall_s",
)
MAX_INT = 2**31 - 1  # the database's integer column
# Caps on the numbers the pipeline sums (docs/limits.md): far above any real value, far below where
# a sum of them could overflow (2**31 events of each cap is still a finite float).
MAX_COST_USD = 1_000_000  # one model round's cost
MAX_BUDGET = 1_000_000_000  # budgets.max_cost_usd (USD) and budgets.max_wall_s (about 31 years)
MAX_LATENCY_MS = 10_000_000_000  # one tool call (about 115 days)
# Objects and arrays inside an event nest at most this deep (the event itself not counted).
MAX_DEPTH = 64
TS_YEARS = (2000, 2100)  # a `ts` is written with a year in this range, both included
MAX_OFFSET = timedelta(hours=14)  # the widest offset in use (Kiribati, UTC+14:00)

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
# The same, within the limits: the year from TS_YEARS, the offset within MAX_OFFSET, each field in its
# range (so that text generated from the JSON Schema's `pattern`, which this is, is nearly always a
# valid date-time too). What it refuses, the full check explains (_ts_problem).
TS_PATTERN = (
    r"^(?:20\d{2}|2100)-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])[Tt ](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d"
    r"(?:\.\d+)?(?:[Zz]|[+-](?:0\d|1[0-3]):[0-5]\d|[+-]14:00)$"
)
_TS_WITHIN = re.compile(TS_PATTERN)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Errors = list[tuple[str, str]]


class EventError(Exception):
    """One field of one event is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def parse_ts(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (with its offset) as an aware datetime, or None. Not the limits: this
    reads what is stored too (check_ts checks what comes in)."""
    if not isinstance(value, str) or not _RFC3339.match(value):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def check_ts(value: Any, field: str = "ts") -> datetime:
    """A `ts` that comes in, parsed; EventError when it is not RFC 3339 or outside the limits."""
    ts = parse_ts(value)
    if ts is None:
        raise EventError(field, "must be an RFC 3339 timestamp with an offset, like 2026-11-29T10:00:00Z")
    if not _TS_WITHIN.match(value):
        raise EventError(field, _ts_problem(ts))
    return ts


def _ts_problem(ts: datetime) -> str:
    offset = ts.utcoffset() or timedelta(0)
    if abs(offset) > MAX_OFFSET:
        sign, size = ("-", -offset) if offset < timedelta(0) else ("+", offset)
        hours, rest = divmod(int(size.total_seconds()), 3600)
        return f"the offset must be within ±14:00 (got {sign}{hours:02d}:{rest // 60:02d})"
    low, high = TS_YEARS
    if not low <= ts.year <= high:
        return f"the year must be between {low} and {high} (got {ts.year:04d})"
    return "must be an RFC 3339 timestamp with an offset, like 2026-11-29T10:00:00Z"


def check_nesting(value: Any, field: str) -> None:
    """EventError when objects and arrays in `value` nest deeper than MAX_DEPTH (value itself being
    the first level): for JSON values outside events too (a claim's args, a completion's result)."""
    if (type(value) is dict or type(value) is list) and _deeper_than(value, MAX_DEPTH):
        raise EventError(field, f"must not nest deeper than {MAX_DEPTH} levels of objects and arrays")


def _deeper_than(value: dict | list, limit: int) -> bool:
    """Whether `value` nests more than `limit` levels, itself the first. Recurses `limit` at most."""
    if limit <= 0:
        return True
    for item in value.values() if type(value) is dict else value:
        if (type(item) is dict or type(item) is list) and _deeper_than(item, limit - 1):
            return True
    return False


def _shallow(ev: dict) -> bool:
    """Every value of the event within MAX_DEPTH (the fast path's check)."""
    for value in ev.values():
        if (type(value) is dict or type(value) is list) and _deeper_than(value, MAX_DEPTH):
            return False
    return True


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _string(
    ev: dict, key: str, *, required: bool = False, min_len: int = 0, max_len: int | None = None
) -> None:
    if key not in ev:
        if required:
            raise EventError(key, "is required")
        return
    value = ev[key]
    if not isinstance(value, str):
        raise EventError(key, f"must be a string, not {_type_name(value)}")
    if len(value) < min_len:
        raise EventError(
            key, "must not be empty" if min_len == 1 else f"must be at least {min_len} characters"
        )
    if max_len is not None and len(value) > max_len:
        raise EventError(key, f"must be at most {max_len} characters (got {len(value)})")


def _integer(
    ev: dict, key: str, *, required: bool = False, minimum: int = 0, path: str | None = None
) -> None:
    if key not in ev:
        if required:
            raise EventError(path or key, "is required")
        return
    value = ev[key]
    # JSON Schema counts 3.0 as an integer; store it as 3 (when it is in range: int(1e308) is a
    # number of 309 digits).
    if isinstance(value, float) and value.is_integer():
        if not minimum <= value <= MAX_INT:
            bound = f"at least {minimum}" if value < minimum else f"at most {MAX_INT}"
            raise EventError(path or key, f"must be {bound} (got {value:g})")
        value = ev[key] = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(path or key, f"must be an integer, not {_type_name(value)}")
    if value < minimum:
        raise EventError(path or key, f"must be at least {minimum} (got {_short(value)})")
    if value > MAX_INT:
        raise EventError(path or key, f"must be at most {MAX_INT} (got {_short(value)})")


def _number(
    ev: dict,
    key: str,
    *,
    maximum: int,
    minimum: float = 0,
    exclusive: bool = False,
    path: str | None = None,
) -> None:
    if key not in ev:
        return
    value = ev[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError(path or key, f"must be a number, not {_type_name(value)}")
    if not math.isfinite(value):
        raise EventError(path or key, f"must be a finite number (got {value})")
    if value > maximum:
        raise EventError(path or key, f"must be at most {maximum} (got {value:g})")
    if exclusive and value <= minimum:
        raise EventError(path or key, f"must be greater than {minimum} (got {value})")
    if not exclusive and value < minimum:
        raise EventError(path or key, f"must be at least {minimum} (got {value})")


def _enum(ev: dict, key: str, choices: tuple[str, ...], *, required: bool = False) -> None:
    if key not in ev:
        if required:
            raise EventError(key, "is required")
        return
    value = ev[key]
    if value not in choices or not isinstance(value, str):
        raise EventError(key, f"must be one of {', '.join(choices)} (got {_short(value)})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_run_started(ev: dict) -> None:
    _string(ev, "tenant", min_len=1, max_len=100)
    _string(ev, "agent", max_len=200)
    _string(ev, "task_type", min_len=1, max_len=100)
    _string(ev, "backend", min_len=1, max_len=100)
    _string(ev, "model", max_len=200)
    if "budgets" in ev:
        budgets = ev["budgets"]
        if not isinstance(budgets, dict):
            raise EventError("budgets", f"must be an object, not {_type_name(budgets)}")
        for key in budgets:
            if key not in BUDGET_KEYS:
                raise EventError(f"budgets.{key}", f"is not a budget (known: {', '.join(BUDGET_KEYS)})")
        for key in ("max_rounds", "max_tool_calls", "max_tokens"):
            _integer(budgets, key, minimum=1, path=f"budgets.{key}")
        _integer(budgets, "max_same_tool_retries", minimum=0, path="budgets.max_same_tool_retries")
        for key in ("max_cost_usd", "max_wall_s"):
            _number(budgets, key, maximum=MAX_BUDGET, minimum=0, exclusive=True, path=f"budgets.{key}")
    if "labels" in ev:
        labels = ev["labels"]
        if not isinstance(labels, dict):
            raise EventError("labels", f"must be an object, not {_type_name(labels)}")
        for key, value in labels.items():
            if not isinstance(value, str):
                raise EventError(f"labels.{key}", f"must be a string, not {_type_name(value)}")


def _check_user_message(ev: dict) -> None:
    _string(ev, "text", required=True)


def _check_model_round(ev: dict) -> None:
    _integer(ev, "round", required=True, minimum=1)
    _integer(ev, "input_tokens", minimum=0)
    _integer(ev, "output_tokens", minimum=0)
    _number(ev, "cost_usd", maximum=MAX_COST_USD, minimum=0)
    _string(ev, "text")


def _check_tool_call(ev: dict) -> None:
    _integer(ev, "round", required=True, minimum=1)
    _string(ev, "call_id", required=True, min_len=1, max_len=200)
    _string(ev, "tool", required=True, min_len=1, max_len=200)
    _enum(ev, "kind", TOOL_KINDS)
    if "args" not in ev:
        raise EventError("args", "is required")
    if not isinstance(ev["args"], dict):
        raise EventError("args", f"must be an object, not {_type_name(ev['args'])}")
    _string(ev, "step_id", min_len=1, max_len=200)
    _string(ev, "operation_key", min_len=1, max_len=500)


def _check_tool_result(ev: dict) -> None:
    _string(ev, "call_id", required=True, min_len=1, max_len=200)
    _enum(ev, "status", RESULT_STATUSES, required=True)
    if "result_truncated" in ev and not isinstance(ev["result_truncated"], bool):
        raise EventError("result_truncated", f"must be a boolean, not {_type_name(ev['result_truncated'])}")
    if "result_sha256" in ev:
        digest = ev["result_sha256"]
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise EventError("result_sha256", "must be 64 lowercase hex characters (a sha256)")
    _enum(ev, "error_class", ERROR_CLASSES)
    _number(ev, "latency_ms", maximum=MAX_LATENCY_MS, minimum=0)
    _string(ev, "external_request_id", max_len=500)


def _check_run_finished(ev: dict) -> None:
    _enum(ev, "status", RUN_STATUSES, required=True)
    _enum(ev, "terminated_by", TERMINATED_BY)
    _string(ev, "budget_type", max_len=100)
    _string(ev, "reason")


_CHECKS = {
    "run_started": _check_run_started,
    "user_message": _check_user_message,
    "model_round": _check_model_round,
    "tool_call": _check_tool_call,
    "tool_result": _check_tool_result,
    "run_finished": _check_run_finished,
}


def validate_event(ev: Any) -> datetime:
    """Check one event; return its parsed `ts`. Raises EventError on the first wrong field.

    Integral floats in integer fields are rewritten as ints in place. The limits (MAX_*, TS_YEARS,
    MAX_OFFSET, MAX_DEPTH) are checked here, for every way in.

    Most events are plain and valid: a fast path checks those with a few inline type and
    range tests and returns their `ts`. Anything it does not take as certainly fine (an error,
    a float to rewrite, a dict subclass, a rare type) goes through the full check below, which
    alone decides the verdict and the message.
    """
    ts = _fast_path(ev)
    return ts if ts is not None else _validate_event(ev)


def _fast_path(ev: Any) -> datetime | None:
    """The event's `ts` when the fast checks take it as certainly valid; None: the full check decides
    (tests/ingest/test_schema.py tries both, and the JSON Schema, at every limit the schema states)."""
    if type(ev) is dict:
        get = ev.get
        kind = get("type")
        fast = _FAST.get(kind) if type(kind) is str else None
        if fast is not None:
            run_id = get("run_id")
            raw_ts = get("ts")
            event_id = get("event_id", _ABSENT)
            if (
                type(run_id) is str
                and 0 < len(run_id) <= 200
                and type(raw_ts) is str
                and (event_id is _ABSENT or (type(event_id) is str and 0 < len(event_id) <= 200))
                and fast(get)
                and _ts_match(raw_ts)
                and _shallow(ev)
            ):
                try:
                    return _fromisoformat(raw_ts)
                except ValueError:
                    pass  # the full check names the error
    return None


def _validate_event(ev: Any) -> datetime:
    if not isinstance(ev, dict):
        raise EventError("", f"must be an object (an event), not {_type_name(ev)}")
    if "type" not in ev:
        raise EventError("type", "is required")
    kind = ev["type"]
    check = _CHECKS.get(kind) if isinstance(kind, str) else None
    if check is None:
        raise EventError("type", f"must be one of {', '.join(EVENT_TYPES)} (got {_short(kind)})")
    _string(ev, "run_id", required=True, min_len=1, max_len=200)
    if "ts" not in ev:
        raise EventError("ts", "is required")
    ts = check_ts(ev["ts"])
    _string(ev, "event_id", min_len=1, max_len=200)
    check(ev)
    for key, value in ev.items():
        check_nesting(value, str(key))
    return ts


# --- the fast path: True only when the full check would pass without rewriting anything ----------
# Each takes the event's dict.get. Exact types (`type(x) is int` is never a bool) and frozensets of
# the same choices as the full check; a missing optional field is _ABSENT.

_ABSENT = object()
_ts_match = _TS_WITHIN.match
_fromisoformat = datetime.fromisoformat
_TOOL_KINDS = frozenset(TOOL_KINDS)
_RESULT_STATUSES = frozenset(RESULT_STATUSES)
_ERROR_CLASSES = frozenset(ERROR_CLASSES)


def _fast_model_round(get) -> bool:
    value = get("round")
    if type(value) is not int or not 1 <= value <= MAX_INT:
        return False
    value = get("input_tokens", _ABSENT)
    if value is not _ABSENT and (type(value) is not int or not 0 <= value <= MAX_INT):
        return False
    value = get("output_tokens", _ABSENT)
    if value is not _ABSENT and (type(value) is not int or not 0 <= value <= MAX_INT):
        return False
    value = get("cost_usd", _ABSENT)
    if value is not _ABSENT and (
        (type(value) is not float and type(value) is not int) or not 0 <= value <= MAX_COST_USD
    ):
        return False
    value = get("text", _ABSENT)
    return value is _ABSENT or type(value) is str


def _fast_tool_call(get) -> bool:
    value = get("round")
    if type(value) is not int or not 1 <= value <= MAX_INT:
        return False
    value = get("call_id")
    if type(value) is not str or not 0 < len(value) <= 200:
        return False
    value = get("tool")
    if type(value) is not str or not 0 < len(value) <= 200:
        return False
    if type(get("args")) is not dict:
        return False
    value = get("kind", _ABSENT)
    if value is not _ABSENT and (type(value) is not str or value not in _TOOL_KINDS):
        return False
    value = get("step_id", _ABSENT)
    if value is not _ABSENT and (type(value) is not str or not 0 < len(value) <= 200):
        return False
    value = get("operation_key", _ABSENT)
    return value is _ABSENT or (type(value) is str and 0 < len(value) <= 500)


def _fast_tool_result(get) -> bool:
    value = get("call_id")
    if type(value) is not str or not 0 < len(value) <= 200:
        return False
    value = get("status")
    if type(value) is not str or value not in _RESULT_STATUSES:
        return False
    value = get("result_truncated", _ABSENT)
    if value is not _ABSENT and type(value) is not bool:
        return False
    value = get("result_sha256", _ABSENT)
    if value is not _ABSENT and (type(value) is not str or not _SHA256.match(value)):
        return False
    value = get("error_class", _ABSENT)
    if value is not _ABSENT and (type(value) is not str or value not in _ERROR_CLASSES):
        return False
    value = get("latency_ms", _ABSENT)
    if value is not _ABSENT and (
        (type(value) is not float and type(value) is not int) or not 0 <= value <= MAX_LATENCY_MS
    ):
        return False
    value = get("external_request_id", _ABSENT)
    return value is _ABSENT or (type(value) is str and len(value) <= 500)


# The three types that make up nearly every batch; the others take the full check.
_FAST = {
    "tool_call": _fast_tool_call,
    "tool_result": _fast_tool_result,
    "model_round": _fast_model_round,
}


def find_nul(value: Any, path: str = "") -> str | None:
    """The path of the first string (key or value) holding U+0000, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if "\x00" in key:
                return sub
            found = find_nul(item, sub)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = find_nul(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None
