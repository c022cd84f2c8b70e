"""The machinery of the loop-detection corpus: a `Run` turns what an agent does into trace events.

A scenario (one per run, in the family modules of `scenarios/`) is a short function that drives a
`Run` as an agent runtime would: `r.user(...)`, `r.step(tool, args, result)`, `r.batch([...])`,
`r.model(text)`, `r.finish(status)`, and marks the label point with `label=True` (or
`r.label_call` / `r.label_round`). The `Run` fills in what a real trace carries: call ids in each
backend's format, timestamps, latencies, token counts and costs, event ids on about half the runs.

Deterministic: stdlib only, no clock, no Django, and all the noise comes from one `random.Random`
per run seeded from the run's name, so a scenario always writes the same bytes and editing one
never moves another's numbers. The order in which a scenario asks for noise (`r.req_id()`,
`r.uuid()`, ...) and emits events is part of its output.
"""

from __future__ import annotations

import json
import random
import string
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

LOOP_KINDS = (
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

# Defaults the labels assume where the issue leaves a number open (see README.md).
NO_PROGRESS_K = 10  # consecutive steps without progress for non-polling task types
FUZZY_SLACK = 2  # extra calls allowed for perturbation / interval loop / no_progress
RETRY_QUOTA = 2  # retries allowed for transient / rate_limited errors
POLL_LOOP_LABEL = 20  # an undeclared poll budget must be spent by the 20th identical poll

BASE = datetime(2026, 3, 2, tzinfo=UTC)
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


class Model(NamedTuple):
    backend: str
    usd_in: float  # per million input tokens
    usd_out: float  # per million output tokens


# The model names a run's backend; local models cost nothing.
MODELS = {
    "gpt-4o": Model("openai", 2.5, 10.0),
    "gpt-4.1-mini": Model("openai", 0.4, 1.6),
    "claude-sonnet-4-5": Model("anthropic", 3.0, 15.0),
    "claude-3-5-haiku": Model("anthropic", 0.8, 4.0),
    "deepseek-chat": Model("deepseek", 0.27, 1.1),
    "llama-3.1-70b-instruct": Model("local", 0.0, 0.0),
    "qwen2.5-32b-instruct": Model("local", 0.0, 0.0),
}

TOOL_KIND = {
    # reads
    "get_order": "read",
    "search_orders": "read",
    "get_shipment": "read",
    "list_shipments": "read",
    "get_customer": "read",
    "list_customers": "read",
    "list_tickets": "read",
    "search_tickets": "read",
    "http_get": "read",
    "web_search": "read",
    "read_file": "read",
    "list_dir": "read",
    "grep": "read",
    "find_files": "read",
    "sql_query": "read",
    "get_weather": "read",
    "get_forecast": "read",
    "get_account_balance": "read",
    "check_balance": "read",
    "list_pending_transfers": "read",
    "list_invoices": "read",
    "get_invoice": "read",
    "get_payment": "read",
    "get_refund_status": "read",
    "get_refund_policy": "read",
    "check_availability": "read",
    "list_rooms": "read",
    "search_kb": "read",
    "get_article": "read",
    "search_logs": "read",
    "search_products": "read",
    "get_product": "read",
    "tail_log": "read",
    "get_events": "read",
    "get_queue_message": "read",
    "get_document": "read",
    "get_metric": "read",
    "get_job_logs": "read",
    "search_flights": "read",
    "get_stock_price": "read",
    # polls
    "get_job_status": "poll",
    # writes
    "place_order": "write",
    "refund_payment": "write",
    "send_email": "write",
    "create_ticket": "write",
    "edit_file": "write",
    "update_address": "write",
    "cancel_order": "write",
    # other
    "run_tests": "other",
    "scroll_page": "other",
    "wait": "other",
    "start_export": "other",
}

LATENCY = {  # seconds (low, high) for an ok result
    "read": (0.08, 0.9),
    "poll": (0.06, 0.3),
    "write": (0.3, 2.4),
    "other": (0.2, 1.5),
}
SLOW_TOOLS = {
    "http_get": (0.3, 2.6),
    "web_search": (0.5, 1.8),
    "sql_query": (0.05, 1.4),
    "run_tests": (4, 19),
}

Action = tuple[str, dict[str, Any], Any]  # (tool, args, result) of one call


# ================================================================================================
# Scenarios: the labels and identity of a run, and the function that plays it
# ================================================================================================


@dataclass(frozen=True)
class Scenario:
    """One run of the corpus. Its name is the play function's name, its `note` label the docstring."""

    name: str
    expect: str  # "loop" | "ok"
    loop_kind: str | None
    pattern: str
    note: str
    agent: str
    task_type: str
    model: str
    budgets: dict[str, Any] | None
    with_cost: bool | None  # None: cost_usd on about half the runs of a paid model
    play: Callable[[Run], None]


def loop(
    kind: str,
    pattern: str,
    agent: str,
    task_type: str,
    model: str,
    *,
    budgets: dict[str, Any] | None = None,
    with_cost: bool | None = None,
) -> Callable[[Callable[[Run], None]], Scenario]:
    """Declare a loop: `@loop(kind, pattern, agent, task_type, model)` over its play function."""
    assert kind in LOOP_KINDS, kind
    return _declare(
        expect="loop",
        loop_kind=kind,
        pattern=pattern,
        agent=agent,
        task_type=task_type,
        model=model,
        budgets=budgets,
        with_cost=with_cost,
    )


def ok(
    pattern: str, agent: str, task_type: str, model: str, *, budgets: dict[str, Any] | None = None
) -> Callable[[Callable[[Run], None]], Scenario]:
    """Declare a legitimate run: `@ok(pattern, agent, task_type, model)` over its play function."""
    return _declare(
        expect="ok",
        loop_kind=None,
        pattern=pattern,
        agent=agent,
        task_type=task_type,
        model=model,
        budgets=budgets,
        with_cost=None,
    )


def _declare(**labels: Any) -> Callable[[Callable[[Run], None]], Scenario]:
    assert labels["model"] in MODELS, labels["model"]

    def declare(play: Callable[[Run], None]) -> Scenario:
        assert play.__doc__, f"{play.__name__}: the docstring is the run's note label"
        note = " ".join(play.__doc__.split())
        return Scenario(name=play.__name__, note=note, play=play, **labels)

    return declare


# ================================================================================================
# A run: what an agent does, turned into events
# ================================================================================================


class Run:
    """Builds one run's events; a scenario's play function drives it like an agent runtime would."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.name = name = scenario.name
        self.run_id = f"corpus-{name.replace('_', '-')}"
        self.rng = random.Random(zlib.crc32(name.encode()))
        rng = self.rng
        self.expect, self.loop_kind = scenario.expect, scenario.loop_kind
        self.pattern, self.note = scenario.pattern, scenario.note
        self.model_name = scenario.model
        self.price = MODELS[scenario.model]
        self.backend = self.price.backend
        self.t = BASE + timedelta(
            days=rng.randrange(0, 75),
            hours=rng.randrange(6, 20),
            minutes=rng.randrange(60),
            seconds=rng.randrange(60),
            milliseconds=rng.randrange(1000),
        )
        self.start = self.t
        self.events: list[dict[str, Any]] = []
        self.event_ids = rng.random() < 0.5
        self.with_cost = (
            (self.price.usd_in > 0 and rng.random() < 0.5)
            if scenario.with_cost is None
            else scenario.with_cost
        )
        self.rounds = 0
        self.calls = 0
        self.ctx = rng.randint(1100, 2600)  # system prompt + tool schemas
        self.total_tokens = 0
        self.total_cost = 0.0
        self.round_totals: list[tuple[int, int, float]] = []  # (round, cumulative tokens, cumulative cost)
        self.call_times: list[datetime] = []
        self.by_call: int | None = None
        self.by_round: int | None = None
        started: dict[str, Any] = {
            "tenant": rng.choice(["acme", "globex", "initech", "umbrella"]),
            "agent": scenario.agent,
            "task_type": scenario.task_type,
            "backend": self.backend,
            "model": scenario.model,
        }
        if scenario.budgets:
            started["budgets"] = scenario.budgets
        started["labels"] = {}
        self._started = self._emit("run_started", **started)

    # ---- small generators of realistic noise -------------------------------------------------
    def hex(self, n: int) -> str:
        return "".join(self.rng.choice(HEX) for _ in range(n))

    def alnum(self, n: int) -> str:
        return "".join(self.rng.choice(ALNUM) for _ in range(n))

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def req_id(self) -> str:
        return "req_" + self.hex(20)

    def now(self) -> str:
        return _fmt(self.t)

    def later(self, seconds: float) -> str:
        return _fmt(self.t + timedelta(seconds=seconds))

    # ---- time and emission -------------------------------------------------------------------
    def advance(self, lo: float, hi: float | None = None) -> None:
        seconds = lo if hi is None else self.rng.uniform(lo, hi)
        self.t += timedelta(milliseconds=round(seconds * 1000))

    def _emit(self, event_type: str, **fields: Any) -> dict[str, Any]:
        event: dict[str, Any] = {"type": event_type, "run_id": self.run_id, "ts": _fmt(self.t)}
        if self.event_ids:
            event["event_id"] = f"{self.run_id}:{len(self.events) + 1}"
        event.update(json.loads(json.dumps(fields)))  # a private copy of shared arg/result dicts
        self.events.append(event)
        return event

    def _call_id(self, pos: int) -> str:
        if self.backend == "openai":
            return "call_" + self.alnum(24)
        if self.backend == "anthropic":
            return "toolu_01" + self.alnum(22)
        if self.backend == "deepseek":
            return f"call_{pos}_{self.uuid()}"
        return f"call_{pos}"  # local runtimes number the calls of each round: ids are reused

    # ---- what an agent does ------------------------------------------------------------------
    def user(self, text: str, think: tuple[float, float] = (4, 40)) -> None:
        self.advance(*think)
        self._emit("user_message", text=text)
        self.ctx += len(text) // 4 + 4

    def model(self, text: str | None = None, *, calls: int = 0, out: int | None = None) -> int:
        """One model response; returns its round number."""
        rng = self.rng
        self.rounds += 1
        if out is None:
            out = (len(text) // 4 + 3 if text else 0) + sum(rng.randint(16, 60) for _ in range(calls))
            out = max(out, 1)
        self.advance(0.5 + out / rng.uniform(55, 95) + rng.uniform(0.2, 1.4))
        inp = self.ctx + rng.randint(0, 60)
        fields: dict[str, Any] = {"round": self.rounds, "input_tokens": inp, "output_tokens": out}
        cost = (inp * self.price.usd_in + out * self.price.usd_out) / 1_000_000
        if self.with_cost:
            fields["cost_usd"] = round(cost, 6)
        if text is not None:
            fields["text"] = text
        self._emit("model_round", **fields)
        self.total_tokens += inp + out
        self.total_cost += round(cost, 6)
        self.round_totals.append((self.rounds, self.total_tokens, self.total_cost))
        self.ctx += out + 12
        if self.ctx > 60000:  # the runtime summarises old turns
            self.ctx = int(self.ctx * 0.55)
        return self.rounds

    def step(
        self,
        tool: str,
        args: dict[str, Any],
        result: Any = None,
        *,
        text: str | None = None,
        wait: float | tuple[float, float] = 0.0,
        **call: Any,
    ) -> int:
        """One round with one tool call and its result; returns the call's 1-based index."""
        if wait:
            self.advance(*(wait if isinstance(wait, tuple) else (wait,)))
        rnd = self.model(text, calls=1)
        return self._calls(rnd, [{"tool": tool, "args": args, "result": result, **call}])[0]

    def batch(
        self, items: list[dict[str, Any]], *, text: str | None = None, wait: float | tuple[float, float] = 0.0
    ) -> list[int]:
        """One round with several tool calls (a parallel batch); returns their indices."""
        if wait:
            self.advance(*(wait if isinstance(wait, tuple) else (wait,)))
        rnd = self.model(text, calls=len(items))
        return self._calls(rnd, items)

    def _calls(self, rnd: int, items: list[dict[str, Any]]) -> list[int]:
        rng = self.rng
        indices: list[int] = []
        pending: list[tuple[datetime, int, str, dict[str, Any], float]] = []
        for pos, item in enumerate(items):
            self.advance(0.004, 0.03)
            call_id = self._call_id(pos)
            tool = item["tool"]
            kind = item.get("kind") or TOOL_KIND[tool]
            fields: dict[str, Any] = {"round": rnd, "call_id": call_id, "tool": tool, "kind": kind}
            fields["args"] = item["args"]
            for key in ("step_id", "operation_key"):
                if item.get(key):
                    fields[key] = item[key]
            self._emit("tool_call", **fields)
            self.calls += 1
            self.call_times.append(self.t)
            indices.append(self.calls)
            status = item.get("status", "ok")
            if "latency" in item:
                latency = float(item["latency"])
            elif status == "timeout":
                latency = 30.0 + rng.uniform(0, 0.05)
            else:
                latency = rng.uniform(*SLOW_TOOLS.get(tool, LATENCY[kind]))
            pending.append(
                (self.t + timedelta(milliseconds=round(latency * 1000)), pos, call_id, item, latency)
            )
            self.ctx += 25 + len(json.dumps(item["args"])) // 4
        pending.sort(key=lambda p: (p[0], p[1]))
        for done, _pos, call_id, item, latency in pending:
            self.t = max(self.t, done)
            status = item.get("status", "ok")
            fields = {"call_id": call_id, "status": status}
            if item.get("result") is not None:
                fields["result"] = item["result"]
            if item.get("error_class"):
                fields["error_class"] = item["error_class"]
            fields["latency_ms"] = round(latency * 1000, 1)
            if item.get("external_request_id"):
                fields["external_request_id"] = item["external_request_id"]
            self._emit("tool_result", **fields)
            self.ctx += 8 + len(json.dumps(item.get("result"))) // 4
        return indices

    def finish(
        self,
        status: str,
        *,
        answer: str | None = None,
        terminated_by: str | None = None,
        budget_type: str | None = None,
        reason: str | None = None,
    ) -> None:
        if answer is not None:
            self.model(answer)
        self.advance(0.05, 0.6)
        fields: dict[str, Any] = {"status": status}
        if terminated_by:
            fields["terminated_by"] = terminated_by
        if budget_type:
            fields["budget_type"] = budget_type
        if reason:
            fields["reason"] = reason
        self._emit("run_finished", **fields)

    # ---- labels ------------------------------------------------------------------------------
    def label_call(self, n: int) -> None:
        self.by_call = n

    def label_round(self, n: int) -> None:
        self.by_round = n

    def first_round(self, predicate: Callable[[int, float], bool]) -> int:
        """The first round whose cumulative (tokens, cost) satisfies predicate."""
        for rnd, tokens, cost in self.round_totals:
            if predicate(tokens, cost):
                return rnd
        raise AssertionError(f"{self.name}: no round satisfies the budget predicate")

    def first_call_after(self, seconds: float) -> int:
        limit = self.start + timedelta(seconds=seconds)
        for i, at in enumerate(self.call_times, 1):
            if at >= limit:
                return i
        raise AssertionError(f"{self.name}: no call after {seconds}s")

    def finalize(self) -> list[dict[str, Any]]:
        labels: dict[str, str] = {"expect": self.expect}
        if self.expect == "loop":
            assert self.loop_kind is not None
            labels["loop_kind"] = self.loop_kind
            assert (self.by_call is None) != (self.by_round is None), f"{self.name}: one label point"
            if self.by_call is not None:
                assert 1 <= self.by_call < self.calls, f"{self.name}: label call {self.by_call}/{self.calls}"
                labels["intervene_by_call"] = str(self.by_call)
            else:
                assert self.by_round is not None
                assert 1 <= self.by_round < self.rounds, f"{self.name}: label round {self.by_round}"
                labels["intervene_by_round"] = str(self.by_round)
        else:
            assert self.by_call is None and self.by_round is None, self.name
        labels["pattern"] = self.pattern
        labels["note"] = self.note
        self._started["labels"] = labels
        assert self.events[-1]["type"] == "run_finished", self.name
        return self.events


def _fmt(t: datetime) -> str:
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"


# ================================================================================================
# Shared bits of realistic data
# ================================================================================================


def order_record(
    oid: str, status: str, items: list[tuple[str, int, float]], placed: str, **extra: Any
) -> dict[str, Any]:
    lines = [{"sku": sku, "qty": qty, "unit_price": price} for sku, qty, price in items]
    total = round(sum(q * p for _, q, p in items), 2)
    return {
        "order_id": oid,
        "status": status,
        "placed_at": placed,
        "currency": "EUR",
        "total": total,
        "lines": lines,
        **extra,
    }
