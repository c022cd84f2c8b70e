"""Builders of trace events for tests."""

from __future__ import annotations

import itertools
from typing import Any

_ids = itertools.count(1)


def ts(second: int = 0) -> str:
    return f"2026-11-29T10:{second // 60 % 60:02d}:{second % 60:02d}Z"


def event(event_type: str, run_id: str = "r1", second: int = 0, /, **fields: Any) -> dict[str, Any]:
    return {"type": event_type, "run_id": run_id, "ts": ts(second), **fields}


def run_started(run_id: str = "r1", **fields: Any) -> dict[str, Any]:
    defaults = {"agent": "shop", "task_type": "order_lookup", "backend": "openai", "model": "gpt-4o"}
    return event("run_started", run_id, **{**defaults, **fields})


def model_round(run_id: str = "r1", n: int = 1, **fields: Any) -> dict[str, Any]:
    return event("model_round", run_id, n, round=n, input_tokens=1000, output_tokens=100, **fields)


def tool_call(run_id: str = "r1", call_id: str = "c1", n: int = 1, **fields: Any) -> dict[str, Any]:
    defaults = {"tool": "search_orders", "kind": "read", "args": {"customer": "42"}}
    return event("tool_call", run_id, n, round=n, call_id=call_id, **{**defaults, **fields})


def tool_result(run_id: str = "r1", call_id: str = "c1", n: int = 1, **fields: Any) -> dict[str, Any]:
    defaults = {"status": "ok", "result": {"orders": []}}
    return event("tool_result", run_id, n, call_id=call_id, **{**defaults, **fields})


def run_finished(run_id: str = "r1", **fields: Any) -> dict[str, Any]:
    return event("run_finished", run_id, 59, **{"status": "succeeded", **fields})


def with_ids(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same events, each with a fresh event_id."""
    return [{**e, "event_id": f"e{next(_ids)}"} for e in events]
