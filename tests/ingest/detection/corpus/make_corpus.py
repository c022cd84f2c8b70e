"""Generate the labelled loop-detection corpus (one run per JSON Lines file, beside this script).

Deterministic: stdlib only, one `random.Random` per run seeded from the run's name, no clock, no
Django. Re-run it after a change and commit what it writes:

    .venv/bin/python tests/ingest/detection/corpus/make_corpus.py [OUTPUT_DIR]

Every run carries its label in `run_started.labels` (see README.md, which this script writes too):
`expect` (loop|ok), `loop_kind`, `intervene_by_call` or `intervene_by_round`, `pattern`, `note`.
The scenarios are written from the detection issue's rules and from how real agents behave, not
from the engine's code.
"""

from __future__ import annotations

import json
import random
import string
import sys
import uuid
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

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

# USD per million tokens (input, output); local models cost nothing.
PRICES = {
    "gpt-4o": (2.5, 10.0),
    "gpt-4.1-mini": (0.4, 1.6),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "deepseek-chat": (0.27, 1.1),
    "llama-3.1-70b-instruct": (0.0, 0.0),
    "qwen2.5-32b-instruct": (0.0, 0.0),
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


class Run:
    """Builds one run's events; the scenario functions below drive it like an agent runtime would."""

    def __init__(
        self,
        name: str,
        *,
        expect: str,
        pattern: str,
        note: str,
        backend: str,
        model: str,
        agent: str,
        task_type: str = "default",
        loop_kind: str | None = None,
        budgets: dict[str, Any] | None = None,
        tenant: str | None = None,
        with_cost: bool | None = None,
    ) -> None:
        assert expect in ("loop", "ok"), expect
        assert (expect == "loop") == (loop_kind is not None), name
        assert loop_kind is None or loop_kind in LOOP_KINDS, loop_kind
        self.name = name
        self.run_id = f"corpus-{name.replace('_', '-')}"
        self.rng = random.Random(zlib.crc32(name.encode()))
        rng = self.rng
        self.expect, self.loop_kind, self.pattern, self.note = expect, loop_kind, pattern, note
        self.backend, self.model_name = backend, model
        self.budgets = budgets
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
        self.with_cost = (PRICES[model][0] > 0 and rng.random() < 0.5) if with_cost is None else with_cost
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
            "tenant": tenant or rng.choice(["acme", "globex", "initech", "umbrella"]),
            "agent": agent,
            "task_type": task_type,
            "backend": backend,
            "model": model,
        }
        if budgets:
            started["budgets"] = budgets
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
        pin, pout = PRICES[self.model_name]
        cost = (inp * pin + out * pout) / 1_000_000
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


SCENARIOS: list[Callable[[str], Run]] = []


def scenario(fn: Callable[[str], Run]) -> Callable[[str], Run]:
    SCENARIOS.append(fn)
    return fn


# ================================================================================================
# Shared bits of realistic data
# ================================================================================================


def order_record(
    oid: str, status: str, items: list[tuple[str, int, float]], placed: str, **extra: Any
) -> dict:
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


def job_status(job_id: str, status: str, **extra: Any) -> dict:
    return {"job_id": job_id, "status": status, **extra}


# ================================================================================================
# LOOPS: exact repeats
# ================================================================================================


