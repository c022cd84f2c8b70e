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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
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

# What each tool is, as the runtime reports it in tool_call.kind
_TOOLS_BY_KIND = {
    "read": (
        "get_order search_orders get_shipment list_shipments get_customer list_customers list_tickets "
        "search_tickets http_get web_search read_file list_dir grep find_files sql_query get_weather "
        "get_forecast get_account_balance check_balance list_pending_transfers list_invoices get_invoice "
        "get_payment get_refund_status get_refund_policy check_availability list_rooms search_kb "
        "get_article search_logs search_products get_product tail_log get_events get_queue_message "
        "get_document get_metric get_job_logs search_flights get_stock_price"
    ).split(),
    "poll": ["get_job_status"],
    "write": (
        "place_order refund_payment send_email create_ticket edit_file update_address cancel_order"
    ).split(),
    "other": "run_tests scroll_page wait start_export".split(),
}
TOOL_KIND = {tool: kind for kind, tools in _TOOLS_BY_KIND.items() for tool in tools}

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
    """One run of the corpus, declared with `@loop(...)` or `@ok(...)` over the function that plays it.

    The play function gives the run its name and, by its docstring, its `note` label.
    """

    expect: str  # "loop" | "ok"
    loop_kind: str | None
    pattern: str
    agent: str
    task_type: str
    model: str
    budgets: dict[str, Any] | None = None
    with_cost: bool | None = None  # None: cost_usd on about half the runs of a paid model
    name: str = ""
    note: str = ""
    play: Callable[[Run], None] | None = None

    def __call__(self, play: Callable[[Run], None]) -> Scenario:
        assert play.__doc__, f"{play.__name__}: the docstring is the run's note label"
        return replace(self, name=play.__name__, note=" ".join(play.__doc__.split()), play=play)


def loop(
    kind: str,
    pattern: str,
    agent: str,
    task_type: str,
    model: str,
    *,
    budgets: dict[str, Any] | None = None,
    with_cost: bool | None = None,
) -> Scenario:
    """Declare a loop: `@loop(kind, pattern, agent, task_type, model)` over its play function."""
    assert kind in LOOP_KINDS and model in MODELS, (kind, model)
    return Scenario("loop", kind, pattern, agent, task_type, model, budgets, with_cost)


def ok(
    pattern: str, agent: str, task_type: str, model: str, *, budgets: dict[str, Any] | None = None
) -> Scenario:
    """Declare a legitimate run: `@ok(pattern, agent, task_type, model)` over its play function."""
    assert model in MODELS, model
    return Scenario("ok", None, pattern, agent, task_type, model, budgets)


# ================================================================================================
# A run: what an agent does, turned into events
# ================================================================================================


class Run:
    """Builds one run's events; a scenario's play function drives it like an agent runtime would."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.name = name = scenario.name
        self.run_id = f"corpus-{name.replace('_', '-')}"
        # crc32, not hash(): stable across processes. Every run draws its start time, event-id
        # choice, cost choice, context size and tenant first, in this order.
        self.rng = random.Random(zlib.crc32(name.encode()))
        rng = self.rng
        self.llm = MODELS[scenario.model]
        self.backend = self.llm.backend
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
            (self.llm.usd_in > 0 and rng.random() < 0.5) if scenario.with_cost is None else scenario.with_cost
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

    def model(
        self, text: str | None = None, *, calls: int = 0, out: int | None = None, label: bool = False
    ) -> int:
        """One model response; returns its round number (the label point if `label`)."""
        rng = self.rng
        self.rounds += 1
        if out is None:
            out = (len(text) // 4 + 3 if text else 0) + sum(rng.randint(16, 60) for _ in range(calls))
            out = max(out, 1)
        self.advance(0.5 + out / rng.uniform(55, 95) + rng.uniform(0.2, 1.4))
        inp = self.ctx + rng.randint(0, 60)
        fields: dict[str, Any] = {"round": self.rounds, "input_tokens": inp, "output_tokens": out}
        cost = (inp * self.llm.usd_in + out * self.llm.usd_out) / 1_000_000
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
        if label:
            self.label_round(self.rounds)
        return self.rounds

    def step(
        self,
        tool: str,
        args: dict[str, Any],
        result: Any = None,
        *,
        text: str | None = None,
        wait: float | tuple[float, float] = 0.0,
        label: bool = False,
        **call: Any,
    ) -> int:
        """One round with one tool call and its result; returns the call's 1-based index.

        `call` adds `status`, `error_class`, `operation_key`, `step_id`, `external_request_id`,
        `latency` or `kind`; `label` makes the call the run's label point.
        """
        item = {"tool": tool, "args": args, "result": result, **call}
        return self._round([item], text=text, wait=wait, label=label)[0]

    def batch(
        self,
        actions: Iterable[Action],
        *,
        text: str | None = None,
        wait: float | tuple[float, float] = 0.0,
        label: bool = False,
    ) -> list[int]:
        """One round with several tool calls (a parallel batch) and their results; returns their
        indices. `label` makes the batch's last call the run's label point.
        """
        items = [{"tool": tool, "args": args, "result": result} for tool, args, result in actions]
        return self._round(items, text=text, wait=wait, label=label)

    def _round(
        self, items: list[dict[str, Any]], *, text: str | None, wait: float | tuple[float, float], label: bool
    ) -> list[int]:
        if wait:
            self.advance(*(wait if isinstance(wait, tuple) else (wait,)))
        rnd = self.model(text, calls=len(items))
        indices = self._calls(rnd, items)
        if label:
            self.label_call(indices[-1])
        return indices

    def steps(
        self,
        actions: Iterable[Action],
        *,
        label_at: int | None = None,
        texts: Mapping[int, str] | None = None,
        wait: float | tuple[float, float] = 0.0,
        **call: Any,
    ) -> None:
        """One `step` per (tool, args, result), in order; `label_at` and `texts` number them from 1.

        Pass a generator where args or results draw noise (`r.req_id()`, `r.now()`, ...): each is
        then drawn just before its own call, as a runtime would.
        """
        for n, (tool, args, result) in enumerate(actions, 1):
            self.step(tool, args, result, text=(texts or {}).get(n), wait=wait, label=n == label_at, **call)

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
        assert self.by_call is None and self.by_round is None, f"{self.name}: one label point"
        self.by_call = n

    def label_round(self, n: int) -> None:
        assert self.by_call is None and self.by_round is None, f"{self.name}: one label point"
        self.by_round = n

    def finalize(self) -> list[dict[str, Any]]:
        """Write the labels into run_started (checking the label point) and return the events."""
        scenario = self.scenario
        labels: dict[str, str] = {"expect": scenario.expect}
        if scenario.expect == "loop":
            assert scenario.loop_kind is not None
            labels["loop_kind"] = scenario.loop_kind
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
        labels["pattern"] = scenario.pattern
        labels["note"] = scenario.note
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