@scenario
def loop_repeat_get_order_request_id(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="exact_repeat",
        pattern="repeat_noise_request_id",
        note="Support agent re-reads the same order eight times; only a fresh request_id changes per call.",
        backend="openai",
        model="gpt-4o",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Where is my order A-20931? It was supposed to arrive on Monday and tracking hasn't moved since.")
    order = order_record(
        "A-20931",
        "shipped",
        [("HDMI-2M-BLK", 2, 8.99), ("USB-C-HUB-7", 1, 39.0)],
        "2026-02-21T14:03:11Z",
        tracking_number="1Z84A0W90312877465",
        carrier="UPS",
    )
    r.step(
        "get_order",
        {"order_id": "A-20931", "request_id": r.req_id()},
        order,
        text="Let me look up order A-20931.",
    )
    r.step(
        "get_shipment",
        {"tracking_number": "1Z84A0W90312877465", "carrier": "UPS"},
        {
            "status": "exception",
            "last_scan": "2026-02-24T06:41:00Z",
            "location": "Koeln DE",
            "detail": "Address information needed",
        },
    )
    for i in range(8):
        args = {"order_id": "A-20931", "request_id": r.req_id()}
        if i % 2:
            args = {"request_id": args["request_id"], "order_id": "A-20931"}
        text = (
            "The carrier reports an address exception. Let me double-check the order details."
            if i < 3
            else None
        )
        idx = r.step("get_order", args, order, text=text)
        if i == 2:
            r.label_call(idx)
    r.finish(
        "truncated", terminated_by="loop", reason="get_order A-20931 repeated 8 times with the same result"
    )
    return r


@scenario
def loop_repeat_search_key_order_whitespace(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="exact_repeat",
        pattern="repeat_key_order_whitespace_numbers",
        note="The same order search re-sent with shuffled keys, stray spaces and 100 vs 100.0; identical results.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="billing-assistant",
        task_type="order_lookup",
    )
    r.user("Can you list my cancelled orders over 100 euros? Customer number C-5512.")
    r.step(
        "get_customer",
        {"customer_id": "C-5512"},
        {"customer_id": "C-5512", "name": "Ilse Brandt", "email": "ilse.brandt@example.de", "tier": "gold"},
    )
    result = {
        "orders": [
            {
                "order_id": "A-18820",
                "status": "canceled",
                "total": 149.0,
                "placed_at": "2026-01-04T10:12:00Z",
            },
            {
                "order_id": "A-19977",
                "status": "canceled",
                "total": 312.5,
                "placed_at": "2026-01-29T18:40:00Z",
            },
        ],
        "count": 2,
    }
    variants = [
        {"customer_id": "C-5512", "status": "canceled", "min_total": 100},
        {"status": "canceled ", "min_total": 100.0, "customer_id": "C-5512"},
        {"min_total": 100.00000001, "customer_id": "  C-5512", "status": "canceled"},
        {"customer_id": "C-5512", "min_total": 100, "status": "canceled"},
        {"status": "canceled", "customer_id": "C-5512 ", "min_total": 100.0},
        {"min_total": 100, "status": " canceled", "customer_id": "C-5512"},
        {"customer_id": "C-5512", "status": "canceled", "min_total": 100.0},
    ]
    for i, args in enumerate(variants):
        idx = r.step(
            "search_orders",
            args,
            result,
            text="Let me search for the cancelled orders above 100 EUR." if i == 0 else None,
        )
        if i == 2:
            r.label_call(idx)
    r.user("Hello? You keep searching. I only need the two order numbers.")
    r.finish(
        "succeeded",
        answer="You have two cancelled orders over 100 EUR: A-18820 (149.00 EUR) and A-19977 (312.50 EUR).",
        terminated_by="user",
    )
    return r


@scenario
def loop_repeat_page_stuck(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="exact_repeat",
        pattern="paging_stuck_page_2",
        note="Ticket triage pages 1 then asks for page=2 six times in a row (page 2,2,2 is a loop, not paging).",
        backend="deepseek",
        model="deepseek-chat",
        agent="triage-bot",
        task_type="ticket_triage",
    )
    r.user("Summarise all open billing tickets from this week.")

    def page(n: int) -> dict:
        base = (n - 1) * 25
        return {
            "page": n,
            "per_page": 25,
            "total": 61,
            "pages": 3,
            "tickets": [
                {
                    "id": f"T-{88100 + base + k}",
                    "subject": s,
                    "opened": f"2026-03-0{1 + k % 5}T0{k % 9}:15:00Z",
                }
                for k, s in enumerate(
                    [
                        "Double charge on invoice",
                        "VAT number missing",
                        "Refund not received",
                        "Card declined at renewal",
                        "Wrong billing address",
                    ]
                    * 5
                )
            ][:25],
        }

    r.step(
        "list_tickets",
        {"queue": "billing", "status": "open", "page": 1, "per_page": 25},
        page(1),
        text="Fetching the open billing tickets.",
    )
    r.step(
        "list_tickets",
        {"queue": "billing", "status": "open", "page": 2, "per_page": 25},
        page(2),
        text="Fetching the next page.",
    )
    for i in range(6):
        idx = r.step(
            "list_tickets",
            {"queue": "billing", "status": "open", "page": 2, "per_page": 25},
            page(2),
            text="Fetching the next page.",
        )
        if i == 1:
            r.label_call(idx)  # page=2 for the 3rd consecutive time
    r.finish("truncated", terminated_by="loop", reason="page 2 requested 7 times")
    return r


@scenario
def loop_repeat_http_trace_uuid(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="exact_repeat",
        pattern="repeat_noise_trace_uuid_nonce",
        note="Status-page fetch repeated with a fresh trace_id UUID, timestamp and nonce each time; same body.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="oncall-helper",
        task_type="incident_triage",
    )
    r.user("Is the payments provider having an outage right now? Checkout errors spiked 10 minutes ago.")
    r.step(
        "web_search",
        {"query": "paylane status page incidents"},
        {
            "results": [
                {"title": "PayLane Status", "url": "https://status.paylane.example.com/api/v2/incidents"},
                {"title": "PayLane on X", "url": "https://x.example.com/paylane"},
            ]
        },
    )
    body = {
        "page": "PayLane",
        "incidents": [
            {
                "id": "inc_5q2k",
                "name": "Elevated card authorization latency",
                "status": "investigating",
                "created_at": "2026-03-11T09:02:00Z",
                "components": ["Card payments"],
            }
        ],
    }
    for i in range(8):
        args = {
            "url": "https://status.paylane.example.com/api/v2/incidents",
            "trace_id": r.uuid(),
            "timestamp": r.now(),
            "nonce": r.hex(16),
        }
        if i % 3 == 1:
            args = dict(reversed(list(args.items())))
        idx = r.step(
            "http_get", args, body, text="Checking the incident feed again for an update." if i else None
        )
        if i == 2:
            r.label_call(idx)
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_repeat_read_file_plain(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="exact_repeat",
        pattern="repeat_read_same_file",
        note="Coding agent re-reads tax.py six times in a row between no edits; byte-identical calls and results.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("tests/test_tax.py::test_rounding_half_even fails on main. Please fix it.")
    tax = (
        "from decimal import Decimal, ROUND_HALF_UP\n\n\ndef vat(amount: Decimal, rate: Decimal) -> Decimal:\n"
        "    return (amount * rate).quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)\n"
    )
    r.step(
        "list_dir", {"path": "src/billing"}, {"entries": ["__init__.py", "invoice.py", "tax.py", "ledger.py"]}
    )
    r.step(
        "read_file",
        {"path": "src/billing/tax.py"},
        {"path": "src/billing/tax.py", "content": tax, "lines": 6},
    )
    r.step(
        "run_tests",
        {"path": "tests/test_tax.py"},
        {
            "passed": 11,
            "failed": 1,
            "output": "FAILED tests/test_tax.py::test_rounding_half_even - "
            "assert Decimal('2.53') == Decimal('2.52')",
        },
    )
    for i in range(6):
        idx = r.step(
            "read_file",
            {"path": "src/billing/tax.py"},
            {"path": "src/billing/tax.py", "content": tax, "lines": 6},
            text="Let me re-read tax.py to check the rounding mode.",
        )
        if i == 2:
            r.label_call(idx)
    r.finish("truncated", terminated_by="loop", reason="read_file tax.py repeated without edits")
    return r


@scenario
def loop_repeat_sql_whitespace(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="exact_repeat",
        pattern="repeat_sql_whitespace_variants",
        note="Analyst agent re-runs one SQL statement with only line breaks, tabs and spaces changed.",
        backend="local",
        model="qwen2.5-32b-instruct",
        agent="sql-analyst",
        task_type="analytics",
    )
    r.user("How many orders per status since January 1st?")
    sqls = [
        "SELECT status, count(*) AS n\nFROM orders\nWHERE created_at >= '2026-01-01'\nGROUP BY status",
        "SELECT status, count(*) AS n FROM orders WHERE created_at >= '2026-01-01' GROUP BY status",
        "SELECT status,  count(*) AS n\n  FROM orders\n WHERE created_at >= '2026-01-01'\n GROUP BY status ",
        "\tSELECT status, count(*) AS n FROM orders\tWHERE created_at >= '2026-01-01' GROUP BY status",
        "SELECT status, count(*) AS n\nFROM orders WHERE created_at >= '2026-01-01' GROUP BY status\n",
        "SELECT status, count(*) AS n FROM orders  WHERE created_at >= '2026-01-01'  GROUP BY status",
        "SELECT status, count(*) AS n\nFROM orders\nWHERE created_at >= '2026-01-01'\nGROUP BY status",
    ]
    rows = {
        "columns": ["status", "n"],
        "rows": [
            ["delivered", 18233],
            ["shipped", 1204],
            ["processing", 311],
            ["canceled", 977],
            ["returned", 402],
        ],
        "row_count": 5,
    }
    r.step(
        "sql_query",
        {
            "sql": "SELECT column_name FROM information_schema.columns WHERE table_name = 'orders'",
            "database": "shop",
        },
        {"columns": ["column_name"], "rows": [["id"], ["status"], ["created_at"], ["total"]], "row_count": 4},
    )
    for i, sql in enumerate(sqls):
        idx = r.step(
            "sql_query",
            {"sql": sql, "database": "shop"},
            rows,
            text="Running the aggregation query." if i in (0, 3) else None,
        )
        if i == 2:
            r.label_call(idx)
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_repeat_parallel_batches(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="exact_repeat",
        pattern="repeat_parallel_batch_by_round",
        note="A backend that emits parallel batches repeats the same 3-city weather batch every round.",
        backend="deepseek",
        model="deepseek-chat",
        agent="travel-planner",
        task_type="trip_planning",
    )
    r.user(
        "I'm choosing between Paris, Lyon and Marseille for this weekend. Which will have the best weather?"
    )
    cities = {"Paris": (11, "light rain", 82), "Lyon": (14, "cloudy", 64), "Marseille": (17, "sunny", 12)}
    items = [
        {
            "tool": "get_weather",
            "args": {"city": c, "country": "FR", "units": "metric"},
            "result": {"city": c, "temp_c": t, "conditions": cond, "precip_prob": p},
        }
        for c, (t, cond, p) in cities.items()
    ]
    for i in range(6):
        idxs = r.batch(items, text="Let me get the current weather for all three cities." if i == 0 else None)
        if i == 2:
            r.label_call(idxs[-1])  # the third identical batch, counted by round
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_repeat_result_noise(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="exact_repeat",
        pattern="repeat_noise_in_args_and_result",
        note="Balance re-read 9 times; request_id in args and as_of/response_id in the result change, the "
        "balance never does (label has +2 slack: needs result normalisation or novelty).",
        backend="openai",
        model="gpt-4o",
        agent="finance-bot",
        task_type="account_lookup",
    )
    r.user("Has the 2,400 EUR transfer from Nordbank arrived on account ACC-7781 yet?")
    r.step(
        "list_pending_transfers",
        {"account_id": "ACC-7781"},
        {"pending": [{"transfer_id": "TR-55102", "amount": 2400.0, "from": "Nordbank", "eta": "2026-03-12"}]},
    )
    for i in range(9):
        idx = r.step(
            "get_account_balance",
            {"account_id": "ACC-7781", "request_id": r.req_id()},
            {
                "account_id": "ACC-7781",
                "balance": 1832.17,
                "currency": "EUR",
                "as_of": r.now(),
                "response_id": r.uuid(),
            },
            text="Checking the balance again to see whether the transfer has been credited."
            if i < 2
            else None,
        )
        if i == 4:
            r.label_call(idx)
    r.finish("abandoned", terminated_by="loop")
    return r


# ================================================================================================
# LOOPS: oscillation and interval loops
# ================================================================================================


def _cycle(
    r: Run,
    actions: list[tuple[str, dict, Any]],
    cycles: int,
    label_cycle: int = 3,
    texts: dict[int, str] | None = None,
    noise: Callable[[Run, dict], dict] | None = None,
) -> None:
    """Repeat the actions in order `cycles` times; label the call completing cycle `label_cycle`."""
    n = 0
    for c in range(cycles):
        for tool, args, result in actions:
            n += 1
            idx = r.step(tool, noise(r, args) if noise else args, result, text=(texts or {}).get(n))
        if c + 1 == label_cycle:
            r.label_call(idx)


@scenario
def loop_oscillate_search_get(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="oscillation",
        pattern="oscillation_2_actions",
        note="search_orders and get_order alternate five times with unchanged results (A-B-A-B...).",
        backend="openai",
        model="gpt-4o",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("I want to return the blender I bought last week. Is it still returnable?")
    r.step(
        "get_customer",
        {"email": "m.okafor@example.com"},
        {"customer_id": "C-3310", "name": "Michael Okafor", "orders_open": 1},
    )
    search = {
        "orders": [{"order_id": "A-31877", "status": "delivered", "delivered_at": "2026-03-03T12:20:00Z"}]
    }
    order = order_record(
        "A-31877",
        "delivered",
        [("BLEND-PRO-900", 1, 129.0)],
        "2026-02-27T09:12:44Z",
        return_window_days=14,
        returnable=True,
    )
    _cycle(
        r,
        [
            ("search_orders", {"customer_id": "C-3310", "status": "delivered"}, search),
            ("get_order", {"order_id": "A-31877"}, order),
        ],
        cycles=5,
        texts={1: "Let me find the order.", 3: "Let me confirm which order contains the blender."},
    )
    r.user("You keep looking it up. Can I return it or not?")
    r.finish(
        "succeeded",
        terminated_by="user",
        answer="Yes — order A-31877 was delivered on March 3 and is within the 14-day return window.",
    )
    return r


@scenario
def loop_oscillate_three_files(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="oscillation",
        pattern="oscillation_3_actions",
        note="Coding agent cycles list_dir -> read_file -> grep over the same auth module 4 times.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("Users get logged out after 5 minutes instead of 30. Find where the session lifetime is set.")
    listing = {"entries": ["__init__.py", "session.py", "tokens.py", "middleware.py"]}
    session = {
        "path": "src/auth/session.py",
        "lines": 42,
        "content": "from .tokens import issue\n\nSESSION_TTL = settings.SESSION_TTL\n\n"
        "def refresh(session):\n    return issue(session.user, ttl=SESSION_TTL)\n",
    }
    grep = {
        "matches": [
            {"path": "src/auth/tokens.py", "line": 17, "text": "def issue(user, ttl=300):"},
            {
                "path": "src/auth/session.py",
                "line": 6,
                "text": "    return issue(session.user, ttl=SESSION_TTL)",
            },
        ]
    }
    _cycle(
        r,
        [
            ("list_dir", {"path": "src/auth"}, listing),
            ("read_file", {"path": "src/auth/session.py"}, session),
            ("grep", {"pattern": "ttl", "path": "src/auth", "ignore_case": True}, grep),
        ],
        cycles=4,
        texts={1: "Let me look at the auth package.", 4: "Let me re-check the auth package layout."},
    )
    r.finish("truncated", terminated_by="loop")
    return r


def _noisy(r: Run, args: dict) -> dict:
    out = dict(args)
    out["request_id"] = r.req_id()
    out["timestamp"] = r.now()
    keys = list(out)
    r.rng.shuffle(keys)
    return {k: out[k] for k in keys}


@scenario
def loop_oscillate_web_noise(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="oscillation",
        pattern="oscillation_2_actions_noise",
        note="web_search <-> http_get alternate with fresh request_id/timestamp and shuffled keys every call.",
        backend="deepseek",
        model="deepseek-chat",
        agent="research-assistant",
        task_type="research",
    )
    r.user("What is the maximum payload of the Ariane 6 to GTO in the four-booster configuration?")
    search = {
        "results": [
            {"title": "Ariane 6 - Wikipedia", "url": "https://en.wikipedia.org/wiki/Ariane_6"},
            {"title": "Ariane 6 user's manual", "url": "https://www.arianespace.example/a6-manual.pdf"},
        ]
    }
    page = {
        "status": 200,
        "title": "Ariane 6 - Wikipedia",
        "text": "Ariane 6 is a European expendable launch system ... two variants: Ariane 62 with two boosters "
        "and Ariane 64 with four boosters ...",
    }
    _cycle(
        r,
        [
            ("web_search", {"query": "Ariane 64 GTO payload capacity", "num_results": 5}, search),
            ("http_get", {"url": "https://en.wikipedia.org/wiki/Ariane_6"}, page),
        ],
        cycles=5,
        noise=_noisy,
    )
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_oscillate_abc_invoices(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="oscillation",
        pattern="oscillation_3_actions",
        note="get_customer -> list_invoices -> get_invoice repeated 4 full cycles, nothing changes.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="billing-assistant",
        task_type="billing",
    )
    r.user("Why was I charged twice in February? Account C-6021.")
    cust = {
        "customer_id": "C-6021",
        "name": "Nadia Ferreira",
        "plan": "team",
        "billing_email": "ap@ferreira.example",
    }
    invs = {
        "invoices": [
            {"invoice_id": "INV-2026-0211", "amount": 240.0, "status": "paid"},
            {"invoice_id": "INV-2026-0212", "amount": 240.0, "status": "paid"},
        ]
    }
    inv = {"invoice_id": "INV-2026-0211", "amount": 240.0, "period": "2026-02", "payment_ids": ["PAY-99120"]}
    _cycle(
        r,
        [
            ("get_customer", {"customer_id": "C-6021"}, cust),
            ("list_invoices", {"customer_id": "C-6021", "month": "2026-02"}, invs),
            ("get_invoice", {"invoice_id": "INV-2026-0211"}, inv),
        ],
        cycles=4,
    )
    r.finish("abandoned", terminated_by="user")
    return r


@scenario
def loop_oscillate_calendar(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="oscillation",
        pattern="oscillation_2_actions",
        note="Meeting scheduler alternates check_availability and list_rooms for the same slot; no free room.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="scheduler",
        task_type="scheduling",
    )
    r.user("Book a room for 8 people on April 14 at 10:00 with Ana, Bo and Chen.")
    avail = {"date": "2026-04-14", "slot": "10:00-11:00", "all_free": True, "conflicts": []}
    rooms = {
        "building": "HQ",
        "rooms": [
            {"room": "Fjord", "capacity": 8, "free": False},
            {"room": "Delta", "capacity": 10, "free": False},
        ],
    }
    _cycle(
        r,
        [
            (
                "check_availability",
                {
                    "attendees": ["ana@corp.example", "bo@corp.example", "chen@corp.example"],
                    "date": "2026-04-14",
                    "start": "10:00",
                    "duration_min": 60,
                },
                avail,
            ),
            (
                "list_rooms",
                {"building": "HQ", "min_capacity": 8, "date": "2026-04-14", "start": "10:00"},
                rooms,
            ),
        ],
        cycles=6,
        texts={3: "No room is free yet; let me re-check availability and rooms."},
    )
    r.finish("truncated", terminated_by="loop")
    return r


def _sequence(
    r: Run,
    actions: dict[str, tuple[str, dict, Any]],
    order: str,
    label_at: int,
    texts: dict[int, str] | None = None,
) -> None:
    """Run actions by letter in `order`; label the call at 1-based position `label_at` of the sequence."""
    for pos, letter in enumerate(order, 1):
        tool, args, result = actions[letter]
        idx = r.step(tool, args, result, text=(texts or {}).get(pos))
        if pos == label_at:
            r.label_call(idx)


@scenario
def loop_interval_research_search(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="interval_loop",
        pattern="interval_search_returns",
        note="The same web search comes back every 3-4 calls between re-fetches of the same three pages.",
        backend="openai",
        model="gpt-4o",
        agent="research-assistant",
        task_type="research",
    )
    r.user("What was Acme Robotics' revenue in Q3 2025?")
    urls = [
        "https://news.example.com/acme-robotics-q3",
        "https://acme-robotics.example/ir/press",
        "https://finance.example.com/quote/ACMR",
    ]
    actions = {
        "S": (
            "web_search",
            {"query": "Acme Robotics Q3 2025 revenue"},
            {
                "results": [
                    {"url": u, "title": t}
                    for u, t in zip(
                        urls, ["Acme Robotics beats estimates", "Press releases", "ACMR quote"], strict=True
                    )
                ]
            },
        ),
        "A": (
            "http_get",
            {"url": urls[0]},
            {
                "status": 200,
                "text": "Acme Robotics beat estimates on strong demand... (full figures behind paywall)",
            },
        ),
        "B": (
            "http_get",
            {"url": urls[1]},
            {
                "status": 200,
                "text": "Press releases: 2025-10-02 New warehouse robot line; 2025-09-14 CFO appointment",
            },
        ),
        "C": (
            "http_get",
            {"url": urls[2]},
            {"status": 200, "text": "ACMR 41.22 USD +1.3% | Market cap 3.1B"},
        ),
    }
    # S at 1, 5, 8, 11, 15: novelty stops after call 4; the third return of S is call 8.
    _sequence(
        r,
        actions,
        "SABCSABSCASBCAS",
        label_at=8 + FUZZY_SLACK,
        texts={5: "I still need the exact revenue figure; let me search again."},
    )
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_interval_file_reread(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="interval_loop",
        pattern="interval_context_truncation",
        note="Context truncation: settings.py is re-read every 3-4 calls among repeated greps/listings.",
        backend="anthropic",
        model="claude-3-5-haiku",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("The app ignores DATABASE_URL in staging. Why?")
    settings_py = {
        "path": "app/settings.py",
        "lines": 120,
        "content": "import os\n...\nDATABASES = {'default': dj_database_url.parse(os.environ.get("
        "'DB_URL', 'sqlite:///db.sqlite3'))}\n...",
    }
    actions = {
        "D": (
            "list_dir",
            {"path": "."},
            {"entries": ["app", "config", "manage.py", ".env.example", "Dockerfile"]},
        ),
        "R": ("read_file", {"path": "app/settings.py"}, settings_py),
        "G": (
            "grep",
            {"pattern": "DATABASE_URL", "path": "."},
            {"matches": [{"path": "config/staging.env", "line": 3, "text": "DATABASE_URL=postgres://..."}]},
        ),
        "L": ("list_dir", {"path": "config"}, {"entries": ["staging.env", "prod.env", "local.env"]}),
        "E": (
            "read_file",
            {"path": ".env.example"},
            {"path": ".env.example", "lines": 4, "content": "DATABASE_URL=\nSECRET_KEY=\nDEBUG=0\n"},
        ),
    }
    # R at 2, 6, 9, 12, 16: novelty stops after call 5; the third return of R is call 9.
    _sequence(r, actions, "DRGLERGLREGRLEGR", label_at=9 + FUZZY_SLACK)
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_interval_order_support(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="interval_loop",
        pattern="interval_lookup_returns",
        note="Support agent keeps coming back to get_order every 3-4 calls; everything in between repeats too.",
        backend="deepseek",
        model="deepseek-chat",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("My parcel for order A-55120 was marked delivered but I never got it. I want a refund.")
    actions = {
        "X": (
            "get_customer",
            {"customer_id": "C-9001"},
            {"customer_id": "C-9001", "name": "Lea Moreau", "country": "FR", "claims_last_year": 0},
        ),
        "O": (
            "get_order",
            {"order_id": "A-55120"},
            order_record(
                "A-55120",
                "delivered",
                [("KETTLE-STEEL", 1, 59.9)],
                "2026-02-10T08:00:00Z",
                customer_id="C-9001",
            ),
        ),
        "Y": (
            "list_shipments",
            {"order_id": "A-55120"},
            {"shipments": [{"tracking": "CB123456789FR", "status": "delivered", "signed_by": None}]},
        ),
        "Z": (
            "get_refund_policy",
            {"region": "EU", "reason": "not_received"},
            {
                "policy": "Open a carrier claim first; refund after 5 business days if the claim is unresolved."
            },
        ),
    }
    # O at 2, 5, 9, 12, 16: novelty stops after call 4; the third return of O is call 9.
    _sequence(r, actions, "XOYZOXZYOXYOZXYO", label_at=9 + FUZZY_SLACK)
    r.finish("abandoned", terminated_by="user")
    return r


@scenario
def loop_interval_kb(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="interval_loop",
        pattern="interval_search_returns",
        note="Helpdesk agent's KB search returns every 3-4 calls among re-reads of the same two articles.",
        backend="local",
        model="qwen2.5-32b-instruct",
        agent="helpdesk",
        task_type="it_support",
    )
    r.user("I lost my phone and can't log in with 2FA. How do I reset it?")
    actions = {
        "K": (
            "search_kb",
            {"query": "reset two-factor authentication lost phone"},
            {
                "articles": [
                    {"id": "KB-1042", "title": "Set up 2FA"},
                    {"id": "KB-2210", "title": "Recovery codes"},
                ]
            },
        ),
        "M": (
            "get_article",
            {"id": "KB-1042"},
            {
                "id": "KB-1042",
                "body": "Open Settings > Security > 2FA and scan the QR code with your authenticator app.",
            },
        ),
        "N": (
            "get_article",
            {"id": "KB-2210"},
            {
                "id": "KB-2210",
                "body": "Recovery codes are shown once when 2FA is enabled. Store them safely.",
            },
        ),
        "P": (
            "search_tickets",
            {"query": "2fa reset lost phone", "status": "resolved"},
            {"tickets": [{"id": "T-7001", "resolution": "escalated to identity team"}]},
        ),
    }
    # K at 1, 4, 8, 11, 15: P (call 5) is the last new result, so the first return of K with only repeats
    # since its previous occurrence is call 11.
    _sequence(r, actions, "KMNKPMNKPMKNPMKNP", label_at=11 + FUZZY_SLACK)
    r.finish("truncated", terminated_by="loop")
    return r


# ================================================================================================
# LOOPS: parameter perturbation
# ================================================================================================


def _perturb(
    r: Run,
    tool: str,
    variants: list[dict],
    result: Any | Callable[[dict], Any],
    texts: dict[int, str] | None = None,
) -> None:
    """Call tool with each variant; label the 3rd nearly-equal call + FUZZY_SLACK."""
    for i, args in enumerate(variants):
        res = result(args) if callable(result) else result
        idx = r.step(tool, args, res, text=(texts or {}).get(i))
        if i == 2 + FUZZY_SLACK:
            r.label_call(idx)


@scenario
def loop_perturb_offset_jitter(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="perturbation",
        pattern="perturb_offset_jitter",
        note="After paging to the end (43 hits), the agent jitters offset 40/41/39/42 and only gets hits it "
        "has already seen.",
        backend="openai",
        model="gpt-4o",
        agent="oncall-helper",
        task_type="incident_triage",
    )
    r.user(
        "Find every checkout timeout in the logs from the last hour and tell me which upstream caused them."
    )
    hits = [
        {
            "ts": f"2026-03-09T10:{10 + k // 3:02d}:{(k * 7) % 60:02d}Z",
            "service": "checkout",
            "msg": f"upstream timeout after 5000ms (upstream={['payments', 'inventory', 'pricing'][k % 3]})",
        }
        for k in range(43)
    ]

    def page(args: dict) -> dict:
        off = args["offset"]
        return {"total": 43, "offset": off, "limit": 20, "hits": hits[off : off + 20]}

    for off in (0, 20):
        args = {"service": "checkout", "query": "timeout", "since": "1h", "offset": off, "limit": 20}
        r.step("search_logs", args, page(args), text="Reading the next page of log hits." if off else None)
    offsets = [40, 41, 40, 39, 42, 41, 40, 39, 41, 42, 40]
    _perturb(
        r,
        "search_logs",
        [
            {"service": "checkout", "query": "timeout", "since": "1h", "offset": o, "limit": 20}
            for o in offsets
        ],
        page,
        texts={
            1: "There may be more hits; let me adjust the offset.",
            5: "Let me try a slightly different offset.",
        },
    )
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_perturb_synonyms(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="perturbation",
        pattern="perturb_synonyms_spelling",
        note="'cancelled orders' / 'canceled orders' / 'orders that were cancelled' ... all return the same two.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Why did my last order get cancelled? I never cancelled anything. Customer C-7702.")
    res = {
        "orders": [
            {"order_id": "A-60233", "status": "canceled", "reason": "payment_failed"},
            {"order_id": "A-58112", "status": "canceled", "reason": "customer_request"},
        ]
    }
    queries = [
        "cancelled orders",
        "canceled orders",
        "orders that were cancelled",
        "cancelled order",
        "canceled",
        "cancellations",
        "orders cancelled recently",
        "Cancelled Orders",
    ]
    _perturb(
        r,
        "search_orders",
        [{"customer_id": "C-7702", "query": q} for q in queries],
        res,
        texts={1: "Let me search with a different spelling.", 3: "Maybe the search is sensitive to wording."},
    )
    r.finish("abandoned", terminated_by="user")
    return r


@scenario
def loop_perturb_extra_field(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="perturbation",
        pattern="perturb_extra_irrelevant_field",
        note="get_customer re-sent with verbose/include flags the API ignores; the same record every time.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="crm-assistant",
        task_type="crm",
    )
    r.user("What's the phone number on file for customer C-1188? I need to call them about a delivery.")
    rec = {
        "customer_id": "C-1188",
        "name": "Tomasz Wojcik",
        "email": "t.wojcik@example.pl",
        "phone": None,
        "address": "ul. Dluga 4, Gdansk",
    }
    variants = [
        {"customer_id": "C-1188"},
        {"customer_id": "C-1188", "verbose": True},
        {"customer_id": "C-1188", "include_contacts": True},
        {"customer_id": "C-1188", "verbose": True, "fields": "all"},
        {"verbose": True, "customer_id": "C-1188"},
        {"customer_id": "C-1188", "include_history": False},
        {"customer_id": "C-1188", "verbose": True, "include_contacts": True},
    ]
    _perturb(
        r, "get_customer", variants, rec, texts={1: "The phone field is empty; let me request full details."}
    )
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_perturb_case(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="perturbation",
        pattern="perturb_case_punctuation",
        note="The same web search retried with only letter case and punctuation changed; same results.",
        backend="deepseek",
        model="deepseek-chat",
        agent="oncall-helper",
        task_type="incident_triage",
    )
    r.user("Pods keep restarting with exit code 137. What does that mean and how do I fix it?")
    res = {
        "results": [
            {"title": "Exit code 137 - OOMKilled", "url": "https://kubernetes.example.io/oomkilled"},
            {"title": "Troubleshooting OOMKilled pods", "url": "https://blog.example.dev/oomkilled"},
        ]
    }
    queries = [
        "Kubernetes OOMKilled exit code 137",
        "kubernetes oomkilled exit code 137",
        "KUBERNETES OOMKILLED EXIT CODE 137",
        "Kubernetes OOMKilled exit code 137?",
        "kubernetes OOMKilled Exit Code 137.",
        "Kubernetes oomKilled exit-code 137",
        "kubernetes oomkilled exit code 137!",
    ]
    _perturb(r, "web_search", [{"query": q, "num_results": 10} for q in queries], res)
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_perturb_limit_whitespace(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="perturbation",
        pattern="perturb_mixed_small_changes",
        note="Product search nudged by spacing, hyphens, limit 10/11/12 and a default sort; the same 8 hits.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="shopping-assistant",
        task_type="shopping",
    )
    r.user("I need a USB-C hub with 4K HDMI and at least 85W passthrough, under 60 euros.")
    res = {
        "total": 8,
        "products": [
            {"sku": f"HUB-{k:03d}", "name": n, "price": p}
            for k, (n, p) in enumerate(
                [
                    ("7-in-1 USB-C Hub 4K", 39.9),
                    ("USB C Dock 4K60", 58.0),
                    ("Slim Hub 4K HDMI", 24.5),
                    ("Travel Hub 100W PD", 33.0),
                    ("8-port Hub", 45.0),
                    ("Hub Pro 4K", 59.0),
                    ("Mini Hub HDMI", 19.9),
                    ("Hub 6-in-1", 29.0),
                ]
            )
        ],
    }
    variants = [
        {"query": "usb-c hub 4k hdmi 85w", "limit": 10},
        {"query": "USB-C hub  4K HDMI 85W", "limit": 10},
        {"query": "usb c hub 4k hdmi 85w", "limit": 11},
        {"query": "usb-c hub 4k hdmi 85 w", "limit": 12},
        {"query": "usb-c hub 4K hdmi 85w", "limit": 10, "sort": "relevance"},
        {"query": " usb-c hub 4k hdmi 85w ", "limit": 10},
        {"query": "usb-c  hub 4k hdmi 85W", "limit": 11},
        {"query": "USB-C Hub 4K HDMI 85w", "limit": 10, "sort": "relevance"},
    ]
    _perturb(r, "search_products", variants, res, texts={1: "Let me refine the search to catch more hubs."})
    r.finish("truncated", terminated_by="loop")
    return r


# ================================================================================================
# LOOPS: repeated errors
# ================================================================================================


def _fail_repeat(
    r: Run,
    tool: str,
    args: dict | Callable[[Run], dict],
    error: Any,
    error_class: str,
    attempts: int,
    label_attempt: int,
    *,
    status: str = "error",
    gap: tuple[float, float] | None = None,
    texts: dict[int, str] | None = None,
) -> None:
    for i in range(1, attempts + 1):
        a = args(r) if callable(args) else args
        idx = r.step(
            tool, a, error, status=status, error_class=error_class, wait=gap or 0.0, text=(texts or {}).get(i)
        )
        if i == label_attempt:
            r.label_call(idx)


@scenario
def loop_error_invalid_argument(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="repeated_error",
        pattern="repeat_invalid_argument",
        note="get_order with an id missing its 'A-' prefix is rejected as invalid_argument; retried unchanged.",
        backend="openai",
        model="gpt-4o",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Order 20931 — can you tell me when it ships?")
    _fail_repeat(
        r,
        "get_order",
        {"order_id": "20931"},
        {"error": "invalid order_id '20931': must match ^A-\\d{5}$"},
        "invalid_argument",
        attempts=6,
        label_attempt=2,
        texts={1: "Let me look that order up.", 2: "Let me try that again."},
    )
    r.finish("failed", terminated_by="error", reason="invalid_argument repeated")
    return r


@scenario
def loop_error_not_found_file(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="repeated_error",
        pattern="repeat_not_found",
        note="Coding agent keeps reading a file that the directory listing showed does not exist.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("Add type hints to the helpers in src/utils/helpers.py.")
    r.step(
        "list_dir",
        {"path": "src/utils"},
        {"entries": ["__init__.py", "dates.py", "strings.py"]},
        text="Let me look at the utils package.",
    )
    _fail_repeat(
        r,
        "read_file",
        {"path": "src/utils/helpers.py"},
        {"error": "No such file or directory: 'src/utils/helpers.py'"},
        "not_found",
        attempts=5,
        label_attempt=2,
    )
    r.finish("failed", terminated_by="error")
    return r


@scenario
def loop_error_rate_limited_no_backoff(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="repeated_error",
        pattern="rate_limited_beyond_quota",
        note="GitHub API says rate limited (retry after 60s); the agent retries 7 times within seconds.",
        backend="deepseek",
        model="deepseek-chat",
        agent="repo-analyst",
        task_type="research",
    )
    r.user("How many open issues labelled 'bug' does octo-org/widgets have?")
    _fail_repeat(
        r,
        "http_get",
        {
            "url": "https://api.github.example.com/repos/octo-org/widgets/issues?labels=bug"
            "&state=open&per_page=100"
        },
        {"status": 429, "message": "API rate limit exceeded", "retry_after_s": 60},
        "rate_limited",
        attempts=8,
        label_attempt=RETRY_QUOTA + 2,
        gap=(0.2, 0.9),
    )
    r.finish("failed", terminated_by="error")
    return r


@scenario
def loop_error_permission(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="repeated_error",
        pattern="repeat_permission_denied",
        note="Analyst agent re-runs a query on a table it has no grant for; the same permission error 5 times.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="sql-analyst",
        task_type="analytics",
    )
    r.user("What's the average salary per department?")
    _fail_repeat(
        r,
        "sql_query",
        {
            "sql": "SELECT department, avg(salary) FROM hr.salaries GROUP BY department",
            "database": "warehouse",
        },
        {"error": "permission denied for schema hr", "sqlstate": "42501"},
        "permission",
        attempts=5,
        label_attempt=2,
    )
    r.finish("failed")
    return r


@scenario
def loop_error_parse_error(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="repeated_error",
        pattern="repeat_parse_error",
        note="The same misspelt SQL (SELEC) fails with a syntax error five times.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="sql-analyst",
        task_type="analytics",
    )
    r.user("List the 10 customers with the highest lifetime spend.")
    _fail_repeat(
        r,
        "sql_query",
        {
            "sql": "SELEC c.name, sum(o.total) AS spend FROM customers c JOIN orders o "
            "ON o.customer_id = c.id GROUP BY c.name ORDER BY spend DESC LIMIT 10"
        },
        {"error": 'syntax error at or near "SELEC"', "position": 1},
        "parse_error",
        attempts=5,
        label_attempt=2,
        texts={2: "Let me run the query again."},
    )
    r.finish("failed")
    return r


@scenario
def loop_error_transient_no_backoff(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="repeated_error",
        pattern="transient_beyond_quota",
        note="Inventory API returns 503; the agent retries 7 times immediately, far past the retry quota.",
        backend="anthropic",
        model="claude-3-5-haiku",
        agent="ops-bot",
        task_type="inventory",
    )
    r.user("How many units of SKU KETTLE-STEEL are left in the Lyon warehouse?")
    _fail_repeat(
        r,
        "http_get",
        {"url": "https://inventory.internal.example/v1/stock?sku=KETTLE-STEEL&wh=LYS1"},
        {"status": 503, "body": "upstream connect error or disconnect/reset before headers"},
        "transient",
        attempts=8,
        label_attempt=RETRY_QUOTA + 2,
        gap=(0.1, 0.5),
    )
    r.finish("failed", terminated_by="error")
    return r


@scenario
def loop_error_empty_result(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="repeated_error",
        pattern="repeat_empty_result",
        note="Order search by a mistyped e-mail returns empty_result; the agent repeats it unchanged.",
        backend="deepseek",
        model="deepseek-chat",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("I ordered a lamp last week with jon.smith@exmaple.com, where is it?")
    _fail_repeat(
        r,
        "search_orders",
        {"email": "jon.smith@exmaple.com", "since": "2026-03-01"},
        {"orders": []},
        "empty_result",
        attempts=6,
        label_attempt=2,
        status="ok",
    )
    r.finish("abandoned", terminated_by="user")
    return r


@scenario
def loop_error_not_found_noise(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="repeated_error",
        pattern="repeat_not_found_noise",
        note="get_invoice for a non-existent id fails not_found 6 times; request_id/timestamp noise each call.",
        backend="openai",
        model="gpt-4o",
        agent="billing-assistant",
        task_type="billing",
    )
    r.user("Please resend invoice INV-2026-0042.")
    _fail_repeat(
        r,
        "get_invoice",
        lambda rr: {"invoice_id": "INV-2026-0042", "request_id": rr.req_id(), "timestamp": rr.now()},
        {"error": "invoice INV-2026-0042 not found"},
        "not_found",
        attempts=6,
        label_attempt=2,
    )
    r.finish("failed")
    return r


# ================================================================================================
# LOOPS: clarification, monologue, empty responses (labelled by model round)
# ================================================================================================


@scenario
def loop_clarify_verbatim(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="clarification",
        pattern="clarify_same_question_verbatim",
        note="The agent asks which order to cancel four times, word for word, although the user answered.",
        backend="openai",
        model="gpt-4o",
        agent="support-bot",
        task_type="order_support",
    )
    r.user("Cancel my order please, I don't need it anymore.")
    r.step(
        "search_orders",
        {"customer_id": "C-2207", "status": "processing"},
        {
            "orders": [
                {"order_id": "A-40112", "items": ["Bose QC45 headphones"]},
                {"order_id": "A-40117", "items": ["USB-C charger 65W"]},
            ]
        },
    )
    q = "Which order would you like to cancel: A-40112 (Bose QC45 headphones) or A-40117 (USB-C charger)?"
    r.model(q)
    r.user("The headphones one.")
    r.label_round(r.model(q))
    r.user("A-40112. The headphones.")
    r.model(q)
    r.user("I already told you twice. A-40112!")
    r.model(q)
    r.user("Forget it, I'll call support.")
    r.finish("abandoned", terminated_by="user")
    return r


@scenario
def loop_clarify_paraphrased(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="clarification",
        pattern="clarify_paraphrased",
        note="The agent keeps asking the user to confirm the shipping address in new words; the user answered.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="shop-assistant",
        task_type="order_support",
    )
    r.user("Please send the replacement to my Paris address.")
    r.step(
        "get_customer",
        {"customer_id": "C-8130"},
        {
            "customer_id": "C-8130",
            "addresses": [
                {"id": "ADDR-1", "line": "12 Rue de Rivoli, 75004 Paris"},
                {"id": "ADDR-2", "line": "5 Quai Perrache, 69002 Lyon"},
            ],
        },
    )
    asks = [
        "Could you confirm the shipping address for the replacement?",
        "Just to be sure — which address should I ship the replacement to?",
        "Before I continue, can you please confirm the delivery address?",
        "To proceed, I need the shipping address confirmed. Which one should I use?",
    ]
    answers = [
        "12 Rue de Rivoli, Paris.",
        "The Paris one, 12 Rue de Rivoli.",
        "ADDR-1. 12 Rue de Rivoli, 75004 Paris. Same as I said.",
        "Are you reading my messages?",
    ]
    for i, (ask, ans) in enumerate(zip(asks, answers, strict=True)):
        rnd = r.model(ask)
        if i == 2:
            r.label_round(rnd)
        r.user(ans)
    r.finish("abandoned", terminated_by="user")
    return r


@scenario
def loop_clarify_after_tools(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="clarification",
        pattern="clarify_paraphrased_between_tools",
        note="Travel agent asks for the travel dates, searches, then asks for the dates again (x4).",
        backend="deepseek",
        model="deepseek-chat",
        agent="travel-planner",
        task_type="trip_planning",
    )
    r.user("Find me a flight from Berlin to Lisbon.")
    asks = [
        "What dates would you like to travel?",
        "Could you tell me your travel dates?",
        "Which dates are you planning to fly?",
        "When would you like to depart and return?",
    ]
    for i, ask in enumerate(asks):
        rnd = r.model(ask)
        if i == 2:
            r.label_round(rnd)
        r.user("Out on April 3rd, back April 10th." if i < 3 else "I have given you the dates three times.")
        r.step(
            "search_flights",
            {"from": "BER", "to": "LIS", "depart": "2026-04-03", "return": "2026-04-10"},
            {
                "offers": [
                    {"carrier": "TP", "price": 212.0, "stops": 0},
                    {"carrier": "FR", "price": 139.0, "stops": 0},
                ]
            },
        )
    r.finish("abandoned", terminated_by="user")
    return r


@scenario
def loop_monologue_will_check(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="monologue",
        pattern="monologue_same_announcement",
        note="'I will now check the order status.' six rounds in a row with no tool call.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Has order A-77310 shipped?")
    r.model("I will now check the order status.")
    for i in range(5):
        rnd = r.model("I will now check the order status.")
        if i == 0:
            r.label_round(rnd)
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_monologue_paraphrased(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="monologue",
        pattern="monologue_paraphrased_with_nudges",
        note="The agent announces it will retrieve the invoice in new words each round, never calls the tool; "
        "the runtime nudges it to continue.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="billing-assistant",
        task_type="billing",
    )
    r.user("Send me a copy of my March invoice.")
    texts = [
        "Let me look up the invoice now.",
        "I'll pull up your March invoice now.",
        "Now I will retrieve the invoice for March.",
        "Next, I'm going to fetch the March invoice.",
        "I will now get the invoice.",
        "Let me retrieve the March invoice for you now.",
    ]
    for i, text in enumerate(texts):
        rnd = r.model(text)
        if i == 2:
            r.label_round(rnd)
        if i < len(texts) - 1:
            r.user("Please continue with the task.", think=(0.2, 0.6))
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_monologue_after_work(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="monologue",
        pattern="monologue_after_real_work",
        note="After real work the agent repeats 'I will now send the summary email' five times, never sends.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="account-manager",
        task_type="reporting",
    )
    r.user("Summarise last month's usage for Globex and email it to their admin.")
    r.step(
        "sql_query",
        {
            "sql": "SELECT day, api_calls FROM usage WHERE tenant = 'globex' AND day >= '2026-02-01'"
            " AND day < '2026-03-01' ORDER BY day"
        },
        {"row_count": 28, "rows": [["2026-02-01", 18211], ["2026-02-02", 17430]], "truncated": True},
    )
    r.step(
        "get_customer",
        {"customer_id": "C-0042"},
        {"customer_id": "C-0042", "name": "Globex", "admin_email": "it-admin@globex.example"},
    )
    text = "I will now send the summary email to it-admin@globex.example."
    r.model(text)
    for i in range(4):
        rnd = r.model(text)
        if i == 0:
            r.label_round(rnd)
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_empty_local(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="empty_responses",
        pattern="empty_rounds_no_text",
        note="A local model returns six empty responses in a row (no text, no tokens, no calls).",
        backend="local",
        model="qwen2.5-32b-instruct",
        agent="doc-writer",
        task_type="writing",
    )
    r.user("Write release notes for v2.4 from the merged PRs.")
    r.step(
        "http_get",
        {"url": "https://git.internal.example/api/v4/projects/12/merge_requests?state=merged&milestone=v2.4"},
        {
            "status": 200,
            "items": [{"iid": 811, "title": "Add CSV export"}, {"iid": 815, "title": "Fix TZ bug"}],
        },
    )
    for i in range(6):
        rnd = r.model(None, out=0)
        if i == 2:
            r.label_round(rnd)
    r.finish("failed", terminated_by="error", reason="model returned no output")
    return r


@scenario
def loop_empty_after_error(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="empty_responses",
        pattern="empty_rounds_after_error",
        note="After a tool error the model returns empty strings five rounds in a row.",
        backend="deepseek",
        model="deepseek-chat",
        agent="ops-bot",
        task_type="inventory",
    )
    r.user("Restock report for the Lyon warehouse, please.")
    r.step(
        "sql_query",
        {"sql": "SELECT sku, qty FROM stock WHERE wh = 'LYS1' AND qty < reorder_point"},
        {"error": 'relation "stock" does not exist'},
        status="error",
        error_class="invalid_argument",
    )
    for i in range(5):
        rnd = r.model("", out=1)
        if i == 2:
            r.label_round(rnd)
    r.finish("failed")
    return r


@scenario
def loop_empty_whitespace(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="empty_responses",
        pattern="empty_rounds_whitespace",
        note="The model answers with only whitespace/newlines five rounds in a row.",
        backend="openai",
        model="gpt-4o",
        agent="research-assistant",
        task_type="research",
    )
    r.user("Compare the battery life of the two laptops I shortlisted yesterday.")
    r.step(
        "read_file",
        {"path": "notes/shortlist.md"},
        {"content": "- ThinkPad X1 Carbon Gen 12\n- MacBook Air 13 M3\n", "lines": 2},
    )
    for i, text in enumerate(["\n", "\n\n", " ", "\n", " \n "]):
        rnd = r.model(text, out=1)
        if i == 2:
            r.label_round(rnd)
    r.finish("failed")
    return r


# ================================================================================================
# LOOPS: no progress, poll budget, duplicate writes, budgets
# ================================================================================================


def _stall(r: Run, calls: list[tuple[str, dict, Any]], texts: dict[int, str] | None = None) -> None:
    """Different-looking calls whose results bring nothing new; label K+slack into the stall."""
    for i, (tool, args, result) in enumerate(calls):
        idx = r.step(tool, args, result, text=(texts or {}).get(i))
        if i == NO_PROGRESS_K - 1 + FUZZY_SLACK:
            r.label_call(idx)


@scenario
def loop_no_progress_kb_queries(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="no_progress",
        pattern="no_progress_varied_queries",
        note="Helpdesk agent tries 24 differently worded KB/ticket searches that keep returning what it has "
        "already read.",
        backend="openai",
        model="gpt-4o",
        agent="helpdesk",
        task_type="it_support",
    )
    r.user("Outlook on my Mac keeps asking for my password every few minutes. How do I stop it?")
    arts = {
        "articles": [
            {"id": "KB-311", "title": "Outlook password prompts (Windows)"},
            {"id": "KB-318", "title": "Reset your network password"},
        ]
    }
    r.step("search_kb", {"query": "outlook keeps asking for password"}, arts)
    r.step(
        "get_article",
        {"id": "KB-311"},
        {"id": "KB-311", "body": "On Windows, clear Credential Manager entries for Outlook, then restart."},
    )
    r.step("get_article", {"id": "KB-318"}, {"id": "KB-318", "body": "Use https://pw.corp.example to reset."})
    tickets = {"tickets": [{"id": "T-4411", "title": "Outlook password loop", "resolution": "see KB-311"}]}
    r.step("search_tickets", {"query": "outlook password prompt"}, tickets)
    kb_queries = [
        "outlook mac password prompt",
        "outlook macOS repeated login",
        "mac mail credentials keychain",
        "outlook for mac authentication loop",
        "exchange password prompt mac",
        "keychain outlook reset",
        "modern authentication outlook mac",
        "outlook asks for credentials repeatedly",
        "office 365 mac sign in loop",
        "outlook profile reset mac",
        "macos keychain access outlook",
        "password prompt every few minutes",
    ]
    ticket_queries = [
        "mac outlook password",
        "keychain outlook",
        "outlook login loop mac",
        "o365 prompt mac",
        "outlook credentials macOS",
        "exchange auth mac",
        "outlook sign-in mac",
        "password popup mac",
        "outlook keeps prompting",
        "outlook mac 16.8 password",
        "mac mail password prompt",
        "outlook repeated authentication",
    ]
    calls: list[tuple[str, dict, Any]] = []
    for kq, tq in zip(kb_queries, ticket_queries, strict=True):
        calls.append(("search_kb", {"query": kq}, arts))
        calls.append(("search_tickets", {"query": tq}, tickets))
    _stall(
        r,
        calls,
        texts={
            0: "Those articles are for Windows. Let me search for the Mac-specific fix.",
            8: "Let me try different wording.",
        },
    )
    r.finish("abandoned", terminated_by="user")
    return r


@scenario
def loop_no_progress_empty_greps(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="no_progress",
        pattern="no_progress_empty_searches",
        note="Coding agent greps 24 different patterns/paths for a symbol that doesn't exist; no matches ever.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("Where do we compute the loyalty discount? Customers say it's applied twice.")
    r.step("list_dir", {"path": "src"}, {"entries": ["billing", "cart", "catalog", "users", "promotions"]})
    r.step(
        "grep",
        {"pattern": "discount", "path": "src/cart"},
        {"matches": [{"path": "src/cart/totals.py", "line": 33, "text": "total -= promotions.apply(cart)"}]},
    )
    patterns = [
        "loyalty_discount",
        "LoyaltyDiscount",
        "loyalty",
        "apply_loyalty",
        "LOYALTY_RATE",
        "tier_discount",
        "member_discount",
        "points_discount",
        "discount_pct",
        "loyalty_tier",
        "LoyaltyRule",
        "get_loyalty",
    ]
    paths = ["src", "src/promotions", "src/billing", "src/users"]
    calls = [
        ("grep", {"pattern": p, "path": paths[i % 4], "ignore_case": i % 2 == 0}, {"matches": []})
        for i, p in enumerate(patterns)
    ]
    calls += [
        ("find_files", {"glob": g}, {"files": []})
        for g in [
            "**/*loyal*",
            "**/*tier*.py",
            "**/discount*.py",
            "src/**/rules_*.py",
            "**/*member*",
            "**/*points*",
            "**/*reward*",
            "**/*bonus*.py",
            "**/*perk*",
            "**/*vip*",
            "**/*club*",
            "**/*promo_*.py",
        ]
    ]
    r.rng.shuffle(calls)
    _stall(r, calls, texts={0: "The discount must be computed in a loyalty module; let me find it."})
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_no_progress_blocked_scrape(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="no_progress",
        pattern="no_progress_same_block_page",
        note="Price scraper fetches 22 different product URLs of one shop and gets the same captcha page.",
        backend="deepseek",
        model="deepseek-chat",
        agent="price-watcher",
        task_type="scraping",
    )
    r.user("Get the current prices of our 5 competitors' espresso machines.")
    r.step(
        "http_get",
        {"url": "https://shop-a.example/espresso/barista-pro"},
        {"status": 200, "title": "Barista Pro", "price": 649.0},
    )
    r.step(
        "http_get",
        {"url": "https://shop-b.example/p/ec-685"},
        {"status": 200, "title": "EC 685", "price": 179.0},
    )
    captcha = {
        "status": 200,
        "title": "Just a moment...",
        "text": "Please verify you are a human. Enable JavaScript and cookies to continue.",
    }
    slugs = [
        "magnifica-s",
        "dedica-style",
        "la-specialista",
        "primadonna",
        "eletta-explore",
        "rivelia",
        "stilosa",
        "magnifica-evo",
        "dinamica-plus",
        "perfecto",
        "maestosa",
        "icona-vintage",
        "scultura",
        "autentica",
        "caffe-corso",
        "lattissima",
        "gran-dama",
        "clessidra",
        "specialista-arte",
        "distinta",
        "brillante",
        "avvolta",
    ]
    calls = [
        (
            "http_get",
            {"url": f"https://shop-c.example/products/{s}", "headers": {"Accept-Language": "de-DE"}},
            captcha,
        )
        for s in slugs
    ]
    _stall(r, calls, texts={0: "Next, the third shop.", 5: "Let me try other product pages on this shop."})
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_no_progress_sql_variants(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="no_progress",
        pattern="no_progress_zero_rows",
        note="Analyst agent rewrites its query 22 ways looking for a customer that isn't there; 0 rows each.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="sql-analyst",
        task_type="analytics",
    )
    r.user("What did the customer 'Brightwave GmbH' spend in 2025?")
    r.step("sql_query", {"sql": "SELECT count(*) FROM customers"}, {"rows": [[48211]], "row_count": 1})
    empty = {"rows": [], "row_count": 0}
    names = [
        "Brightwave GmbH",
        "Brightwave",
        "BrightWave GmbH",
        "Bright Wave GmbH",
        "brightwave gmbh",
        "Brightwave AG",
        "Brightwave%",
        "%wave GmbH",
        "%Brightwave%",
        "BRIGHTWAVE",
        "Brightwave Gmbh.",
        "Brightwave-GmbH",
    ]
    calls = []
    for i, n in enumerate(names):
        op = "ILIKE" if "%" in n or i % 3 == 0 else "="
        calls.append(("sql_query", {"sql": f"SELECT id, name FROM customers WHERE name {op} '{n}'"}, empty))
        calls.append(
            (
                "sql_query",
                {
                    "sql": f"SELECT sum(total) FROM orders o JOIN customers c ON c.id = "
                    f"o.customer_id WHERE c.name {op} '{n}' AND o.year = 2025"
                },
                {"rows": [[None]], "row_count": 1},
            )
        )
    calls = calls[:22]
    _stall(r, calls, texts={0: "Let me find the customer id first."})
    r.finish("truncated", terminated_by="loop")
    return r


def _polls(
    r: Run,
    job: str,
    n: int,
    result: Callable[[int], Any],
    wait: tuple[float, float],
    label_poll: int | None = None,
    text: Callable[[int], str | None] | None = None,
) -> None:
    for i in range(1, n + 1):
        if i > 1:
            r.advance(*wait)  # the agent sleeps between polls; the result is computed after the wait
        idx = r.step("get_job_status", {"job_id": job}, result(i), text=text(i) if text else None)
        if i == label_poll:
            r.label_call(idx)


@scenario
def loop_poll_declared_budget(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="poll_budget",
        pattern="poll_stuck_past_declared_budget",
        note="Export job stays RUNNING at 42% for 32 polls; max_same_tool_retries=10 is spent at poll 11.",
        backend="openai",
        model="gpt-4o",
        agent="report-bot",
        task_type="report_export",
        budgets={"max_same_tool_retries": 10},
    )
    r.user("Export all 2025 invoices as CSV and send me the link.")
    r.step(
        "start_export",
        {"dataset": "invoices", "year": 2025, "format": "csv"},
        {"job_id": "exp_7Qk2m", "status": "QUEUED"},
    )
    base = r.calls
    _polls(
        r,
        "exp_7Qk2m",
        32,
        lambda i: job_status("exp_7Qk2m", "RUNNING", progress=0.42, rows_written=1_204_000),
        wait=(18, 22),
        label_poll=11,
        text=lambda i: "The export is still running; I'll check again shortly." if i % 4 == 1 else None,
    )
    assert r.by_call == base + 11
    r.finish("truncated", terminated_by="budget", budget_type="max_same_tool_retries")
    return r


@scenario
def loop_poll_running_forever(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="poll_budget",
        pattern="poll_stuck_running_long",
        note="A data pipeline job reports the identical RUNNING status for 40 polls over ~13 minutes.",
        backend="anthropic",
        model="claude-3-5-haiku",
        agent="pipeline-operator",
        task_type="data_pipeline",
    )
    r.user("Re-run yesterday's sales aggregation and tell me when the dashboard is updated.")
    r.step(
        "start_export",
        {"pipeline": "sales_daily_agg", "date": "2026-03-09"},
        {"job_id": "run-20260310-0017", "status": "SUBMITTED"},
    )
    _polls(
        r,
        "run-20260310-0017",
        40,
        lambda i: job_status("run-20260310-0017", "RUNNING", stage="aggregate"),
        wait=(15, 25),
        label_poll=POLL_LOOP_LABEL,
    )
    r.finish("abandoned", terminated_by="user", reason="operator cancelled the run")
    return r


@scenario
def loop_poll_result_noise(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="poll_budget",
        pattern="poll_stuck_noisy_result",
        note="Build status frozen at RUNNING 67% for 36 polls; only checked_at/request_id in the result change.",
        backend="deepseek",
        model="deepseek-chat",
        agent="release-bot",
        task_type="default",
    )
    r.user("Kick off the release build for v3.2.0 and tell me when it's done.")
    r.step(
        "start_export",
        {"pipeline": "release", "ref": "v3.2.0"},
        {"job_id": "build-88213", "status": "PENDING"},
    )
    _polls(
        r,
        "build-88213",
        36,
        lambda i: job_status(
            "build-88213",
            "RUNNING",
            progress=0.67,
            step="integration-tests",
            checked_at=r.later(2.5),
            request_id=r.req_id(),
        ),
        wait=(10, 16),
        label_poll=POLL_LOOP_LABEL,
    )
    r.finish("truncated", terminated_by="loop")
    return r


@scenario
def loop_dup_write_place_order_timeout(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="duplicate_write",
        pattern="write_retry_after_timeout_same_key",
        note="place_order times out (UNKNOWN) and is retried twice with the same operation_key; two orders exist.",
        backend="openai",
        model="gpt-4o",
        agent="shop-assistant",
        task_type="purchase",
    )
    r.user("Order one pack of Lavazza Qualita Oro beans, 1kg, to my usual address.")
    r.step(
        "search_products",
        {"query": "Lavazza Qualita Oro 1kg beans"},
        {"products": [{"sku": "LAV-QO-1000", "name": "Lavazza Qualita Oro 1kg", "price": 18.9}]},
    )
    args = {"sku": "LAV-QO-1000", "qty": 1, "address_id": "ADDR-1", "payment_method": "card_on_file"}
    key = "op-ord-" + r.hex(12)
    r.step(
        "place_order",
        args,
        "Timed out after 30s",
        status="timeout",
        operation_key=key,
        step_id="s3",
        text="Placing the order now.",
    )
    retry = r.step(
        "place_order",
        args,
        "Timed out after 30s",
        status="timeout",
        operation_key=key,
        step_id="s3",
        text="The order request timed out; let me try again.",
    )
    r.label_call(retry)
    r.step(
        "place_order",
        args,
        {"order_id": "A-71002", "status": "placed", "total": 18.9},
        operation_key=key,
        step_id="s3",
        external_request_id="ord_9f2a71002",
    )
    r.step(
        "search_orders",
        {"customer_id": "C-4410", "since": r.now()[:10]},
        {
            "orders": [
                {"order_id": "A-71001", "sku": "LAV-QO-1000", "status": "placed"},
                {"order_id": "A-71002", "sku": "LAV-QO-1000", "status": "placed"},
            ]
        },
    )
    r.finish(
        "failed",
        reason="two orders placed for one request",
        answer="Your order is placed (A-71002). Note: a second order A-71001 also appears; I have flagged it.",
    )
    return r


@scenario
def loop_dup_write_refund_step_id(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="duplicate_write",
        pattern="write_retry_after_timeout_same_step",
        note="refund_payment (no operation_key, same step_id) times out and is re-sent; the customer gets two "
        "refunds.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="billing-assistant",
        task_type="refund",
    )
    r.user("Refund the 49.90 charge on payment PAY-30218, the item never shipped.")
    r.step(
        "get_payment",
        {"payment_id": "PAY-30218"},
        {"payment_id": "PAY-30218", "amount": 49.9, "currency": "EUR", "status": "captured", "refunds": []},
    )
    args = {"payment_id": "PAY-30218", "amount": 49.9, "reason": "not_shipped"}
    r.step("refund_payment", args, None, status="timeout", step_id="refund-PAY-30218")
    r.label_call(
        r.step(
            "refund_payment",
            args,
            {"refund_id": "RF-1182", "status": "succeeded"},
            step_id="refund-PAY-30218",
            text="The refund call timed out. Retrying it.",
            external_request_id="re_3NqT1182",
        )
    )
    r.step(
        "get_payment",
        {"payment_id": "PAY-30218"},
        {
            "payment_id": "PAY-30218",
            "amount": 49.9,
            "status": "refunded",
            "refunds": [{"refund_id": "RF-1181", "amount": 49.9}, {"refund_id": "RF-1182", "amount": 49.9}],
        },
    )
    r.finish("failed", reason="double refund")
    return r


@scenario
def loop_dup_write_email_same_key(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="duplicate_write",
        pattern="write_retry_after_timeout_key_new_step",
        note="send_email times out; retried under a new step_id but the same operation_key (the key wins).",
        backend="deepseek",
        model="deepseek-chat",
        agent="collections-bot",
        task_type="dunning",
    )
    r.user("Send the overdue reminder for invoice INV-2026-0190 to the customer.")
    r.step(
        "get_invoice",
        {"invoice_id": "INV-2026-0190"},
        {
            "invoice_id": "INV-2026-0190",
            "amount": 1290.0,
            "due": "2026-02-28",
            "contact": "ap@brightwave.example",
        },
    )
    key = "dunning:INV-2026-0190:reminder-1"
    body = {
        "to": "ap@brightwave.example",
        "subject": "Reminder: invoice INV-2026-0190 is overdue",
        "template": "overdue_reminder",
        "vars": {"invoice_id": "INV-2026-0190", "amount": "1,290.00 EUR"},
    }
    r.step("send_email", body, None, status="timeout", operation_key=key, step_id="step-4")
    r.label_call(
        r.step(
            "send_email",
            body,
            None,
            status="timeout",
            operation_key=key,
            step_id="step-5",
            text="The email service timed out; sending again.",
        )
    )
    r.step(
        "send_email",
        body,
        {"message_id": "<a81f@mail.example>", "status": "queued"},
        operation_key=key,
        step_id="step-6",
    )
    r.finish("succeeded", answer="The reminder has been sent to ap@brightwave.example.")
    return r


@scenario
def loop_budget_max_tool_calls(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="budget",
        pattern="budget_tool_calls",
        note="Coding agent reads file after file past its declared max_tool_calls=20 (26 calls).",
        backend="openai",
        model="gpt-4o",
        agent="code-reviewer",
        task_type="code_review",
        budgets={"max_tool_calls": 20},
    )
    r.user("Review the PR that refactors the payment adapters.")
    files = [
        f"src/payments/adapters/{n}.py"
        for n in [
            "base",
            "stripe",
            "adyen",
            "paypal",
            "klarna",
            "mollie",
            "braintree",
            "square",
            "worldpay",
            "checkout_com",
            "gocardless",
            "sepa",
            "ideal",
            "bancontact",
            "giropay",
            "sofort",
            "eps",
            "przelewy24",
            "blik",
            "twint",
            "mobilepay",
            "vipps",
            "swish",
            "trustly",
            "satispay",
            "bizum",
        ]
    ]
    for i, f in enumerate(files):
        idx = r.step(
            "read_file",
            {"path": f},
            {
                "path": f,
                "lines": 60 + i * 3,
                "content": f"class {f.rsplit('/', 1)[1].title()}Adapter(BaseAdapter):\n    ...",
            },
        )
        if i + 1 == 20:
            r.label_call(idx)
    r.finish("truncated", terminated_by="budget", budget_type="max_tool_calls")
    return r


@scenario
def loop_budget_max_rounds(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="budget",
        pattern="budget_rounds",
        note="Agent runs 15 model rounds against a declared max_rounds=10.",
        backend="anthropic",
        model="claude-3-5-haiku",
        agent="data-cleaner",
        task_type="data_cleanup",
        budgets={"max_rounds": 10},
    )
    r.user("Find duplicate customer records created in February and list them.")
    for i in range(14):
        rnd_before = r.rounds
        r.step(
            "sql_query",
            {
                "sql": f"SELECT a.id, b.id FROM customers a JOIN customers b ON a.email = b.email AND "
                f"a.id < b.id WHERE a.created_at::date = '2026-02-{i + 1:02d}'"
            },
            {"rows": [[40000 + i * 7, 40003 + i * 7]], "row_count": 1},
        )
        if rnd_before + 1 == 10:
            r.label_round(10)
    r.finish(
        "truncated",
        terminated_by="budget",
        budget_type="max_rounds",
        answer="Found 14 duplicate pairs so far (one per day checked).",
    )
    return r


@scenario
def loop_budget_max_cost(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="budget",
        pattern="budget_cost",
        note="A long-context summarisation burns past max_cost_usd=0.03 (cost_usd on every round).",
        backend="deepseek",
        model="deepseek-chat",
        agent="doc-summariser",
        task_type="summarisation",
        budgets={"max_cost_usd": 0.03},
        with_cost=True,
    )
    r.user("Summarise all 30 chapters of the 2025 annual report.")
    r.ctx = 9000
    for ch in range(1, 21):
        r.step(
            "read_file",
            {"path": f"reports/annual-2025/chapter-{ch:02d}.md"},
            {
                "path": f"reports/annual-2025/chapter-{ch:02d}.md",
                "lines": 400,
                "content": f"# Chapter {ch}\n" + ("Revenue grew in all regions. " * 220),
            },
        )
    r.label_round(r.first_round(lambda tokens, cost: cost >= 0.03))
    r.finish("truncated", terminated_by="budget", budget_type="max_cost_usd")
    return r


@scenario
def loop_budget_max_tokens(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="budget",
        pattern="budget_tokens",
        note="A local model re-reads large logs until cumulative tokens pass max_tokens=150000.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="log-analyst",
        task_type="log_analysis",
        budgets={"max_tokens": 150000},
    )
    r.user("Why did the nightly batch fail? Look at the worker logs.")
    for h in range(14):
        r.step(
            "read_file",
            {"path": f"/var/log/worker/nightly-2026-03-10T{h:02d}.log"},
            {
                "lines": 2000,
                "content": f"[{h:02d}:00:01] INFO batch step {h} started\n" + ("DEBUG tick\n" * 900),
            },
        )
    r.label_round(r.first_round(lambda tokens, cost: tokens >= 150000))
    r.finish("truncated", terminated_by="budget", budget_type="max_tokens")
    return r


@scenario
def loop_budget_max_wall(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="budget",
        pattern="budget_wall_clock",
        note="Slow crawler keeps going past max_wall_s=600 (about 15 minutes in total).",
        backend="openai",
        model="gpt-4.1-mini",
        agent="site-auditor",
        task_type="crawl",
        budgets={"max_wall_s": 600},
    )
    r.user("Check every page of docs.example.org for broken links.")
    for k in range(18):
        r.step(
            "http_get",
            {"url": f"https://docs.example.org/guide/section-{k + 1}"},
            {"status": 200, "links": 30 + k, "broken": [f"/old/page-{k}"] if k % 5 == 0 else []},
            latency=r.rng.uniform(40, 55),
        )
    r.label_call(r.first_call_after(600))
    r.finish("truncated", terminated_by="budget", budget_type="max_wall_s")
    return r


@scenario
def loop_budget_tool_calls_parallel(name: str) -> Run:
    r = Run(
        name,
        expect="loop",
        loop_kind="budget",
        pattern="budget_tool_calls_parallel",
        note="Parallel batches of 6 quote lookups overrun max_tool_calls=30 (36 calls, the 30th mid-batch).",
        backend="deepseek",
        model="deepseek-chat",
        agent="portfolio-bot",
        task_type="portfolio",
        budgets={"max_tool_calls": 30},
    )
    r.user("Give me today's prices for every ticker in my watchlist.")
    tickers = [
        "AAPL",
        "MSFT",
        "NVDA",
        "AMZN",
        "GOOGL",
        "META",
        "ASML",
        "SAP",
        "NESN",
        "NOVO-B",
        "MC",
        "OR",
        "TTE",
        "SIE",
        "ALV",
        "AIR",
        "SAN",
        "BNP",
        "ENEL",
        "ISP",
        "IBE",
        "DTE",
        "BAS",
        "BAYN",
        "VOW3",
        "BMW",
        "MBG",
        "RMS",
        "KER",
        "ADS",
        "ABI",
        "INGA",
        "PHIA",
        "HEIA",
        "DSY",
        "SU",
    ]
    for b in range(6):
        group = tickers[b * 6 : (b + 1) * 6]
        idxs = r.batch(
            [
                {
                    "tool": "get_stock_price",
                    "args": {"symbol": t},
                    "result": {"symbol": t, "price": round(20 + (zlib.crc32(t.encode()) % 50000) / 100, 2)},
                }
                for t in group
            ]
        )
        if 30 in idxs:
            r.label_call(30)
    r.finish("truncated", terminated_by="budget", budget_type="max_tool_calls")
    return r


# ================================================================================================
# LEGITIMATE: polling, paging, tailing
# ================================================================================================

LONG_RUN_BUDGETS = {
    "max_tool_calls": 200,
    "max_rounds": 150,
    "max_tokens": 8_000_000,
    "max_cost_usd": 30.0,
    "max_wall_s": 7200,
}


@scenario
def ok_polling_ends_progress(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="polling_ends",
        note="Export job polled 10 times with rising progress, then SUCCEEDED; the agent sends the link.",
        backend="openai",
        model="gpt-4o",
        agent="report-bot",
        task_type="report_export",
    )
    r.user("Export Q4 2025 orders to CSV.")
    r.step(
        "start_export",
        {"dataset": "orders", "from": "2025-10-01", "to": "2025-12-31", "format": "csv"},
        {"job_id": "exp_41Ld9", "status": "QUEUED"},
    )
    progress = [0.05, 0.14, 0.27, 0.38, 0.51, 0.63, 0.74, 0.86, 0.95]
    _polls(
        r,
        "exp_41Ld9",
        10,
        lambda i: (
            job_status(
                "exp_41Ld9",
                "RUNNING",
                progress=progress[i - 1],
                rows_written=int(progress[i - 1] * 2_410_000),
            )
            if i <= 9
            else job_status(
                "exp_41Ld9",
                "SUCCEEDED",
                progress=1.0,
                rows_written=2_410_000,
                url="https://files.example.com/exp_41Ld9.csv.gz",
            )
        ),
        wait=(12, 18),
        text=lambda i: "Still running, checking again shortly." if i in (2, 5, 8) else None,
    )
    r.finish("succeeded", answer="Done: https://files.example.com/exp_41Ld9.csv.gz (2.41M rows).")
    return r


@scenario
def ok_polling_identical_then_done(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="polling_identical_short",
        note="Job status is the identical RUNNING 6 times (about 2 minutes), then SUCCEEDED.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="pipeline-operator",
        task_type="data_pipeline",
    )
    r.user("Refresh the customer segments table and let me know when it's ready.")
    r.step("start_export", {"pipeline": "segments_refresh"}, {"job_id": "seg-5521", "status": "SUBMITTED"})
    _polls(
        r,
        "seg-5521",
        7,
        lambda i: (
            job_status("seg-5521", "RUNNING")
            if i <= 6
            else job_status("seg-5521", "SUCCEEDED", finished_at="2026-03-10T10:14:03Z", rows=88213)
        ),
        wait=(17, 22),
        text=lambda i: "The job is still running; I'll check again in about 20 seconds." if i > 1 else None,
    )
    r.finish("succeeded", answer="The customer segments table has been refreshed (88,213 rows).")
    return r


@scenario
def ok_polling_inside_declared_budget(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="polling_identical_inside_budget",
        note="6 identical RUNNING polls, SUCCEEDED at poll 7: inside max_same_tool_retries=8 whether "
        "the engine counts re-polls (6) or calls (7).",
        backend="deepseek",
        model="deepseek-chat",
        agent="release-bot",
        task_type="deploy",
        budgets={"max_same_tool_retries": 8},
    )
    r.user("Deploy build 88190 to staging and confirm it's healthy.")
    r.step(
        "start_export",
        {"pipeline": "deploy", "build": 88190, "env": "staging"},
        {"job_id": "dep-3391", "status": "PENDING"},
    )
    _polls(
        r,
        "dep-3391",
        7,
        lambda i: (
            job_status("dep-3391", "RUNNING", phase="rollout")
            if i < 7
            else job_status("dep-3391", "SUCCEEDED", phase="done", healthy_pods=6)
        ),
        wait=(14, 18),
    )
    r.finish("succeeded", answer="Build 88190 is live on staging; 6/6 pods healthy.")
    return r


@scenario
def ok_polling_job_fails(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="polling_ends_failed",
        note="A job goes QUEUED -> RUNNING -> FAILED; the agent stops polling and reads the logs.",
        backend="local",
        model="qwen2.5-32b-instruct",
        agent="pipeline-operator",
        task_type="data_pipeline",
    )
    r.user("Run the monthly billing reconciliation.")
    r.step(
        "start_export",
        {"pipeline": "billing_recon", "month": "2026-02"},
        {"job_id": "rec-0211", "status": "QUEUED"},
    )
    states = [("QUEUED", None), ("RUNNING", 0.2), ("RUNNING", 0.55), ("RUNNING", 0.71), ("FAILED", 0.71)]
    _polls(
        r,
        "rec-0211",
        5,
        lambda i: job_status("rec-0211", states[i - 1][0], progress=states[i - 1][1]),
        wait=(20, 30),
    )
    r.step(
        "get_job_logs",
        {"job_id": "rec-0211", "tail": 50},
        {
            "lines": [
                "ERROR ledger mismatch on account 4410: expected 1290.00 got 1209.00",
                "FATAL reconciliation aborted",
            ]
        },
    )
    r.finish(
        "succeeded", answer="The reconciliation failed: ledger mismatch on account 4410 (1290.00 vs 1209.00)."
    )
    return r


@scenario
def ok_polling_queue_position(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="polling_ends",
        note="12 polls: queue position 9,7,4,2,1 then RUNNING with progress, then SUCCEEDED.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="ml-ops",
        task_type="training",
    )
    r.user("Fine-tune the ticket classifier on the March data.")
    r.step(
        "start_export",
        {"pipeline": "finetune", "dataset": "tickets-2026-03", "base": "clf-v7"},
        {"job_id": "ft-90031", "status": "QUEUED", "queue_position": 11},
    )
    seq = [("QUEUED", {"queue_position": q}) for q in (9, 7, 4, 2, 1)]
    seq += [
        ("RUNNING", {"epoch": e, "loss": loss})
        for e, loss in ((1, 0.91), (1, 0.74), (2, 0.52), (2, 0.47), (3, 0.41), (3, 0.39))
    ]
    seq += [("SUCCEEDED", {"model": "clf-v8", "eval_f1": 0.912})]
    _polls(r, "ft-90031", 12, lambda i: job_status("ft-90031", seq[i - 1][0], **seq[i - 1][1]), wait=(20, 30))
    r.finish("succeeded", answer="Fine-tuning finished: clf-v8, F1 0.912.")
    return r


@scenario
def ok_polling_with_wait_tool(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="polling_with_wait_tool",
        note="wait(30) and get_job_status alternate 6 times: wait's result never changes, the status does.",
        backend="anthropic",
        model="claude-3-5-haiku",
        agent="report-bot",
        task_type="report_export",
    )
    r.user("Generate the February board report PDF.")
    r.step(
        "start_export",
        {"report": "board", "month": "2026-02", "format": "pdf"},
        {"job_id": "rep-2202", "status": "QUEUED"},
    )
    states = ["QUEUED", "RENDERING_CHARTS", "RENDERING_TABLES", "RENDERING_TABLES", "ASSEMBLING", "SUCCEEDED"]
    for i, s in enumerate(states):
        r.step("wait", {"seconds": 30}, {"waited_s": 30}, latency=30.0)
        extra = (
            {"url": "https://files.example.com/board-2026-02.pdf"}
            if s == "SUCCEEDED"
            else {"pages_done": i * 6}
        )
        r.step("get_job_status", {"job_id": "rep-2202"}, job_status("rep-2202", s, **extra))
    r.finish("succeeded", answer="The board report is ready: https://files.example.com/board-2026-02.pdf")
    return r


@scenario
def ok_paging_page(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="paging_page",
        note="Ticket export pages 1..8 (page number advances, new tickets each page).",
        backend="openai",
        model="gpt-4o",
        agent="triage-bot",
        task_type="ticket_triage",
    )
    r.user("Give me a breakdown of all open support tickets by product area.")
    areas = ["billing", "login", "mobile", "api", "shipping", "returns"]
    for p in range(1, 9):
        tickets = [
            {"id": f"T-{70000 + (p - 1) * 20 + k}", "area": areas[(p * 7 + k) % 6]}
            for k in range(20 if p < 8 else 7)
        ]
        r.step(
            "list_tickets",
            {"status": "open", "page": p, "per_page": 20},
            {"page": p, "pages": 8, "total": 147, "tickets": tickets},
            text="Fetching the next page of tickets.",
        )
    r.finish(
        "succeeded",
        answer="147 open tickets: billing 26, login 25, mobile 24, api 24, shipping 24, returns 24.",
    )
    return r


@scenario
def ok_paging_offset(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="paging_offset",
        note="Log search pages by offset 0,50,...,350 with new hits each time.",
        backend="deepseek",
        model="deepseek-chat",
        agent="oncall-helper",
        task_type="incident_triage",
    )
    r.user("Which customers hit 'card_declined' errors yesterday?")
    for k in range(8):
        off = k * 50
        n = 50 if k < 7 else 12
        r.step(
            "search_logs",
            {"query": "card_declined", "date": "2026-03-09", "offset": off, "limit": 50},
            {
                "total": 362,
                "offset": off,
                "hits": [{"customer": f"C-{10000 + off + j}", "code": "card_declined"} for j in range(n)],
            },
        )
    r.finish("succeeded", answer="362 card_declined errors from 362 distinct customers; list attached.")
    return r


@scenario
def ok_paging_cursor(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="paging_cursor",
        note="Customer list walked with an opaque cursor token for 10 pages.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="crm-assistant",
        task_type="crm",
    )
    r.user("How many customers signed up through the spring campaign?")
    cursor = None
    for p in range(10):
        nxt = r.alnum(24) if p < 9 else None
        args: dict[str, Any] = {"filter": {"utm_campaign": "spring26"}, "limit": 100}
        if cursor:
            args["cursor"] = cursor
        r.step(
            "list_customers",
            args,
            {
                "customers": [{"id": f"C-{200000 + p * 100 + j}"} for j in range(0, 100, 25)],
                "count": 100 if p < 9 else 37,
                "next_cursor": nxt,
            },
        )
        cursor = nxt
    r.finish("succeeded", answer="937 customers signed up through the spring26 campaign.")
    return r


@scenario
def ok_tail_since(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="paging_since_tail",
        note="Event stream tailed with an advancing 'since' timestamp; new events each time until done.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="deploy-watcher",
        task_type="deploy",
    )
    r.user("Watch the rollout of payments-api v5.1 and tell me if anything breaks.")
    since = r.now()
    phases = [
        "canary 5%",
        "canary 25%",
        "canary 50%",
        "rollout 75%",
        "rollout 100%",
        "verify",
        "verify",
        "complete",
    ]
    for i, ph in enumerate(phases):
        r.step(
            "get_events",
            {"service": "payments-api", "since": since},
            {
                "events": [
                    {"at": r.later(0.5), "msg": f"payments-api v5.1 {ph}", "error_rate": 0.002 + i / 10000}
                ]
            },
            wait=(20, 35) if i else 0.0,
        )
        since = r.now()
    r.finish("succeeded", answer="payments-api v5.1 rolled out to 100% with error rate under 0.3%.")
    return r


@scenario
def ok_paging_restart_after_filter(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="paging_restart_after_filter",
        note="Pages 1-3 of open tickets, then the filter changes to pending and paging restarts at page 1.",
        backend="openai",
        model="gpt-4o",
        agent="triage-bot",
        task_type="ticket_triage",
    )
    r.user("List all open and all pending tickets for ACME.")
    for status, pages, base in (("open", 3, 1000), ("pending", 2, 5000)):
        for p in range(1, pages + 1):
            r.step(
                "list_tickets",
                {"customer": "ACME", "status": status, "page": p, "per_page": 25},
                {
                    "page": p,
                    "pages": pages,
                    "tickets": [{"id": f"T-{base + p * 25 + k}", "status": status} for k in range(0, 25, 5)],
                },
            )
    r.finish("succeeded", answer="ACME has 71 open and 38 pending tickets.")
    return r


@scenario
def ok_paging_read_file_start(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="paging_start_line",
        note="A large file read in 200-line chunks (start=1,201,401,...).",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("Explain what the migration in db/migrations/0042_split_ledger.sql does.")
    for k in range(6):
        start = 1 + k * 200
        r.step(
            "read_file",
            {"path": "db/migrations/0042_split_ledger.sql", "start": start, "lines": 200},
            {
                "start": start,
                "end": min(start + 199, 1130),
                "total_lines": 1130,
                "content": f"-- part {k + 1}\nALTER TABLE ledger_{k} ADD COLUMN ...",
            },
        )
    r.finish("succeeded", answer="It splits the ledger table into per-year partitions and backfills them.")
    return r


@scenario
def ok_paging_offset_step1(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="paging_offset_by_one",
        note="Dead-letter queue inspected one message at a time: offset 0..9, a different message each time.",
        backend="deepseek",
        model="deepseek-chat",
        agent="ops-bot",
        task_type="queue_triage",
    )
    r.user("Look at the 10 oldest messages in the orders dead-letter queue and tell me why they failed.")
    reasons = [
        "schema_mismatch",
        "timeout",
        "schema_mismatch",
        "duplicate_key",
        "timeout",
        "schema_mismatch",
        "missing_customer",
        "timeout",
        "schema_mismatch",
        "duplicate_key",
    ]
    for off in range(10):
        r.step(
            "get_queue_message",
            {"queue": "orders-dlq", "offset": off},
            {
                "offset": off,
                "message_id": f"m-{r.hex(8)}",
                "failure": reasons[off],
                "payload": {"order_id": f"A-{81000 + off * 13}"},
            },
        )
    r.finish("succeeded", answer="4 schema mismatches, 3 timeouts, 2 duplicate keys, 1 missing customer.")
    return r


@scenario
def ok_tail_log(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="tail_log_changing",
        note="The identical tail_log call repeated 9 times during a migration; new lines every time.",
        backend="local",
        model="qwen2.5-32b-instruct",
        agent="deploy-watcher",
        task_type="deploy",
    )
    r.user("Run the database migration on staging and watch the log until it finishes.")
    r.step(
        "start_export", {"pipeline": "migrate", "env": "staging"}, {"job_id": "mig-771", "status": "STARTED"}
    )
    for i in range(9):
        lines = [f"[{r.later(k)}] applying 00{40 + i}_step_{k}" for k in range(3)]
        if i == 8:
            lines.append("migration complete: 9 migrations applied")
        r.step(
            "tail_log",
            {"file": "/var/log/migrate/staging.log", "lines": 20},
            {"lines": lines},
            wait=(8, 15) if i else 0.0,
            text="Checking the migration log." if i in (0, 4) else None,
        )
    r.finish("succeeded", answer="Migration finished on staging: 9 migrations applied without errors.")
    return r


@scenario
def ok_scroll_feed(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="scroll_changing",
        note="Browser agent scrolls a review page 10 times with the same action; new reviews appear each time.",
        backend="openai",
        model="gpt-4o",
        agent="browser-agent",
        task_type="browsing",
    )
    r.user("Read the reviews for the Fairphone 5 on that shop and tell me the common complaints.")
    r.step(
        "http_get",
        {"url": "https://shop.example.com/p/fairphone-5/reviews"},
        {"status": 200, "visible_reviews": [{"id": "rv-1", "stars": 4, "text": "Great repairability"}]},
    )
    for k in range(10):
        r.step(
            "scroll_page",
            {"direction": "down", "pixels": 800},
            {
                "visible_reviews": [
                    {
                        "id": f"rv-{2 + k * 3 + j}",
                        "stars": (k + j) % 5 + 1,
                        "text": [
                            "battery drains fast",
                            "camera is average",
                            "heats up when gaming",
                            "love the modular design",
                        ][(k + j) % 4],
                    }
                    for j in range(3)
                ],
                "at_bottom": k == 9,
            },
            text="Scrolling for more reviews." if k == 0 else None,
        )
    r.finish("succeeded", answer="Common complaints: battery life, average camera, heating under load.")
    return r


# ================================================================================================
# LEGITIMATE: writes, retries
# ================================================================================================


@scenario
def ok_double_purchase_operation_key(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="double_purchase",
        note="The user asks for two separate orders of the same gift; two identical place_order calls with "
        "different operation_keys.",
        backend="openai",
        model="gpt-4o",
        agent="shop-assistant",
        task_type="purchase",
    )
    r.user(
        "Order the Moleskine Classic notebook twice, as two separate orders — one is a gift for my sister "
        "and she'll pick it up separately."
    )
    r.step(
        "search_products",
        {"query": "Moleskine Classic notebook large ruled"},
        {"products": [{"sku": "MOL-CL-L-R", "name": "Moleskine Classic Large Ruled", "price": 22.5}]},
    )
    args = {"sku": "MOL-CL-L-R", "qty": 1, "address_id": "ADDR-1", "payment_method": "card_on_file"}
    r.step(
        "place_order",
        args,
        {"order_id": "A-66001", "status": "placed"},
        operation_key="op-" + r.hex(16),
        step_id="order-1",
        external_request_id="ord_66001",
        text="Placing the first order.",
    )
    r.step(
        "place_order",
        args,
        {"order_id": "A-66002", "status": "placed"},
        operation_key="op-" + r.hex(16),
        step_id="order-2",
        external_request_id="ord_66002",
        text="Placing the second order.",
    )
    r.finish("succeeded", answer="Done: two separate orders, A-66001 and A-66002.")
    return r


@scenario
def ok_double_purchase_step_id(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="double_purchase",
        note="Two identical top-up writes without operation_key but different step_ids, as the user asked.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="wallet-assistant",
        task_type="purchase",
    )
    r.user(
        "Top up my transit card with 20 euros, and then do another 20 — I need two separate receipts for "
        "expenses."
    )
    r.step("get_customer", {"customer_id": "C-3012"}, {"customer_id": "C-3012", "transit_card": "TC-88120"})
    args = {"card": "TC-88120", "amount": 20.0, "currency": "EUR"}
    r.step("place_order", args, {"receipt": "RC-5510", "status": "completed"}, step_id="topup-1")
    r.step("place_order", args, {"receipt": "RC-5511", "status": "completed"}, step_id="topup-2")
    r.finish("succeeded", answer="Two top-ups of 20 EUR done; receipts RC-5510 and RC-5511.")
    return r


@scenario
def ok_three_identical_tickets(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="identical_writes_user_intended",
        note="Three identical create_ticket writes in a row (the user asked for three placeholders), each with "
        "its own operation_key.",
        backend="deepseek",
        model="deepseek-chat",
        agent="pm-assistant",
        task_type="project_admin",
    )
    r.user(
        "Create three placeholder tickets titled 'TBD - sprint 14 capacity' in the PLAT project, I'll fill "
        "them in later."
    )
    args = {"project": "PLAT", "title": "TBD - sprint 14 capacity", "type": "task", "labels": ["placeholder"]}
    for k in range(3):
        r.step(
            "create_ticket",
            args,
            {"key": f"PLAT-{1201 + k}", "status": "created"},
            operation_key=f"create-ticket-{r.uuid()}",
            step_id=f"create-{k + 1}",
        )
    r.finish("succeeded", answer="Created PLAT-1201, PLAT-1202 and PLAT-1203.")
    return r


@scenario
def ok_retry_transient_once(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="retry_transient_backoff",
        note="A 503 on the first try, one retry after a 2s backoff succeeds.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="ops-bot",
        task_type="inventory",
    )
    r.user("Stock level of SKU HDMI-2M-BLK in Hamburg?")
    url = {"url": "https://inventory.internal.example/v1/stock?sku=HDMI-2M-BLK&wh=HAM1"}
    r.step(
        "http_get",
        url,
        {"status": 503, "body": "Service Unavailable"},
        status="error",
        error_class="transient",
    )
    r.step(
        "http_get",
        url,
        {"status": 200, "sku": "HDMI-2M-BLK", "wh": "HAM1", "qty": 412},
        wait=2.0,
        text="The inventory service returned 503; retrying after a short backoff.",
    )
    r.finish("succeeded", answer="412 units in Hamburg.")
    return r


@scenario
def ok_retry_transient_twice(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="retry_transient_backoff",
        note="Two 503s with exponential backoff (1s, 4s), the third attempt succeeds.",
        backend="anthropic",
        model="claude-3-5-haiku",
        agent="ops-bot",
        task_type="inventory",
    )
    r.user("Is the shipping-rates service returning a rate for a 2kg parcel to Vienna?")
    args = {"url": "https://rates.internal.example/v2/quote", "params": {"weight_kg": 2, "to": "AT-1010"}}
    r.step("http_get", args, {"status": 503}, status="error", error_class="transient")
    r.step("http_get", args, {"status": 503}, status="error", error_class="transient", wait=1.0)
    r.step("http_get", args, {"status": 200, "rate_eur": 9.4, "service": "standard"}, wait=4.0)
    r.finish("succeeded", answer="Yes: 9.40 EUR standard.")
    return r


@scenario
def ok_retry_rate_limited_backoff(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="retry_rate_limited_backoff",
        note="Rate limited with retry_after=20s; the agent waits 20s and the retry succeeds.",
        backend="deepseek",
        model="deepseek-chat",
        agent="repo-analyst",
        task_type="research",
    )
    r.user("How many stars does octo-org/widgets have?")
    args = {"url": "https://api.github.example.com/repos/octo-org/widgets"}
    r.step("http_get", args, {"status": 429, "retry_after_s": 20}, status="error", error_class="rate_limited")
    r.step(
        "http_get",
        args,
        {"status": 200, "stargazers_count": 4821},
        wait=(20.5, 21.5),
        text="Rate limited; waiting 20 seconds before retrying.",
    )
    r.finish("succeeded", answer="octo-org/widgets has 4,821 stars.")
    return r


@scenario
def ok_write_503_retry_same_key(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="write_retry_after_definite_error",
        note="place_order fails with a definite 503 (not a timeout); retried after backoff with the same "
        "operation_key and succeeds: idempotent, no duplicate.",
        backend="openai",
        model="gpt-4o",
        agent="shop-assistant",
        task_type="purchase",
    )
    r.user("Buy the 65W USB-C charger for me.")
    args = {"sku": "CHG-65W-USB-C", "qty": 1, "address_id": "ADDR-2", "payment_method": "card_on_file"}
    key = "op-ord-" + r.hex(12)
    r.step(
        "place_order",
        args,
        {"status": 503, "error": "order service unavailable, nothing was created"},
        status="error",
        error_class="transient",
        operation_key=key,
    )
    r.step(
        "place_order",
        args,
        {"order_id": "A-67120", "status": "placed"},
        operation_key=key,
        wait=3.0,
        external_request_id="ord_67120",
        text="The order service was unavailable; retrying with the same key.",
    )
    r.finish("succeeded", answer="Ordered: A-67120.")
    return r


@scenario
def ok_write_timeout_reconciled(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="write_timeout_reconciled",
        note="refund_payment times out; the agent checks the refund status by operation key instead of "
        "retrying, finds it completed.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="billing-assistant",
        task_type="refund",
    )
    r.user("Refund order A-52210, the customer returned it.")
    key = "refund:A-52210"
    r.step(
        "refund_payment",
        {"order_id": "A-52210", "amount": 79.0, "reason": "returned"},
        None,
        status="timeout",
        operation_key=key,
    )
    r.step(
        "get_refund_status",
        {"operation_key": key},
        {"status": "succeeded", "refund_id": "RF-2290"},
        text="The refund request timed out; checking whether it went through before doing anything else.",
    )
    r.finish("succeeded", answer="The refund RF-2290 for A-52210 went through.")
    return r


@scenario
def ok_send_emails_distinct(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="distinct_writes",
        note="The same reminder template sent to four different recipients.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="collections-bot",
        task_type="dunning",
    )
    r.user("Send the overdue reminder to every customer with an invoice more than 30 days late.")
    rows = [
        ["INV-2026-0101", "ap@alpha.example"],
        ["INV-2026-0107", "billing@beta.example"],
        ["INV-2026-0113", "finance@gamma.example"],
        ["INV-2026-0119", "ap@delta.example"],
    ]
    r.step(
        "sql_query",
        {
            "sql": "SELECT id, contact FROM invoices WHERE due < now() - interval '30 days' AND "
            "status = 'open'"
        },
        {"rows": rows, "row_count": 4},
    )
    for inv, to in rows:
        r.step(
            "send_email",
            {"to": to, "template": "overdue_reminder", "vars": {"invoice_id": inv}},
            {"status": "queued", "message_id": f"<{r.hex(10)}@mail.example>"},
            operation_key=f"dunning:{inv}:1",
        )
    r.finish("succeeded", answer="Sent 4 reminders.")
    return r


# ================================================================================================
# LEGITIMATE: long explorations, parallel batches
# ================================================================================================

PACKAGES = {
    "src/ledger": ["accounts", "entries", "journal", "balances", "periods", "closing", "fx", "exports"],
    "src/billing": [
        "invoice",
        "tax",
        "credit_notes",
        "dunning",
        "pricing",
        "proration",
        "coupons",
        "statements",
    ],
    "src/payments": [
        "gateway",
        "webhooks",
        "refunds",
        "disputes",
        "payouts",
        "retries",
        "mandates",
        "tokens",
    ],
    "src/api": ["views", "serializers", "permissions", "pagination", "throttling", "errors", "routes"],
    "src/users": ["models", "auth", "sessions", "invites", "roles", "audit"],
    "src/common": ["money", "dates", "ids", "cache", "locks", "events", "settings"],
}
VERBS = [
    "load",
    "save",
    "compute",
    "validate",
    "render",
    "apply",
    "build",
    "parse",
    "merge",
    "close",
    "post",
    "reverse",
    "sync",
    "match",
    "split",
]


def py_source(rng: random.Random, path: str) -> str:
    mod = path.rsplit("/", 1)[1].removesuffix(".py")
    funcs = rng.sample(VERBS, 3)
    body = [
        f'"""{mod.replace("_", " ").capitalize()} for {path.split("/")[1]}."""',
        "",
        "from __future__ import annotations",
        "",
    ]
    for f in funcs:
        body += [
            "",
            f"def {f}_{mod}(obj, *, strict=False):",
            f"    # {rng.randint(2, 40)} lines elided",
            "    ...",
        ]
    return "\n".join(body) + "\n"


@scenario
def ok_explore_many_files(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="explore_many_files",
        note="Code-review agent lists 6 packages, reads 44 different files and greps 6 patterns (56 calls).",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="code-reviewer",
        task_type="code_review",
        budgets=LONG_RUN_BUDGETS,
    )
    r.user(
        "Do an architecture review of the finance monolith: how do ledger, billing and payments depend on "
        "each other?"
    )
    paths = []
    for pkg, mods in PACKAGES.items():
        r.step("list_dir", {"path": pkg}, {"entries": [f"{m}.py" for m in mods] + ["__init__.py"]})
        paths += [f"{pkg}/{m}.py" for m in mods]
    paths = paths[:44]
    for i, p in enumerate(paths):
        r.step(
            "read_file",
            {"path": p},
            {"path": p, "lines": r.rng.randint(40, 400), "content": py_source(r.rng, p)},
            text="Reading the next module." if i % 9 == 0 else None,
        )
        if i % 8 == 7:
            pat = [
                "from src.ledger",
                "from src.billing",
                "from src.payments",
                "import gateway",
                "post_entry",
                "Money(",
            ][i // 8]
            r.step(
                "grep",
                {"pattern": pat, "path": "src"},
                {"matches": [{"path": paths[(i * 3 + j) % len(paths)], "line": 3 + j} for j in range(4)]},
            )
    r.finish(
        "succeeded",
        answer="Ledger is the core; billing posts through ledger.journal; payments depends on "
        "billing only for refunds. Two cycles found: payments<->billing via credit_notes, users<->api.",
    )
    return r


@scenario
def ok_grep_many_patterns(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="explore_many_greps",
        note="Deprecation sweep: 24 different grep patterns, each with new matches, plus reads of hits.",
        backend="openai",
        model="gpt-4o",
        agent="code-fixer",
        task_type="coding",
        budgets=LONG_RUN_BUDGETS,
    )
    r.user(
        "Find every use of deprecated datetime APIs (utcnow, utcfromtimestamp, naive datetimes) and list them."
    )
    pats = [
        "datetime.utcnow",
        "utcfromtimestamp",
        "datetime.now()",
        "time.mktime",
        "pytz.localize",
        "tzinfo=None",
        "replace(tzinfo=",
        "dateutil.parser",
        "strptime(",
        "date.today()",
        "timezone.utc",
        "astimezone()",
        "fromtimestamp(",
        "isoformat()",
        "timedelta(days",
        "calendar.timegm",
        "time.time()",
        "USE_TZ",
        "make_aware",
        "make_naive",
        "localtime(",
        "utc_offset",
        "datetime.min",
        "datetime.max",
    ]
    files = [f"{pkg}/{m}.py" for pkg, mods in PACKAGES.items() for m in mods]
    for i, p in enumerate(pats):
        hits = [
            {"path": files[(i * 5 + j) % len(files)], "line": 10 + i + j * 7, "text": f"x = {p}"}
            for j in range(1 + i % 3)
        ]
        r.step("grep", {"pattern": p, "path": "src", "fixed_string": True}, {"matches": hits})
        if i % 6 == 5:
            r.step(
                "read_file",
                {"path": hits[0]["path"], "start": max(1, hits[0]["line"] - 10), "lines": 30},
                {"content": py_source(r.rng, hits[0]["path"])},
            )
    r.finish("succeeded", answer="Found 48 uses across 31 files; table attached.")
    return r


@scenario
def ok_parallel_weather(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="parallel_batch_distinct",
        note="One round with get_weather for 5 cities, then one with get_forecast for the same 5.",
        backend="openai",
        model="gpt-4o",
        agent="travel-planner",
        task_type="trip_planning",
    )
    r.user("Which of Porto, Seville, Valencia, Nice or Split is warmest this week?")
    cities = ["Porto", "Seville", "Valencia", "Nice", "Split"]
    r.batch(
        [
            {
                "tool": "get_weather",
                "args": {"city": c, "units": "metric"},
                "result": {
                    "city": c,
                    "temp_c": 14 + k * 1.5,
                    "conditions": ["cloudy", "sunny", "sunny", "windy", "sunny"][k],
                },
            }
            for k, c in enumerate(cities)
        ],
        text="Checking the current weather in all five cities.",
    )
    r.batch(
        [
            {
                "tool": "get_forecast",
                "args": {"city": c, "days": 7},
                "result": {"city": c, "max_c": [17, 24, 21, 18, 19][k], "rain_days": [4, 0, 1, 2, 1][k]},
            }
            for k, c in enumerate(cities)
        ]
    )
    r.finish("succeeded", answer="Seville: up to 24°C and no rain all week.")
    return r


@scenario
def ok_parallel_get_orders(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="parallel_same_tool_distinct_ids",
        note="get_order for 6 different ids in one round, then get_shipment for the 6 tracking numbers.",
        backend="deepseek",
        model="deepseek-chat",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Status of all my orders from February please. Customer C-1000.")
    ids = [f"A-{30100 + k * 17}" for k in range(6)]
    r.step("search_orders", {"customer_id": "C-1000", "month": "2026-02"}, {"order_ids": ids})
    r.batch(
        [
            {
                "tool": "get_order",
                "args": {"order_id": i},
                "result": order_record(
                    i,
                    "shipped",
                    [("SKU-" + str(k), 1, 10.0 + k)],
                    f"2026-02-1{k}T10:00:00Z",
                    tracking=f"TRK{k}{i[-3:]}",
                ),
            }
            for k, i in enumerate(ids)
        ]
    )
    r.batch(
        [
            {
                "tool": "get_shipment",
                "args": {"tracking_number": f"TRK{k}{i[-3:]}"},
                "result": {
                    "status": [
                        "delivered",
                        "in_transit",
                        "delivered",
                        "out_for_delivery",
                        "delivered",
                        "in_transit",
                    ][k]
                },
            }
            for k, i in enumerate(ids)
        ]
    )
    r.finish("succeeded", answer="3 delivered, 2 in transit, 1 out for delivery.")
    return r


@scenario
def ok_parallel_metrics_rounds(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="parallel_batch_repeated_changing",
        note="Incident watch: the same 3-metric batch every 30s for 5 rounds; every value changes each round.",
        backend="anthropic",
        model="claude-3-5-haiku",
        agent="oncall-helper",
        task_type="incident_watch",
    )
    r.user("Watch checkout for the next few minutes after the rollback and tell me when it's stable.")
    p99 = [2400, 1800, 950, 610, 540]
    err = [0.081, 0.044, 0.012, 0.004, 0.003]
    rps = [310, 355, 402, 441, 447]
    for k in range(5):
        r.batch(
            [
                {
                    "tool": "get_metric",
                    "args": {"service": "checkout", "metric": "latency_p99_ms", "window": "1m"},
                    "result": {"value": p99[k]},
                },
                {
                    "tool": "get_metric",
                    "args": {"service": "checkout", "metric": "error_rate", "window": "1m"},
                    "result": {"value": err[k]},
                },
                {
                    "tool": "get_metric",
                    "args": {"service": "checkout", "metric": "rps", "window": "1m"},
                    "result": {"value": rps[k]},
                },
            ],
            wait=(28, 32) if k else 0.0,
            text="Checking checkout metrics." if k < 4 else None,
        )
    r.finish("succeeded", answer="Checkout is stable: p99 540ms, error rate 0.3%, traffic back to normal.")
    return r


@scenario
def ok_research_parallel(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="parallel_batch_distinct",
        note="Research agent sends 5 rounds of 4 parallel searches with different queries, all new results.",
        backend="deepseek",
        model="deepseek-chat",
        agent="research-assistant",
        task_type="research",
    )
    r.user("Compare heat pump subsidies in Germany, France, Italy and Spain for 2026.")
    countries = ["Germany", "France", "Italy", "Spain"]
    aspects = [
        "heat pump subsidy 2026",
        "income limits heat pump grant",
        "max amount heat pump grant",
        "application process heat pump subsidy",
        "heat pump subsidy changes 2026",
    ]
    for a, aspect in enumerate(aspects):
        r.batch(
            [
                {
                    "tool": "web_search",
                    "args": {"query": f"{c} {aspect}"},
                    "result": {
                        "results": [
                            {
                                "title": f"{c}: {aspect} ({k})",
                                "url": f"https://gov-{c.lower()}.example/{a}/{k}",
                            }
                            for k in range(3)
                        ]
                    },
                }
                for c in countries
            ]
        )
    r.finish("succeeded", answer="Summary table of 2026 subsidies for DE/FR/IT/ES attached.")
    return r


@scenario
def ok_long_research(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="long_research",
        note="64-call research run: varied searches and page fetches, each bringing new facts.",
        backend="openai",
        model="gpt-4o",
        agent="research-assistant",
        task_type="research",
        budgets=LONG_RUN_BUDGETS,
    )
    r.user(
        "Write a briefing on the European battery supply chain: cell makers, raw materials, recycling, "
        "policy and prices."
    )
    topics = [
        "LFP cell plants Europe",
        "NMC cathode suppliers EU",
        "lithium refining Germany",
        "graphite anode Europe",
        "battery recycling black mass prices",
        "EU Battery Regulation passport",
        "Northvolt restructuring",
        "CATL Hungary plant",
        "ACC gigafactory status",
        "nickel sulphate Finland",
        "manganese supply Europe",
        "sodium-ion Europe pilot",
        "cell prices per kWh 2025",
        "EU critical raw materials act",
        "cobalt sourcing due diligence",
        "battery electrolyte plants EU",
        "separator film production Europe",
        "recycling capacity 2030 EU",
        "Portugal lithium mine",
        "Serbia Jadar project",
        "Spanish gigafactory plans",
        "Italy battery plant cancellation",
        "US IRA impact on EU batteries",
        "battery storage deployment Europe",
        "second-life batteries EU",
        "anode recycling processes",
        "hydrometallurgy vs pyrometallurgy",
        "battery import tariffs EU",
        "energy prices impact cell making",
        "EU battery alliance funding",
        "solid state battery pilots EU",
        "cell chemistry market share 2025",
    ]
    for k, t in enumerate(topics):
        url = f"https://briefs.example.org/{k:02d}-{t.lower().replace(' ', '-')[:40]}"
        r.step(
            "web_search",
            {"query": t, "num_results": 5},
            {
                "results": [
                    {"title": f"{t} — overview", "url": url},
                    {"title": f"{t} — news", "url": url + "/news"},
                ]
            },
            text="Next topic." if k % 10 == 9 else None,
        )
        r.step(
            "http_get",
            {"url": url},
            {"status": 200, "facts": [f"{t}: fact {k}.{j} ({2020 + (k + j) % 6})" for j in range(3)]},
        )
    r.finish("succeeded", answer="Briefing drafted: 7 sections, 96 sourced facts.")
    return r


@scenario
def ok_list_dirs_walk(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="explore_many_dirs",
        note="Walks 34 different directories of a monorepo to build an ownership map.",
        backend="local",
        model="qwen2.5-32b-instruct",
        agent="repo-mapper",
        task_type="coding",
    )
    r.user("Map which directories in the monorepo have a CODEOWNERS entry and which don't.")
    dirs = [
        f"services/{s}/{sub}"
        for s in ["auth", "billing", "search", "orders", "notify", "media"]
        for sub in ["api", "worker", "migrations", "tests", "docs"]
    ] + ["libs/common", "libs/proto", "tools", "infra"]
    for d in dirs:
        r.step(
            "list_dir",
            {"path": d},
            {
                "entries": [f"{d.rsplit('/', 1)[-1]}_{k}.py" for k in range(3)]
                + (["CODEOWNERS"] if len(d) % 3 == 0 else [])
            },
        )
    r.finish("succeeded", answer="12 of 34 directories have CODEOWNERS; list of the 22 without attached.")
    return r


@scenario
def ok_sql_exploration(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="varied_queries_new_results",
        note="Analyst runs 15 different queries building up a churn analysis; each returns new data.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="sql-analyst",
        task_type="analytics",
    )
    r.user("Why did churn go up in February?")
    queries = [
        (
            "SELECT count(*) FROM subscriptions WHERE canceled_at >= '2026-02-01' AND canceled_at < "
            "'2026-03-01'",
            [[1822]],
        ),
        (
            "SELECT count(*) FROM subscriptions WHERE canceled_at >= '2026-01-01' AND canceled_at < "
            "'2026-02-01'",
            [[1311]],
        ),
    ]
    queries += [
        (
            f"SELECT {dim}, count(*) FROM subscriptions s JOIN customers c ON c.id = s.customer_id WHERE "
            f"canceled_at >= '2026-02-01' GROUP BY {dim} ORDER BY 2 DESC LIMIT 5",
            [[f"{dim}_{k}", 400 - k * 50 - j] for k in range(3)],
        )
        for j, dim in enumerate(
            [
                "plan",
                "country",
                "acquisition_channel",
                "payment_method",
                "tenure_bucket",
                "support_tickets_bucket",
                "price_change_flag",
                "seats_bucket",
                "industry",
                "cancel_reason",
                "last_login_bucket",
                "nps_bucket",
                "discount_expired",
            ]
        )
    ]
    for sql, rows in queries:
        r.step("sql_query", {"sql": sql, "database": "warehouse"}, {"rows": rows, "row_count": len(rows)})
    r.finish(
        "succeeded",
        answer="February churn rose 39%, concentrated in customers whose launch discount expired in January.",
    )
    return r


# ================================================================================================
# LEGITIMATE: near-misses of the loop rules (adversarial) and everyday runs
# ================================================================================================


@scenario
def ok_single_retry_same_read(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="same_read_twice",
        note="The agent re-reads an order once (same result) to double-check before refunding: 2, not 3.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="billing-assistant",
        task_type="refund",
    )
    r.user("Order A-48817 arrived broken. Please refund it.")
    order = order_record(
        "A-48817",
        "delivered",
        [("VASE-GLASS-L", 1, 64.0)],
        "2026-02-28T16:20:00Z",
        payment_id="PAY-71822",
        refunded=False,
    )
    r.step("get_order", {"order_id": "A-48817"}, order)
    r.step(
        "get_refund_policy",
        {"region": "EU", "reason": "damaged"},
        {"policy": "Full refund for items damaged in transit reported within 14 days; no return needed."},
    )
    r.step(
        "get_order",
        {"order_id": "A-48817"},
        order,
        text="Before refunding, let me confirm the order hasn't already been refunded.",
    )
    r.step(
        "refund_payment",
        {"payment_id": "PAY-71822", "amount": 64.0, "reason": "damaged"},
        {"refund_id": "RF-3001", "status": "succeeded"},
        operation_key="refund:A-48817",
    )
    r.finish("succeeded", answer="Refunded 64.00 EUR (RF-3001). No need to send the vase back.")
    return r


@scenario
def ok_read_retry_after_timeout(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="read_retry_after_timeout",
        note="A read times out once and the identical retry succeeds.",
        backend="deepseek",
        model="deepseek-chat",
        agent="research-assistant",
        task_type="research",
    )
    r.user("What does the ECB's latest monetary policy statement say about rates?")
    args = {"url": "https://www.ecb.example/press/pr/date/2026/html/ecb.mp260305.en.html"}
    r.step("http_get", args, None, status="timeout")
    r.step(
        "http_get",
        args,
        {
            "status": 200,
            "text": "The Governing Council today decided to keep the three key "
            "ECB interest rates unchanged...",
        },
        wait=1.5,
    )
    r.finish("succeeded", answer="Rates were left unchanged at the March 5 meeting.")
    return r


@scenario
def ok_user_asks_twice(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="user_repeats_question",
        note="The user asks the same status question twice, ten minutes apart; two lookups, two different answers.",
        backend="openai",
        model="gpt-4o",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Has my order A-90112 shipped yet?")
    order = order_record(
        "A-90112", "packed", [("BOOK-9781", 2, 14.0)], "2026-03-09T08:00:00Z", expected_ship="2026-03-10"
    )
    r.step("get_order", {"order_id": "A-90112"}, order)
    r.model("Not yet — it's packed and scheduled to ship today.")
    r.user("Has my order A-90112 shipped yet?", think=(480, 660))
    r.step("get_order", {"order_id": "A-90112"}, order)
    r.finish(
        "succeeded",
        answer="Still packed as of now; the warehouse cut-off is 17:00, so it should leave "
        "this afternoon. I'll note that you asked twice.",
    )
    return r


@scenario
def ok_config_reread_after_edit(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="reread_after_change",
        note="config.yaml read three times, with edits in between; the content differs every time.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("Raise the worker concurrency to 8 and the queue timeout to 120s, then make sure the tests pass.")
    cfg = "worker:\n  concurrency: 4\nqueue:\n  timeout_s: 60\n"
    r.step("read_file", {"path": "config/config.yaml"}, {"content": cfg})
    r.step(
        "edit_file",
        {"path": "config/config.yaml", "old": "concurrency: 4", "new": "concurrency: 8"},
        {"ok": True},
        step_id="edit-1",
    )
    r.step("run_tests", {"path": "tests/test_config.py"}, {"passed": 7, "failed": 0})
    r.step(
        "read_file",
        {"path": "config/config.yaml"},
        {"content": cfg.replace("concurrency: 4", "concurrency: 8")},
        text="Let me re-read the config before the second change.",
    )
    r.step(
        "edit_file",
        {"path": "config/config.yaml", "old": "timeout_s: 60", "new": "timeout_s: 120"},
        {"ok": True},
        step_id="edit-2",
    )
    r.step(
        "read_file",
        {"path": "config/config.yaml"},
        {"content": cfg.replace("concurrency: 4", "concurrency: 8").replace("60", "120")},
    )
    r.step("run_tests", {"path": "tests/"}, {"passed": 214, "failed": 0})
    r.finish("succeeded", answer="Concurrency is 8, timeout 120s; all 214 tests pass.")
    return r


@scenario
def ok_clarify_once(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="clarify_once",
        note="One clarification question, the user answers, the agent proceeds.",
        backend="deepseek",
        model="deepseek-chat",
        agent="travel-planner",
        task_type="trip_planning",
    )
    r.user("Book me a hotel in Porto.")
    r.model("Sure — for which nights, and what's your budget per night?")
    r.user("April 17 to 20, under 150 euros.")
    r.step(
        "search_products",
        {
            "category": "hotel",
            "city": "Porto",
            "checkin": "2026-04-17",
            "checkout": "2026-04-20",
            "max_price": 150,
        },
        {"products": [{"id": "H-881", "name": "Casa da Ribeira", "price": 132}]},
    )
    r.step(
        "place_order",
        {"product_id": "H-881", "checkin": "2026-04-17", "checkout": "2026-04-20", "guests": 1},
        {"booking": "BK-55120", "status": "confirmed"},
        operation_key="booking:" + r.hex(10),
    )
    r.finish("succeeded", answer="Booked Casa da Ribeira, April 17-20, 132 EUR/night (BK-55120).")
    return r


@scenario
def ok_two_different_questions(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="clarify_two_different",
        note="Two different clarification questions in a row (account, then date range), both answered.",
        backend="openai",
        model="gpt-4o",
        agent="finance-bot",
        task_type="reporting",
    )
    r.user("Send me a statement.")
    r.model(
        "Which account should the statement be for — your business account ending 4410 or the savings "
        "account ending 9921?"
    )
    r.user("Business.")
    r.model("Which period should it cover — last month, this quarter, or a custom date range?")
    r.user("Last quarter.")
    r.step(
        "sql_query",
        {"sql": "SELECT * FROM statements WHERE account = '4410' AND period = '2025-Q4'"},
        {"rows": [["ST-2025Q4-4410", "https://files.example.com/st-4410-q4.pdf"]], "row_count": 1},
    )
    r.step(
        "send_email",
        {"to": "owner@client.example", "template": "statement", "vars": {"id": "ST-2025Q4-4410"}},
        {"status": "queued"},
        operation_key="statement:ST-2025Q4-4410",
    )
    r.finish("succeeded", answer="Your Q4 2025 statement for account 4410 is on its way by e-mail.")
    return r


@scenario
def ok_refine_converges(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="refine_loop_converges",
        note="run_tests <-> edit_file alternate 4 times; the identical run_tests call shows fewer failures "
        "each time until green.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("Make the test suite for the invoice module pass.")
    fails = [5, 3, 1, 0]
    edits = [
        ("round(total, 2)", "total.quantize(CENT)"),
        ("tax_rate / 100", "tax_rate / Decimal(100)"),
        ("lines[0]", "lines[-1]"),
    ]
    for k, f in enumerate(fails):
        r.step(
            "run_tests",
            {"path": "tests/billing/test_invoice.py"},
            {"passed": 30 - f, "failed": f, "failures": [f"test_case_{j}" for j in range(f)]},
        )
        if k < len(edits):
            old, new = edits[k]
            r.step(
                "edit_file",
                {"path": "src/billing/invoice.py", "old": old, "new": new},
                {"ok": True},
                step_id=f"edit-{k + 1}",
            )
    r.finish("succeeded", answer="All 30 invoice tests pass after three fixes.")
    return r


@scenario
def ok_oscillation_results_change(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="alternation_results_change",
        note="check_balance <-> list_pending_transfers alternate 5 times with identical args while transfers "
        "settle: both results change every cycle.",
        backend="deepseek",
        model="deepseek-chat",
        agent="treasury-bot",
        task_type="treasury",
    )
    r.user("Tell me when all of this morning's incoming transfers have settled on ACC-2001.")
    pending = [4, 3, 2, 1, 0]
    bal = [10200.0, 12700.0, 13950.0, 18950.0, 19420.0]
    for k in range(5):
        r.step(
            "check_balance",
            {"account_id": "ACC-2001"},
            {"balance": bal[k], "currency": "EUR"},
            wait=(40, 70) if k else 0.0,
        )
        r.step(
            "list_pending_transfers",
            {"account_id": "ACC-2001"},
            {"pending": [{"transfer_id": f"TR-{900 + j}"} for j in range(5 - pending[k], 5)][: pending[k]]},
        )
    r.finish("succeeded", answer="All 4 transfers settled; the balance is 19,420.00 EUR.")
    return r


@scenario
def ok_similar_queries_new_results(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="similar_calls_new_results",
        note="Product searches that differ by size/colour/type only, each returning different products.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="shopping-assistant",
        task_type="shopping",
    )
    r.user("Find red running shoes in size 42 or 43, road or trail, under 120 euros.")
    variants = [
        ("red running shoes", 42),
        ("red running shoes", 43),
        ("red trail running shoes", 42),
        ("red trail running shoes", 43),
        ("red road running shoes", 42),
        ("crimson running shoes", 42),
    ]
    for k, (q, size) in enumerate(variants):
        r.step(
            "search_products",
            {"query": q, "size": size, "max_price": 120},
            {
                "products": [
                    {"sku": f"SH-{k}{j}{size}", "name": f"{q.title()} model {k}{j}", "price": 80 + k * 5 + j}
                    for j in range(3)
                ]
            },
        )
    r.finish("succeeded", answer="18 matching shoes; top 3 by rating listed.")
    return r


@scenario
def ok_noise_fields_distinct_reads(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="noise_fields_distinct_args",
        note="Eight get_order calls carrying request_id noise, each for a different order.",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Which of my last 8 orders used express shipping?")
    for k in range(8):
        oid = f"A-{52000 + k * 31}"
        r.step(
            "get_order",
            {"order_id": oid, "request_id": r.req_id(), "timestamp": r.now()},
            order_record(
                oid,
                "delivered",
                [("SKU-" + str(k), 1, 9.0 + k)],
                f"2026-02-{10 + k}T09:00:00Z",
                shipping="express" if k in (2, 5) else "standard",
            ),
        )
    r.finish("succeeded", answer="Orders A-52062 and A-52155 used express shipping.")
    return r


@scenario
def ok_uuid_document_ids(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="uuid_ids_are_core_args",
        note="Seven get_document calls whose only argument is a different UUID document_id (not noise).",
        backend="deepseek",
        model="deepseek-chat",
        agent="contract-reviewer",
        task_type="legal_review",
    )
    r.user("Check which of the supplier contracts in folder 'Suppliers 2026' have an auto-renewal clause.")
    docs = [r.uuid() for _ in range(7)]
    r.step(
        "search_kb",
        {"query": "folder:'Suppliers 2026' type:contract"},
        {
            "documents": [
                {"document_id": d, "title": f"Supplier agreement {k + 1}"} for k, d in enumerate(docs)
            ]
        },
    )
    for k, d in enumerate(docs):
        r.step(
            "get_document",
            {"document_id": d},
            {
                "document_id": d,
                "title": f"Supplier agreement {k + 1}",
                "pages": 8 + k,
                "clauses": {"auto_renewal": k % 3 == 0, "term_months": 12 * (1 + k % 3)},
            },
        )
    r.finish("succeeded", answer="Agreements 1, 4 and 7 auto-renew.")
    return r


@scenario
def ok_multi_turn_support(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="multi_turn_read_after_write",
        note="Multi-turn support chat: read order, change address (write), read the order again (changed).",
        backend="anthropic",
        model="claude-sonnet-4-5",
        agent="support-bot",
        task_type="order_support",
    )
    r.user("Where's order A-73001?")
    order = order_record(
        "A-73001",
        "processing",
        [("LAMP-ARC", 1, 129.0)],
        "2026-03-08T11:00:00Z",
        address="Hauptstr. 1, Munich",
    )
    r.step("get_order", {"order_id": "A-73001"}, order)
    r.model("It's still processing and will ship to Hauptstr. 1, Munich.")
    r.user("Oh, I moved. Please ship it to Lindenweg 7, 80331 Munich instead.")
    r.step(
        "update_address",
        {"order_id": "A-73001", "address": "Lindenweg 7, 80331 Munich"},
        {"ok": True},
        operation_key="addr:A-73001:1",
    )
    r.step(
        "get_order",
        {"order_id": "A-73001"},
        {**order, "address": "Lindenweg 7, 80331 Munich"},
        text="Let me confirm the change took effect.",
    )
    r.model("Updated — it will ship to Lindenweg 7, 80331 Munich.")
    r.user("Great, and when will it arrive?")
    r.step(
        "get_order",
        {"order_id": "A-73001"},
        {**order, "address": "Lindenweg 7, 80331 Munich", "status": "shipped", "eta": "2026-03-12"},
    )
    r.finish("succeeded", answer="It just shipped; expected delivery is March 12.")
    return r


@scenario
def ok_short_lookup(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="short_lookup",
        note="A plain two-call lookup.",
        backend="openai",
        model="gpt-4.1-mini",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("What's the tracking number for A-10020?")
    r.step(
        "get_order",
        {"order_id": "A-10020"},
        order_record(
            "A-10020",
            "shipped",
            [("CABLE-1", 1, 5.0)],
            "2026-03-01T10:00:00Z",
            tracking="00340434161234567890",
        ),
    )
    r.step(
        "get_shipment",
        {"tracking_number": "00340434161234567890"},
        {"status": "in_transit", "eta": "2026-03-04"},
    )
    r.finish("succeeded", answer="Tracking 00340434161234567890, arriving March 4.")
    return r


@scenario
def ok_announce_with_action(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="same_announcement_with_action",
        note="'I will now check the next order.' seven times, each time with a get_order for a new id.",
        backend="deepseek",
        model="deepseek-chat",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Check which of my 7 pending orders are delayed.")
    for k in range(7):
        oid = f"A-{64000 + k * 3}"
        r.step(
            "get_order",
            {"order_id": oid},
            order_record(
                oid, "processing", [("SKU", 1, 10.0)], f"2026-03-0{k + 1}T10:00:00Z", delayed=k in (1, 4)
            ),
            text="I will now check the next order.",
        )
    r.finish("succeeded", answer="Two orders are delayed: A-64003 and A-64012.")
    return r


@scenario
def ok_empty_then_recovers(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="single_empty_response",
        note="One empty model response; the runtime nudges and the model continues normally.",
        backend="local",
        model="llama-3.1-70b-instruct",
        agent="doc-writer",
        task_type="writing",
    )
    r.user("Draft a changelog entry for the CSV export feature.")
    r.step(
        "read_file", {"path": "CHANGELOG.md", "start": 1, "lines": 40}, {"content": "## v2.3\n- Fix TZ bug\n"}
    )
    r.model("", out=0)
    r.user("Please continue.", think=(0.3, 0.8))
    r.step(
        "edit_file",
        {"path": "CHANGELOG.md", "old": "## v2.3", "new": "## v2.4\n- Add CSV export\n\n## v2.3"},
        {"ok": True},
        step_id="edit-changelog",
    )
    r.finish("succeeded", answer="Added the v2.4 entry for CSV export.")
    return r


@scenario
def ok_error_then_fixed_args(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="error_then_corrected_call",
        note="invalid_argument on the first call; the agent fixes the id format and succeeds.",
        backend="openai",
        model="gpt-4o",
        agent="support-bot",
        task_type="order_lookup",
    )
    r.user("Status of order 20931?")
    r.step(
        "get_order",
        {"order_id": "20931"},
        {"error": "invalid order_id '20931': must match ^A-\\d{5}$"},
        status="error",
        error_class="invalid_argument",
    )
    r.step(
        "get_order",
        {"order_id": "A-20931"},
        order_record("A-20931", "shipped", [("X", 1, 1.0)], "2026-02-21T14:03:11Z"),
        text="The id needs the A- prefix; retrying with A-20931.",
    )
    r.finish("succeeded", answer="A-20931 has shipped.")
    return r


@scenario
def ok_probe_missing_files(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="distinct_not_found_probes",
        note="Looking for the app's config: three different candidate paths are not_found, the fourth exists.",
        backend="anthropic",
        model="claude-3-5-haiku",
        agent="code-fixer",
        task_type="coding",
    )
    r.user("What port does the service listen on?")
    for p in ["config.yaml", "config/app.yaml", "settings.toml"]:
        r.step(
            "read_file",
            {"path": p},
            {"error": f"No such file or directory: '{p}'"},
            status="error",
            error_class="not_found",
        )
    r.step("read_file", {"path": "deploy/app.env"}, {"content": "PORT=8081\nWORKERS=4\n"})
    r.finish("succeeded", answer="It listens on port 8081 (deploy/app.env).")
    return r


@scenario
def ok_different_errors_then_success(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="changing_errors_converge",
        note="Three SQL attempts fail with different errors as the agent fixes each one; the 4th succeeds.",
        backend="local",
        model="qwen2.5-32b-instruct",
        agent="sql-analyst",
        task_type="analytics",
    )
    r.user("Average order value per country last month.")
    attempts = [
        (
            "SELECT country, avg(total) FROM order GROUP BY country",
            'syntax error at or near "order"',
            "parse_error",
        ),
        (
            "SELECT country, avg(total) FROM orders GROUP BY country",
            'column "country" does not exist',
            "invalid_argument",
        ),
        (
            "SELECT c.country, avg(o.total) FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.country",
            "column o.customer does not exist",
            "invalid_argument",
        ),
    ]
    for sql, err, cls in attempts:
        r.step("sql_query", {"sql": sql}, {"error": err}, status="error", error_class=cls)
    r.step(
        "sql_query",
        {
            "sql": "SELECT c.country, avg(o.total) FROM orders o JOIN customers c ON c.id = "
            "o.customer_id WHERE o.created_at >= '2026-02-01' GROUP BY c.country"
        },
        {"rows": [["DE", 71.2], ["FR", 64.9], ["IT", 58.3]], "row_count": 3},
    )
    r.finish("succeeded", answer="DE 71.20, FR 64.90, IT 58.30 EUR.")
    return r


@scenario
def ok_weather_then_book(name: str) -> Run:
    r = Run(
        name,
        expect="ok",
        pattern="mixed_everyday",
        note="Weather check, calendar check, room booking: an ordinary short run with a write.",
        backend="openai",
        model="gpt-4o",
        agent="scheduler",
        task_type="scheduling",
    )
    r.user("If it's sunny on Friday, book the rooftop for our team lunch at 12:30.")
    r.step("get_forecast", {"city": "Amsterdam", "date": "2026-03-13"}, {"conditions": "sunny", "max_c": 15})
    r.step(
        "check_availability",
        {"resource": "rooftop", "date": "2026-03-13", "start": "12:30", "duration_min": 90},
        {"free": True},
    )
    r.step(
        "place_order",
        {
            "resource": "rooftop",
            "date": "2026-03-13",
            "start": "12:30",
            "duration_min": 90,
            "purpose": "team lunch",
        },
        {"booking": "RB-1301", "status": "confirmed"},
        operation_key="book-rooftop-2026-03-13",
    )
    r.finish("succeeded", answer="Friday looks sunny (15°C); the rooftop is booked 12:30-14:00.")
    return r


# ================================================================================================
# Writing the corpus
# ================================================================================================

README_HEAD = """\
# Loop-detection corpus

One agent run per `<name>.jsonl` file (JSON Lines, trace events v1 — `/work/shared/spec/trace-events.md`),
written by `make_corpus.py`; do not edit the files by hand. Regenerate from the repository root with

    .venv/bin/python tests/ingest/detection/corpus/make_corpus.py

(deterministic: the same script writes the same bytes). `tests/ingest/detection/test_corpus_files.py`
checks that every file parses, every event validates, every run is labelled and the files are what the
script writes.

## Labels (`run_started.labels`, all strings)

| label | meaning |
|---|---|
| `expect` | `loop`: an intervention (a correction hint or anything stronger: hand-off, stop) must happen by the label point. `ok`: legitimate; **no** intervention of any strength may happen anywhere in the run. |
| `loop_kind` | loops only: `exact_repeat`, `oscillation`, `interval_loop`, `perturbation`, `repeated_error`, `clarification`, `monologue`, `empty_responses`, `no_progress`, `poll_budget`, `duplicate_write`, `budget`. It says what the scenario is built around; a detection of any kind that is on time counts. |
| `intervene_by_call` | loops labelled by tool call: **N = 1-based index of a tool call, counting only this run's `tool_call` events in stream order** (the calls of a parallel batch count one by one, in the order they appear). The intervention is on time when **at most N `tool_call` events have been seen** when it fires: at call N itself, after call N's `tool_result`, or anywhere before the (N+1)-th `tool_call` event. A detection that fires after the result of call N counts as "at call N". |
| `intervene_by_round` | loops in model output only (clarification, monologue, empty responses) and round/token/cost budgets: **N = the `round` of a `model_round` event**. On time when at most N `model_round` events have been seen when the intervention fires (i.e. before model round N+1 arrives). |
| `pattern` | short scenario name (several runs may share one). |
| `note` | one sentence on what the run is. |

Every loop keeps looping (or at least makes one more call/round) after its label point, so a late
detector is caught; it then ends truncated, abandoned, failed, or succeeds after the user steps in.

### Where the label point is put, per kind

| kind | label point |
|---|---|
| exact_repeat | the 3rd consecutive identical read (same canonical signature, unchanged result). Identical parallel batches in consecutive rounds count by round: the last call of the 3rd identical batch. One run (`loop_repeat_result_noise`) has noise in the *result* too and gets +2 slack. |
| oscillation | the call that completes the 3rd full cycle (A-B: 6th call of the pattern; A-B-C: 9th). |
| interval_loop | the returning action's first return with only repeated results since its previous occurrence (and at least its 3rd occurrence), **+2 calls** of slack. |
| perturbation | the 3rd nearly-equal call without new information, **+2 calls** (= the 5th call of the perturbed sequence). |
| repeated_error | non-retryable classes (`invalid_argument`, `permission`, `not_found`, `empty_result`, `parse_error`): **the call that produced the 2nd identical failure** (the detector sees that result and corrects; under the counting rule above that is "at" the 2nd attempt). Retryable classes (`transient`, `rate_limited`, quota 2): the 4th attempt (quota + 2, the same rule with a quota of 2 instead of 0). |
| clarification, monologue | the round of the 2nd asking/announcement when it is word for word (modulo whitespace/case), the 3rd when it is paraphrased. |
| empty_responses | the 3rd empty model response in a row (no text, `""` or whitespace only; no tool call). |
| no_progress | K = 10 assumed for non-polling task types: the 10th consecutive call without progress **+2** (= the 12th call of the stall). |
| poll_budget | with `budgets.max_same_tool_retries = R` declared: poll R+1 (R re-polls consumed). Without a declared budget: the 20th identical poll. Legitimate polling in this corpus stays at ≤ 6 identical polls in a row, ≤ 12 polls in all and ≤ ~5 minutes; `ok_polling_inside_declared_budget` ends one poll inside its declared budget (7 polls = 6 re-polls, limit 8). |
| duplicate_write | the retried write itself: the 2nd call with the same idempotency key (`operation_key`, else `step_id`) after the first timed out. |
| budget | the call (`max_tool_calls`, `max_wall_s`: first call at or after the wall limit) or round (`max_rounds`, `max_tokens` = cumulative input+output tokens, `max_cost_usd` = cumulative `cost_usd`) at which consumption reaches the declared limit. |

Legitimate runs that are long (> 40 calls) declare generous budgets in `run_started.budgets` (200 calls,
150 rounds, 8M tokens, 30 USD, 2 h), as a task type for long work would; all other runs rely on defaults.

## Deliberately hard cases

Loops a naive detector misses:
`loop_repeat_get_order_request_id`, `loop_repeat_http_trace_uuid`, `loop_oscillate_web_noise`,
`loop_error_not_found_noise` (request_id / timestamp / nonce / UUID `trace_id` change every call);
`loop_repeat_search_key_order_whitespace`, `loop_repeat_sql_whitespace` (key order, whitespace,
100 vs 100.0 vs 100.00000001); `loop_repeat_parallel_batches` (identical only by round, never two identical
calls in a row); `loop_perturb_offset_jitter` (the offset moves, but only to hits already seen — subsets,
not identical results); `loop_repeat_result_noise` and `loop_poll_result_noise` (the *result* carries a
fresh `as_of`/`checked_at`/`request_id`; the meaningful fields never change); `loop_dup_write_email_same_key`
(new `step_id`, same `operation_key`); `loop_budget_tool_calls_parallel` (the limit falls mid-batch).

Legitimate runs a naive detector stops:
`ok_tail_log`, `ok_scroll_feed`, `ok_parallel_metrics_rounds` (identical calls, results change);
`ok_three_identical_tickets`, `ok_double_purchase_*` (identical writes, different keys);
`ok_polling_identical_then_done`, `ok_polling_inside_declared_budget` (identical RUNNING, ends in budget);
`ok_polling_with_wait_tool` (an identical `wait` call every other step); `ok_refine_converges`,
`ok_oscillation_results_change` (A-B-A-B whose results keep changing); `ok_paging_restart_after_filter`;
`ok_paging_offset_step1` (offset +1 each step, new item each time); `ok_uuid_document_ids` (a UUID under an
id-like key that is the real argument); `ok_noise_fields_distinct_reads`; `ok_single_retry_same_read`,
`ok_user_asks_twice` (the same read twice, not three times); `ok_retry_transient_twice` (two identical
transient failures within the quota); `ok_write_503_retry_same_key` (a write retried after a definite
error, not a timeout); `ok_announce_with_action`, `ok_polling_identical_then_done` (the same sentence every
round, but with a tool call each time); `ok_empty_then_recovers` (one empty response);
`ok_probe_missing_files`, `ok_different_errors_then_success` (errors that are not identical).

## Runs
"""


def build() -> list[tuple[str, list[dict[str, Any]], Run]]:
    built = []
    names = set()
    for fn in SCENARIOS:
        name = fn.__name__
        assert name not in names, name
        names.add(name)
        run = fn(name)
        built.append((name, run.finalize(), run))
    return built


def readme(built: list[tuple[str, list[dict[str, Any]], Run]]) -> str:
    loops = [b for b in built if b[2].expect == "loop"]
    oks = [b for b in built if b[2].expect == "ok"]
    out = [README_HEAD, f"{len(built)} runs: {len(loops)} loops, {len(oks)} legitimate.\n"]
    counts: dict[str, int] = {}
    for _, _, run in loops:
        counts[run.loop_kind or ""] = counts.get(run.loop_kind or "", 0) + 1
    out.append("Loops per kind: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in LOOP_KINDS) + ".\n")
    out.append("| file | expect | kind | label point | calls | rounds | backend | pattern | note |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for name, _events, run in loops + oks:
        point = (
            (f"call {run.by_call}" if run.by_call else f"round {run.by_round}")
            if run.expect == "loop"
            else ""
        )
        out.append(
            f"| `{name}.jsonl` | {run.expect} | {run.loop_kind or ''} | {point} | {run.calls} | {run.rounds} "
            f"| {run.backend} | `{run.pattern}` | {run.note} |"
        )
    return "\n".join(out) + "\n"


def write(out_dir: Path) -> list[str]:
    built = build()
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {f"{name}.jsonl" for name, _, _ in built}
    for stale in out_dir.glob("*.jsonl"):
        if stale.name not in wanted:
            stale.unlink()
    for name, events, _ in built:
        text = "".join(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n" for e in events)
        (out_dir / f"{name}.jsonl").write_text(text, encoding="utf-8")
    (out_dir / "README.md").write_text(readme(built), encoding="utf-8")
    return sorted(wanted)


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else HERE
    files = write(out_dir)
    print(f"wrote {len(files)} runs to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
