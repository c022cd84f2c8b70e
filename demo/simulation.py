"""Demo traffic: generators of realistic agent runs as trace events v1.

Pure Python — no Django, no clock, no I/O — so the scenarios are tested as bare
functions and `manage.py simulate` (or a bench script) only has to send them.
Every scenario is a function `(rng, start, *, run_prefix) -> list[event dict]`:
one run, in the order a runtime would send it, every event with an `event_id`
unique to the run (so a resent batch is counted once by the server).

The mix (SCENARIOS, scenario_pick, run_generate) is mostly ordinary successful
runs with a long tail of round counts, then the loops DESIGN.md names, the
legitimate repetition a detector must not stop, budget truncations and writes
that time out. Each run carries its ground truth in two labels, `sim_scenario`
and `sim_expect` (`ok`, `loop`, `budget`, `unknown_write`), so detection rate and
false-kill rate can be measured on simulated traffic.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import random
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

Event = dict[str, Any]

# --- task types, backends, agents ------------------------------------------------------------

# How often each task type is asked for; the round counts below give the long tail.
TASK_TYPES: dict[str, int] = {"faq": 30, "order_lookup": 25, "refund": 15, "purchase": 12, "research": 18}

# (min, max) model rounds of an ordinary run of each task type.
ROUNDS: dict[str, tuple[int, int]] = {
    "faq": (1, 3),
    "order_lookup": (2, 6),
    "refund": (4, 12),
    "purchase": (2, 6),
    "research": (8, 60),
}

# Budgets a runtime declares per task type (the server's config has its own defaults).
TASK_BUDGETS: dict[str, dict[str, float]] = {
    "faq": {"max_rounds": 6, "max_tool_calls": 10, "max_tokens": 60_000, "max_cost_usd": 0.25},
    "order_lookup": {"max_rounds": 12, "max_tool_calls": 25, "max_tokens": 150_000, "max_cost_usd": 0.5},
    "refund": {"max_rounds": 20, "max_tool_calls": 40, "max_tokens": 400_000, "max_cost_usd": 1.0},
    "purchase": {"max_rounds": 12, "max_tool_calls": 25, "max_tokens": 150_000, "max_cost_usd": 0.5},
    "research": {"max_rounds": 80, "max_tool_calls": 200, "max_tokens": 6_000_000, "max_cost_usd": 8.0},
}

# List prices in USD per million tokens (input, output); the local model costs nothing.
PRICES: dict[tuple[str, str], tuple[float, float]] = {
    ("openai", "gpt-4o"): (2.50, 10.00),
    ("openai", "gpt-4o-mini"): (0.15, 0.60),
    ("anthropic", "claude-sonnet-4"): (3.00, 15.00),
    ("deepseek", "deepseek-chat"): (0.27, 1.10),
    ("local", "llama-3.1-8b"): (0.0, 0.0),
}
MARKUP: dict[str, float] = {"deepseek": 1.3}  # reached through an aggregator, which adds its margin

CallIdStyle = Literal["openai", "anthropic", "deepseek", "reused"]


@dataclass(frozen=True)
class Agent:
    """One deployed agent: its backend and model, and the habits of that backend."""

    name: str
    backend: str
    model: str
    task_types: tuple[str, ...]
    call_ids: CallIdStyle  # "reused": call_0, call_1… again every round, as small local servers do
    parallel: bool  # emits parallel batches of reads in one round
    tokens_per_s: float
    context_limit: int  # past it the runtime summarises the conversation
    cost_share: float  # share of its runs whose runtime reports cost_usd itself
    labels: tuple[tuple[str, str], ...] = ()

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        price_in, price_out = PRICES[(self.backend, self.model)]
        return (input_tokens * price_in + output_tokens * price_out) * MARKUP.get(self.backend, 1.0) / 1e6


AGGREGATOR = (("gateway", "openrouter"),)
AGENTS: tuple[Agent, ...] = (
    Agent(
        "support-bot",
        "openai",
        "gpt-4o-mini",
        ("faq", "order_lookup", "purchase"),
        "openai",
        True,
        90,
        120_000,
        0.1,
    ),
    Agent(
        "order-desk",
        "openai",
        "gpt-4o",
        ("order_lookup", "refund", "purchase"),
        "openai",
        True,
        60,
        120_000,
        0.1,
    ),
    Agent("ops-copilot", "openai", "gpt-4o", ("research", "refund"), "openai", True, 60, 120_000, 0.1),
    Agent(
        "refund-desk",
        "anthropic",
        "claude-sonnet-4",
        ("refund", "order_lookup"),
        "anthropic",
        True,
        55,
        180_000,
        0.15,
    ),
    Agent("analyst", "anthropic", "claude-sonnet-4", ("research",), "anthropic", True, 55, 180_000, 0.15),
    # Aggregators return the price with each response, so these runtimes mostly report cost_usd.
    Agent(
        "scout",
        "deepseek",
        "deepseek-chat",
        ("research", "faq"),
        "deepseek",
        False,
        35,
        60_000,
        0.7,
        AGGREGATOR,
    ),
    Agent(
        "shop-assistant",
        "deepseek",
        "deepseek-chat",
        ("purchase", "order_lookup"),
        "deepseek",
        False,
        35,
        60_000,
        0.7,
        AGGREGATOR,
    ),
    Agent(
        "helpdesk-lite", "local", "llama-3.1-8b", ("faq", "order_lookup"), "reused", False, 120, 32_000, 0.3
    ),
)

DEPLOYMENTS = ("prod-eu", "prod-us", "staging")
PROMPT_VERSIONS = ("v7", "v8", "v8.1", "v9-beta")

# --- content pools -------------------------------------------------------------------------

FIRST_NAMES = (
    "Ana",
    "Ben",
    "Chloe",
    "Dmitri",
    "Emma",
    "Farah",
    "Gustav",
    "Hana",
    "Ivan",
    "Jules",
    "Kofi",
    "Lena",
)
LAST_NAMES = (
    "Silva",
    "Okafor",
    "Martin",
    "Novak",
    "Schmidt",
    "Haddad",
    "Larsen",
    "Tanaka",
    "Rossi",
    "Dubois",
)
PRODUCTS = (
    ("SKU-TR2-42", "Trail Runner 2 shoes, size 42", 129.0),
    ("SKU-HP-X9", "X9 noise-cancelling headphones", 249.0),
    ("SKU-MUG-BL", "blue ceramic mug", 14.5),
    ("SKU-KB-75", "75% mechanical keyboard", 159.0),
    ("SKU-BAG-30", "30 L hiking backpack", 89.0),
    ("SKU-LAMP-D", "desk lamp with dimmer", 45.0),
    ("SKU-JKT-M", "rain jacket, size M", 119.0),
)
CARRIERS = ("DHL", "UPS", "PostNord", "GLS", "DPD")
ORDER_STATUS_SYNONYMS = ("open", "pending", "in progress", "not delivered")

# (question, search query, article id, title, answer, query synonyms)
FAQS: tuple[tuple[str, str, str, str, str, tuple[str, ...]], ...] = (
    (
        "How long do I have to return shoes I bought online?",
        "return window shoes",
        "KB-101",
        "Returns and refunds",
        "You can return unworn shoes within 30 days of delivery; the return label is free.",
        ("return period shoes", "shoe return deadline", "how long to send back shoes"),
    ),
    (
        "Do you ship to Norway?",
        "shipping to Norway",
        "KB-214",
        "Shipping destinations and customs",
        "Yes, we ship to Norway; customs duties are paid on delivery.",
        ("delivery to Norway", "ship Norway customs", "international shipping Norway"),
    ),
    (
        "How do I change my delivery address?",
        "change delivery address",
        "KB-118",
        "Changing an order after checkout",
        "You can change the address until the order is packed, under Orders → Edit.",
        ("update shipping address", "modify delivery address", "edit address after order"),
    ),
    (
        "Can I pay with Klarna?",
        "payment methods klarna",
        "KB-305",
        "Payment methods",
        "Yes: Klarna is offered at checkout for orders from 35 EUR.",
        ("klarna payment", "pay later klarna", "buy now pay later options"),
    ),
    (
        "My discount code doesn't work, why?",
        "discount code not applied",
        "KB-322",
        "Discount codes",
        "Codes do not combine with sale items and expire at midnight CET.",
        ("promo code not working", "voucher code rejected", "coupon not applied"),
    ),
    (
        "What's the warranty on headphones?",
        "headphones warranty",
        "KB-410",
        "Warranty terms",
        "Headphones carry a two-year warranty covering manufacturing defects.",
        ("headphone guarantee", "warranty period headphones", "headphones defect coverage"),
    ),
)

# (topic, synonyms of its base query)
RESEARCH_TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "EU battery regulation recycling targets",
        ("EU battery law recycling quotas", "European battery regulation recovery goals"),
    ),
    (
        "heat pump adoption in the Nordics",
        ("heat pump uptake Nordic countries", "Scandinavia heat pump market"),
    ),
    ("LLM inference price trends", ("large language model serving cost trend", "LLM API pricing over time")),
    (
        "Asia-Europe container freight rates",
        ("container shipping rates Asia Europe", "Shanghai Rotterdam freight"),
    ),
    ("lithium supply outlook", ("lithium production forecast", "lithium mining supply projections")),
    (
        "urban bike lane safety evidence",
        ("protected cycle lanes injury studies", "bike infrastructure safety"),
    ),
)
FACETS = (
    "overview",
    "statistics 2024",
    "policy changes",
    "market size",
    "key players",
    "criticism",
    "forecast 2030",
    "regional differences",
    "methodology",
    "recent news",
    "academic review",
    "cost breakdown",
    "case study",
    "timeline",
    "open questions",
)
DOMAINS = (
    "reuters.com",
    "ec.europa.eu",
    "arxiv.org",
    "iea.org",
    "ft.com",
    "nature.com",
    "statista.com",
    "en.wikipedia.org",
    "oecd.org",
    "bloomberg.com",
)
SENTENCES = (
    "The figures were revised upward in the latest release.",
    "Analysts disagree on how quickly the trend will continue.",
    "Regional differences remain large, with the north leading.",
    "The report cites three main drivers: price, policy and supply.",
    "Data before 2020 are sparse and not directly comparable.",
    "Several sources point to a slowdown in the second half of the year.",
    "The methodology changed in 2023, which breaks the series.",
    "Industry groups contest the estimate as too conservative.",
    "Independent audits confirm the headline number within 5%.",
    "The regulation phases in over four years from its adoption.",
)
NARRATION = (
    "Let me check that for you.",
    "I'll look this up.",
    "Looking at the details now.",
    "One moment while I check the records.",
    "Checking a second source.",
    "I'm gathering the remaining details.",
)

# --- the run being written -------------------------------------------------------------------


@dataclass
class Step:
    """One tool call the run will make, with the result it will get."""

    tool: str
    args: dict[str, Any]
    result: Any = None
    kind: str = "read"
    status: str = "ok"
    error_class: str | None = None
    step_id: str | None = None
    operation_key: str | None = None
    external_request_id: str | None = None
    latency_ms: float | None = None
    full_text: str | None = None  # a long text result: sent cut short, with result_sha256 of the whole
    call_id: str | None = None  # reuse a call id (a runtime retrying the model's call)


@dataclass
class Plan:
    """What an ordinary run of a task type does: its reads, its writes at the end, endless fillers."""

    prompt: str
    answer: str
    reads: list[Step]
    writes: list[Step]
    fillers: Iterator[Step]
    ctx: dict[str, Any] = field(default_factory=dict)


def _ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _tokens(value: Any) -> int:
    if value is None:
        return 0
    text = value if isinstance(value, str) else json.dumps(value)
    return 12 + len(text) // 4  # ~4 characters a token, plus the message wrapper


class _Run:
    """A run under construction: its clock, counters, and a context window that grows each round."""

    def __init__(
        self,
        rng: random.Random,
        start: datetime,
        *,
        scenario: str,
        expect: str,
        task_type: str,
        agent: Agent,
        run_prefix: str,
        reports_cost: bool | None = None,
    ) -> None:
        self.rng = rng
        self.agent = agent
        self.task_type = task_type
        self.now = (start if start.tzinfo else start.replace(tzinfo=UTC)).astimezone(UTC)
        self.start = self.now
        self.run_id = f"{run_prefix}-{scenario.replace('_', '-')}-{rng.getrandbits(48):012x}"
        self.events: list[Event] = []
        self.round = 0
        self.tool_calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd = 0.0
        self.context = rng.randint(900, 2600)  # system prompt and tool schemas
        self.reports_cost = rng.random() < agent.cost_share if reports_cost is None else reports_cost
        self._calls_in_round = 0
        self._narration = list(NARRATION)
        rng.shuffle(self._narration)
        labels = {
            "deployment": rng.choice(DEPLOYMENTS),
            "prompt_version": rng.choice(PROMPT_VERSIONS),
            "sim_scenario": scenario,
            "sim_expect": expect,
            **dict(agent.labels),
        }
        self.started = self.emit(
            "run_started",
            agent=agent.name,
            task_type=task_type,
            backend=agent.backend,
            model=agent.model,
            labels=labels,
        )
        self.plan = PLANS[task_type](self)

    # -- plumbing

    def emit(self, event_type: str, /, **fields: Any) -> Event:
        event = {
            "type": event_type,
            "run_id": self.run_id,
            "ts": _ts(self.now),
            "event_id": f"{self.run_id}.{len(self.events) + 1}",
            **fields,
        }
        self.events.append(event)
        return event

    def wait(self, seconds: float) -> None:
        self.now += timedelta(seconds=max(0.0, seconds))

    def token(self, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(self.rng.choices(alphabet, k=n))

    def _call_id(self) -> str:
        style = self.agent.call_ids
        if style == "reused":
            return f"call_{self._calls_in_round}"
        if style == "anthropic":
            return "toolu_01" + self.token(22)
        if style == "deepseek":
            return f"call_{self._calls_in_round}_{self.token(8, '0123456789abcdef')}"
        return "call_" + self.token(24)

    def _latency(self, step: Step) -> float:
        if step.latency_ms is not None:
            return step.latency_ms
        median = {"write": 600.0, "poll": 90.0}.get(step.kind, 220.0)
        return round(min(25_000.0, self.rng.lognormvariate(math.log(median), 0.6)), 1)

    # -- events

    def user(self, text: str) -> None:
        self.wait(self.rng.uniform(0.05, 0.3) if len(self.events) == 1 else self.rng.uniform(4, 40))
        self.emit("user_message", text=text)

    def think(self, *, text: str | None = None, output_tokens: int | None = None) -> int:
        """One model round; returns its number. The prompt is the whole context so far."""
        rng = self.rng
        self.round += 1
        self._calls_in_round = 0
        if self.context > self.agent.context_limit:
            self.context = self.context // 3  # the runtime summarised the conversation
        out = (
            output_tokens
            if output_tokens is not None
            else rng.randint(60, 420)
            if text
            else rng.randint(18, 140)
        )
        # Time to first token grows with the prompt; then the backend's decoding speed.
        self.wait(0.3 + self.context / rng.uniform(8_000, 20_000) + out / self.agent.tokens_per_s)
        fields: dict[str, Any] = {"round": self.round, "input_tokens": self.context, "output_tokens": out}
        cost = self.agent.cost(self.context, out)
        if self.reports_cost:
            cost = round(cost, 6)
            fields["cost_usd"] = cost
        if text is not None:
            fields["text"] = text
        self.emit("model_round", **fields)
        self.input_tokens += self.context
        self.output_tokens += out
        self.cost_usd += cost
        self.context += out
        return self.round

    def narration(self) -> str | None:
        # A few rounds say something to the user; never the same line twice in one run, so that
        # narration is not mistaken for a repeated clarification question.
        if self._narration and self.rng.random() < 0.2:
            return self._narration.pop()
        return None

    def calls(self, steps: Sequence[Step], *, text: str | None = None, think: bool = True) -> list[str]:
        """A model round emitting `steps` as one batch, then their results in order of completion."""
        if think:
            self.think(text=text if text is not None else self.narration())
        call_ids: list[str] = []
        for step in steps:
            call_id = step.call_id or self._call_id()
            self._calls_in_round += 1
            self.tool_calls += 1
            self.wait(self.rng.uniform(0.002, 0.03))
            fields: dict[str, Any] = {
                "round": self.round,
                "call_id": call_id,
                "tool": step.tool,
                "kind": step.kind,
                "args": copy.deepcopy(step.args),
            }
            if step.step_id:
                fields["step_id"] = step.step_id
            if step.operation_key:
                fields["operation_key"] = step.operation_key
            self.emit("tool_call", **fields)
            call_ids.append(call_id)
        sent = self.now
        timed = sorted(
            ((self._latency(step), i) for i, step in enumerate(steps)), key=lambda pair: (pair[0], pair[1])
        )
        for latency, i in timed:
            self.now = max(self.now, sent + timedelta(milliseconds=latency))
            self._result(call_ids[i], steps[i], latency)
        return call_ids

    def step(self, step: Step, *, text: str | None = None) -> str:
        return self.calls([step], text=text)[0]

    def _result(self, call_id: str, step: Step, latency: float) -> None:
        fields: dict[str, Any] = {"call_id": call_id, "status": step.status}
        if step.full_text is not None:
            cut = step.full_text[:1500]
            fields["result"] = cut
            if len(cut) < len(step.full_text):
                fields["result_truncated"] = True
                fields["result_sha256"] = hashlib.sha256(step.full_text.encode()).hexdigest()
        elif step.result is not None:
            fields["result"] = copy.deepcopy(step.result)
        if step.error_class:
            fields["error_class"] = step.error_class
        fields["latency_ms"] = latency
        if step.external_request_id:
            fields["external_request_id"] = step.external_request_id
        self.emit("tool_result", **fields)
        self.context += _tokens(fields.get("result"))

    def answer(self, text: str) -> None:
        self.think(text=text)

    def finish(
        self,
        status: str,
        *,
        terminated_by: str | None = None,
        budget_type: str | None = None,
        reason: str | None = None,
    ) -> list[Event]:
        self.wait(self.rng.uniform(0.02, 0.4))
        fields: dict[str, Any] = {"status": status}
        if terminated_by:
            fields["terminated_by"] = terminated_by
        if budget_type:
            fields["budget_type"] = budget_type
        if reason:
            fields["reason"] = reason
        self.emit("run_finished", **fields)
        return self.events

    # -- budgets

    def usage(self) -> dict[str, float]:
        return {
            "max_rounds": self.round,
            "max_tool_calls": self.tool_calls,
            "max_tokens": self.input_tokens + self.output_tokens,
            "max_cost_usd": self.cost_usd,
        }

    def declare_budgets(self, *, hit: str | None = None, limit: float | None = None) -> None:
        """Put budgets in run_started: `hit` at `limit`, the others above what the run used.

        Written after the run is built (the dict is the first event's) so that a budget the
        run ran out of matches what it consumed.
        """
        used = self.usage()
        budgets: dict[str, float] = {}
        for key, default in TASK_BUDGETS[self.task_type].items():
            if default > used[key]:
                budgets[key] = default
            elif key == "max_cost_usd":
                budgets[key] = round(used[key] * 2 + 0.01, 2)
            else:
                budgets[key] = int(used[key]) * 2 + 1
        if hit is not None and limit is not None:
            budgets[hit] = limit
        self.started["budgets"] = budgets

    # -- plans

    def next_read(self) -> Step:
        if self.plan.reads:
            return self.plan.reads.pop(0)
        return next(self.plan.fillers)

    def work(self, tool_rounds: int) -> None:
        """Ordinary progress: the plan's reads, fillers, then its writes, one round each."""
        plan = self.plan
        core = len(plan.reads) + len(plan.writes)
        if tool_rounds <= core:
            steps = (plan.reads + plan.writes)[:tool_rounds]
        else:
            steps = plan.reads + [next(plan.fillers) for _ in range(tool_rounds - core)] + plan.writes
        plan.reads, plan.writes = [], []
        for step in steps:
            batch = [step]
            # Parallel-capable backends sometimes fetch two or three things in one round.
            if self.agent.parallel and step.kind == "read" and self.rng.random() < 0.25:
                batch += [next(plan.fillers) for _ in range(self.rng.randint(1, 2))]
            self.calls(batch)

    def warmup(self, tool_rounds: int) -> None:
        for _ in range(tool_rounds):
            self.step(self.next_read())


# --- plans per task type ---------------------------------------------------------------------


def _customer(rng: random.Random) -> dict[str, Any]:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    return {
        "customer_id": f"C-{rng.randint(10_000, 99_999)}",
        "name": f"{first} {last}",
        "email": f"{first.lower()}.{last.lower()}@example.com",
        "tier": rng.choice(("standard", "standard", "plus", "gold")),
    }


def _order(run: _Run, customer: dict[str, Any], *, days_ago: int | None = None) -> dict[str, Any]:
    rng = run.rng
    sku, name, price = rng.choice(PRODUCTS)
    placed = run.start - timedelta(days=days_ago if days_ago is not None else rng.randint(2, 20))
    return {
        "order_id": f"ORD-{rng.randint(100_000, 999_999)}",
        "customer_id": customer["customer_id"],
        "placed": placed.date().isoformat(),
        "items": [{"sku": sku, "name": name, "qty": 1, "price": price}],
        "total": price,
        "currency": "EUR",
        "status": rng.choice(("shipped", "shipped", "delivered", "processing")),
    }


def _kb_filler(run: _Run) -> Iterator[Step]:
    for i in itertools.count():
        article = f"KB-{500 + i}"
        yield Step(
            "get_article",
            {"article_id": article},
            {
                "id": article,
                "title": f"Related topic {i + 1}",
                "body": " ".join(run.rng.sample(SENTENCES, 2)),
            },
        )


def _plan_faq(run: _Run) -> Plan:
    question, query, article, title, answer, synonyms = run.rng.choice(FAQS)
    hits = [{"id": article, "title": title, "score": 0.91}] + [
        {
            "id": f"KB-{run.rng.randint(600, 999)}",
            "title": "Related article",
            "score": round(run.rng.uniform(0.3, 0.7), 2),
        }
        for _ in range(2)
    ]
    return Plan(
        prompt=question,
        answer=f"{answer} (from our help centre: {title}, {article})",
        reads=[
            Step("search_kb", {"query": query}, {"hits": hits}),
            Step("get_article", {"article_id": article}, {"id": article, "title": title, "body": answer}),
        ],
        writes=[],
        fillers=_kb_filler(run),
        ctx={"query": query, "synonyms": synonyms, "article": article, "hits": hits, "title": title},
    )


def _order_filler(run: _Run, customer: dict[str, Any]) -> Iterator[Step]:
    rng = run.rng
    for i in itertools.count():
        choice = i % 3
        if choice == 0:
            order = _order(run, customer, days_ago=30 + i * 7)
            yield Step("get_order", {"order_id": order["order_id"]}, order)
        elif choice == 1:
            sku, name, price = PRODUCTS[i % len(PRODUCTS)]
            yield Step(
                "get_product",
                {"sku": sku},
                {"sku": sku, "name": name, "price": price, "stock": rng.randint(0, 80)},
            )
        else:
            invoice = f"INV-{rng.randint(10_000, 99_999)}"
            yield Step("get_invoice", {"invoice_id": invoice}, {"invoice_id": invoice, "paid": True})


def _plan_order_lookup(run: _Run) -> Plan:
    rng = run.rng
    customer = _customer(rng)
    order = _order(run, customer)
    eta = (run.start + timedelta(days=rng.randint(1, 4))).date().isoformat()
    tracking = f"{rng.choice(CARRIERS)}-{rng.randint(10**9, 10**10 - 1)}"
    shipment = {
        "order_id": order["order_id"],
        "carrier": tracking.split("-")[0],
        "tracking": tracking,
        "eta": eta,
    }
    return Plan(
        prompt=f"Where is my order? I bought the {order['items'][0]['name']} recently, my email is {customer['email']}.",
        answer=f"Your order {order['order_id']} is on its way with {shipment['carrier']} "
        f"(tracking {tracking}); it should arrive by {eta}.",
        reads=[
            Step("get_customer", {"email": customer["email"]}, customer),
            Step(
                "search_orders",
                {"customer_id": customer["customer_id"], "status": "open"},
                {"orders": [{"order_id": order["order_id"], "placed": order["placed"]}]},
            ),
            Step("get_order", {"order_id": order["order_id"]}, order),
            Step("get_shipment", {"order_id": order["order_id"]}, shipment),
        ],
        writes=[],
        fillers=_order_filler(run, customer),
        ctx={"customer": customer, "order": order},
    )


def _plan_refund(run: _Run) -> Plan:
    rng = run.rng
    customer = _customer(rng)
    order = _order(run, customer)
    oid, amount = order["order_id"], order["total"]
    refund_id = f"rf_{run.token(14)}"
    return Plan(
        prompt=f"I want a refund for order {oid}, the {order['items'][0]['name']} arrived damaged.",
        answer=f"I've refunded {amount:.2f} EUR for {oid}; it will be back on your card in 3-5 business days.",
        reads=[
            Step("get_order", {"order_id": oid}, order),
            Step(
                "check_refund_eligibility",
                {"order_id": oid, "reason": "damaged"},
                {"eligible": True, "max_amount": amount, "policy": "KB-101"},
            ),
        ],
        writes=[
            Step(
                "create_refund",
                {"order_id": oid, "amount": amount, "currency": "EUR", "reason": "damaged"},
                {"refund_id": refund_id, "status": "pending"},
                kind="write",
                step_id="create-refund",
                operation_key=f"refund:{oid}:full",
                external_request_id=f"re_{run.token(18)}",
            ),
            Step(
                "send_email",
                {"to": customer["email"], "template": "refund_confirmation", "vars": {"order_id": oid}},
                {"message_id": f"<{run.token(16)}@mail.example.com>"},
                kind="write",
                step_id="notify-customer",
            ),
        ],
        fillers=_order_filler(run, customer),
        ctx={"customer": customer, "order": order, "refund_id": refund_id},
    )


def _plan_purchase(run: _Run) -> Plan:
    rng = run.rng
    customer = _customer(rng)
    sku, name, price = rng.choice(PRODUCTS)
    new_order = f"ORD-{rng.randint(100_000, 999_999)}"
    address = {
        "street": f"{rng.randint(1, 120)} Harbour Street",
        "city": rng.choice(("Oslo", "Lyon", "Porto", "Gdansk")),
    }
    order_args = {"customer_id": customer["customer_id"], "sku": sku, "quantity": 1, "ship_to": address}
    return Plan(
        prompt=f"Please buy the {name} for me and ship it to my usual address. I'm {customer['email']}.",
        answer=f"Done: order {new_order} for the {name} ({price:.2f} EUR) is confirmed and ships to {address['city']}.",
        reads=[
            Step("get_customer", {"email": customer["email"]}, {**customer, "default_address": address}),
            Step(
                "get_product",
                {"sku": sku},
                {"sku": sku, "name": name, "price": price, "stock": rng.randint(3, 80)},
            ),
        ],
        writes=[
            Step(
                "place_order",
                order_args,
                {"order_id": new_order, "status": "confirmed", "total": price},
                kind="write",
                step_id="place-order",
                operation_key=f"order:{customer['customer_id']}:{sku}:{run.token(6, '0123456789abcdef')}",
                external_request_id=f"po_{run.token(16)}",
            )
        ],
        fillers=_order_filler(run, customer),
        ctx={"customer": customer, "sku": sku, "name": name, "price": price, "order_args": order_args},
    )


def _page_text(rng: random.Random, topic: str, long: bool) -> str:
    count = rng.randint(40, 120) if long else rng.randint(3, 10)
    return f"{topic}. " + " ".join(rng.choice(SENTENCES) for _ in range(count))


def _research_filler(run: _Run, topic: str) -> Iterator[Step]:
    """Distinct searches, page fetches and a little analysis: progress, never a repeat."""
    rng = run.rng
    for i in itertools.count():
        facet = FACETS[i % len(FACETS)]
        suffix = "" if i < len(FACETS) else f" {2015 + i // len(FACETS)}"
        query = f"{topic} {facet}{suffix}"
        if i % 3 == 0:
            results = [
                {
                    "title": f"{topic.title()} - {facet} ({n + 1})",
                    "url": f"https://{rng.choice(DOMAINS)}/{run.token(8, string.ascii_lowercase)}",
                    "snippet": rng.choice(SENTENCES),
                }
                for n in range(5)
            ]
            yield Step(
                "web_search",
                {"query": query, "offset": 0},
                {"results": results, "total": rng.randint(40, 9000)},
            )
        elif i % 3 == 1:
            url = f"https://{rng.choice(DOMAINS)}/{facet.replace(' ', '-')}/{i}-{run.token(6, string.ascii_lowercase)}"
            yield Step("fetch_url", {"url": url}, full_text=_page_text(rng, query, long=rng.random() < 0.35))
        else:
            code = f"import pandas as pd\ndf = pd.read_csv('notes_{i}.csv')\nprint(df.describe())"
            yield Step(
                "python",
                {"code": code},
                {"stdout": f"count {rng.randint(5, 90)}  mean {rng.uniform(1, 100):.2f}"},
                kind="other",
            )


def _plan_research(run: _Run) -> Plan:
    rng = run.rng
    topic, synonyms = rng.choice(RESEARCH_TOPICS)
    first_url = f"https://{rng.choice(DOMAINS)}/{run.token(10, string.ascii_lowercase)}"
    results = [
        {
            "title": f"{topic.title()} ({n + 1})",
            "url": first_url if n == 0 else f"https://{d}/{n}",
            "snippet": s,
        }
        for n, (d, s) in enumerate(zip(rng.sample(DOMAINS, 5), rng.sample(SENTENCES, 5), strict=True))
    ]
    return Plan(
        prompt=f"Write me a short brief on {topic}: key numbers, main players and what changes by 2030.",
        answer=f"Here is the brief on {topic}. " + " ".join(rng.sample(SENTENCES, 4)),
        reads=[
            Step(
                "web_search",
                {"query": topic, "offset": 0},
                {"results": results, "total": rng.randint(200, 90_000)},
            ),
            Step("fetch_url", {"url": first_url}, full_text=_page_text(rng, topic, long=True)),
        ],
        writes=[
            Step(
                "save_report",
                {"title": f"Brief: {topic}", "format": "markdown"},
                {"report_id": f"rep_{run.token(10)}", "saved": True},
                kind="write",
                step_id="save-report",
            )
        ],
        fillers=_research_filler(run, topic),
        ctx={"topic": topic, "synonyms": synonyms, "results": results},
    )


PLANS: dict[str, Callable[[_Run], Plan]] = {
    "faq": _plan_faq,
    "order_lookup": _plan_order_lookup,
    "refund": _plan_refund,
    "purchase": _plan_purchase,
    "research": _plan_research,
}


def rounds_sample(rng: random.Random, task_type: str) -> int:
    """Model rounds of an ordinary run: short for most task types, a heavy tail for research."""
    low, high = ROUNDS[task_type]
    if task_type == "faq":
        return rng.choices((1, 2, 3), weights=(50, 35, 15))[0]
    if task_type == "research":
        # Pareto(1.2): half the runs take under ~13 rounds, about one in fifteen reaches the cap.
        return min(high, low + int((rng.paretovariate(1.2) - 1) * 6))
    return round(rng.triangular(low, high, low + 1))


def _begin(
    rng: random.Random,
    start: datetime,
    scenario: str,
    expect: str,
    task_types: Sequence[str],
    run_prefix: str,
    *,
    exclude_backends: Sequence[str] = (),
    reports_cost: bool | None = None,
    ask: bool = True,
) -> _Run:
    task_type = rng.choices(list(task_types), weights=[TASK_TYPES[t] for t in task_types])[0]
    agents = [a for a in AGENTS if task_type in a.task_types and a.backend not in exclude_backends]
    agent = rng.choice(agents)
    run = _Run(
        rng,
        start,
        scenario=scenario,
        expect=expect,
        task_type=task_type,
        agent=agent,
        run_prefix=run_prefix,
        reports_cost=reports_cost,
    )
    if ask:
        run.user(run.plan.prompt)
    return run


def _end_loop(run: _Run, *, repeats: int, tool: str, retries: int | None = None) -> list[Event]:
    """How a runtime ends a run stuck in a loop: a budget, its own guard, or the user leaves.

    `repeats` calls made up the loop; `retries` is how many of them repeated one tool
    (default repeats - 1).
    """
    rng = run.rng
    how = rng.choices(("budget", "guard", "user"), weights=(50, 30, 20))[0]
    if how == "budget":
        budget_type = rng.choice(("max_tool_calls", "max_same_tool_retries", "max_rounds"))
        limit = {
            "max_tool_calls": run.tool_calls,
            "max_rounds": run.round,
            "max_same_tool_retries": retries if retries is not None else repeats - 1,
        }[budget_type]
        run.declare_budgets(hit=budget_type, limit=limit)
        return run.finish(
            "truncated",
            terminated_by="budget",
            budget_type=budget_type,
            reason=f"{budget_type} exhausted ({limit}/{limit}). No progress in the last {repeats} tool calls.",
        )
    if rng.random() < 0.5:
        run.declare_budgets()
    if how == "guard":
        return run.finish(
            "failed",
            terminated_by="loop",
            reason=f"runtime loop guard: {tool} {repeats} times without new information",
        )
    run.wait(rng.uniform(60, 900))
    return run.finish("abandoned", terminated_by="user", reason="the user closed the conversation")


# --- scenarios: ordinary runs ------------------------------------------------------------------


def scenario_normal(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """A successful run of any task type; its round count comes from the task type's distribution."""
    run = _begin(rng, start, "normal", "ok", list(TASK_TYPES), run_prefix)
    run.work(rounds_sample(rng, run.task_type) - 1)
    run.answer(run.plan.answer)
    if rng.random() < 0.4:
        run.declare_budgets()
    return run.finish("succeeded")


def scenario_failed_permission(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """A write refused by the downstream system: the run fails once, no repetition."""
    run = _begin(rng, start, "failed_permission", "ok", ("refund", "purchase"), run_prefix)
    run.warmup(rng.randint(1, 2))
    write = run.plan.writes[0]
    refused = Step(
        write.tool,
        write.args,
        {
            "error": "403 Forbidden: this agent's role may not do this above 100 EUR; a supervisor must approve"
        },
        kind="write",
        status="error",
        error_class="permission",
        step_id=write.step_id,
        operation_key=write.operation_key,
    )
    run.step(refused)
    run.answer(
        "I'm not allowed to complete this myself; I've passed your request to a colleague who can approve it."
    )
    return run.finish("failed", terminated_by="error", reason=f"permission denied on {write.tool}")


def scenario_user_abandoned(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """One clarification question the user never answers: abandoned, but not a loop."""
    run = _begin(rng, start, "user_abandoned", "ok", ("order_lookup", "refund", "purchase"), run_prefix)
    run.warmup(rng.randint(0, 2))
    run.think(text="Could you confirm which delivery address you'd like me to use?")
    run.wait(rng.uniform(1800, 3600))
    return run.finish("abandoned", terminated_by="user", reason="no reply from the user for 30 minutes")


# --- scenarios: loops --------------------------------------------------------------------------


def scenario_loop_exact_repeat(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """The same read with the same arguments and the same result, round after round."""
    run = _begin(
        rng, start, "loop_exact_repeat", "loop", ("order_lookup", "refund", "research", "faq"), run_prefix
    )
    run.warmup(rng.randint(0, 2))
    step = run.next_read()
    repeats = rng.randint(4, 10)
    for _ in range(repeats):
        run.step(step)
    return _end_loop(run, repeats=repeats, tool=step.tool)


def scenario_loop_oscillation(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """A→B→A→B: two reads alternate, each giving the same answer every time."""
    run = _begin(
        rng, start, "loop_oscillation", "loop", ("order_lookup", "refund", "research", "faq"), run_prefix
    )
    first, second = run.plan.reads[-2], run.plan.reads[-1]
    run.plan.reads = run.plan.reads[:-2]
    run.warmup(min(len(run.plan.reads), rng.randint(0, 2)))
    cycles = rng.randint(3, 6)
    for _ in range(cycles):
        run.step(first)
        run.step(second)
    return _end_loop(run, repeats=cycles * 2, tool=f"{first.tool}/{second.tool}", retries=cycles - 1)


JitterStyle = Literal["offset", "synonyms", "case_whitespace"]
JITTER_STYLES: tuple[JitterStyle, ...] = ("offset", "synonyms", "case_whitespace")

# Changes a normaliser (case-fold, collapse whitespace) undoes.
_CASE_WHITESPACE: tuple[Callable[[str], str], ...] = (
    str.upper,
    str.title,
    str.capitalize,
    lambda s: f" {s}",
    lambda s: f"{s}  ",
    lambda s: s.replace(" ", "  "),
)


def _distinct_sequence(rng: random.Random, first: Any, pick: Callable[[], Any], n: int) -> list[Any]:
    """n values starting with `first`, no two neighbours equal."""
    values = [first]
    while len(values) < n:
        value = pick()
        if value != values[-1]:
            values.append(value)
    return values


def _jitter_target(run: _Run, style: JitterStyle, n: int) -> tuple[str, dict[str, Any], str, list[Any], Any]:
    """(tool, its arguments, the one argument to jitter, that argument's values, the one result they all get)."""
    rng, ctx = run.rng, run.plan.ctx
    if run.task_type in ("faq", "research"):
        if run.task_type == "faq":
            tool, text, result = "search_kb", ctx["query"], {"hits": ctx["hits"]}
        else:
            tool, text = "web_search", ctx["topic"]
            result = {"results": ctx["results"], "total": rng.randint(200, 90_000)}
        args: dict[str, Any] = {"query": text, "offset": 0}
        text_key, synonyms = "query", ctx["synonyms"]
    elif style == "case_whitespace":
        customer = ctx["customer"]
        tool, args, result = "get_customer", {"email": customer["email"]}, customer
        text_key, synonyms = "email", ()
    else:
        order = ctx["order"]
        tool, result = (
            "search_orders",
            {"orders": [{"order_id": order["order_id"], "placed": order["placed"]}]},
        )
        args = {"customer_id": ctx["customer"]["customer_id"], "status": "open", "offset": 0, "limit": 20}
        text_key, synonyms = "status", ORDER_STATUS_SYNONYMS[1:]
    if style == "offset":
        key, origin = "offset", rng.choice((10, 20, 40))
        values = _distinct_sequence(rng, origin, lambda: origin + rng.choice((-1, 0, 1)), n)
    elif style == "synonyms":
        key, base = text_key, args[text_key]
        values = _distinct_sequence(rng, base, lambda: rng.choice((base, *synonyms)), n)
    else:
        key, base = text_key, args[text_key]
        values = _distinct_sequence(rng, base, lambda: rng.choice(_CASE_WHITESPACE)(base), n)
    return tool, args, key, values, result


def scenario_loop_arg_jitter(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """The same read with an argument nudged (offset ±1, a synonym, case or spaces): nothing new comes back."""
    run = _begin(rng, start, "loop_arg_jitter", "loop", ("faq", "order_lookup", "research"), run_prefix)
    style = rng.choice(JITTER_STYLES)
    run.warmup(rng.randint(0, 2))
    calls = rng.randint(4, 9)
    tool, args, key, values, result = _jitter_target(run, style, calls)
    for value in values:
        run.step(Step(tool, {**args, key: value}, result))
    run.started["labels"]["sim_jitter"] = style
    return _end_loop(run, repeats=calls, tool=tool)


def scenario_loop_same_error(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """The same call failing with the same invalid_argument error, sent again verbatim."""
    run = _begin(
        rng, start, "loop_same_error", "loop", ("order_lookup", "refund", "faq", "research"), run_prefix
    )
    run.warmup(rng.randint(0, 2))
    if run.task_type == "faq":
        args, error = {"article_id": "returns-policy"}, "article_id: must look like KB-123"
        tool = "get_article"
    elif run.task_type == "research":
        args, error = {"url": f"www.{rng.choice(DOMAINS)}/report"}, "url: must start with http:// or https://"
        tool = "fetch_url"
    else:
        tool = "search_orders"
        args = {"customer_id": run.plan.ctx["customer"]["customer_id"], "placed_after": "last tuesday"}
        error = "placed_after: expected a date like 2026-11-24"
    failing = Step(tool, args, {"error": error}, status="error", error_class="invalid_argument")
    repeats = rng.randint(3, 8)
    for _ in range(repeats):
        run.step(failing)
    return _end_loop(run, repeats=repeats, tool=tool)


CLARIFICATIONS = {
    "order_lookup": ("Could you give me your order number? It starts with ORD-.", "It's {oid}."),
    "refund": ("Which order should I refund? Please share the order number.", "The order is {oid}."),
}
USER_INSISTS = (
    "I already told you: {oid}",
    "{oid}! As I said.",
    "Again: {oid}",
    "It is {oid}, please check.",
)


def scenario_loop_clarification(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """The agent asks the user the same question again although the user answered it."""
    run = _begin(rng, start, "loop_clarification", "loop", tuple(CLARIFICATIONS), run_prefix)
    question, first_answer = CLARIFICATIONS[run.task_type]
    oid = run.plan.ctx["order"]["order_id"]
    asked = rng.randint(3, 5)
    for i in range(asked):
        run.think(text=question)
        if i == 0:
            run.user(first_answer.format(oid=oid))
        elif i < asked - 1:
            run.user(rng.choice(USER_INSISTS).format(oid=oid))
    how = rng.choices(("user", "budget", "guard"), weights=(50, 30, 20))[0]
    if how == "budget":
        run.declare_budgets(hit="max_rounds", limit=run.round)
        return run.finish(
            "truncated",
            terminated_by="budget",
            budget_type="max_rounds",
            reason=f"max_rounds exhausted ({run.round}/{run.round}). The same question {asked} times.",
        )
    if how == "guard":
        return run.finish(
            "failed", terminated_by="loop", reason=f"the same question to the user {asked} times"
        )
    run.user("Forget it.")
    return run.finish("abandoned", terminated_by="user", reason="the user gave up")


def scenario_budget_exhausted(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """Busy but going nowhere: distinct calls until a budget (calls, rounds, cost, tokens) runs out."""
    budget_type = rng.choices(
        ("max_tool_calls", "max_rounds", "max_cost_usd", "max_tokens"), weights=(35, 25, 25, 15)
    )[0]
    costly = budget_type == "max_cost_usd"
    run = _begin(
        rng,
        start,
        "budget_exhausted",
        "budget",
        ("research", "refund", "order_lookup"),
        run_prefix,
        # A cost budget needs a priced backend, and rounds that say what they cost.
        exclude_backends=("local",) if costly else (),
        reports_cost=True if costly else None,
    )
    tool_rounds = rng.randint(12, 40)
    progress_until = rng.randint(3, tool_rounds // 2)
    for _ in range(tool_rounds):
        run.step(run.next_read())
    used = run.usage()[budget_type]
    if costly:
        limit: float = math.floor(used * 10_000) / 10_000 or round(used, 6)
        spent = f"{used:.4f} USD of {limit}"
    else:
        limit = int(used)
        spent = f"{limit}/{limit}"
    run.declare_budgets(hit=budget_type, limit=limit)
    return run.finish(
        "truncated",
        terminated_by="budget",
        budget_type=budget_type,
        reason=f"{budget_type} exhausted ({spent}). No progress in the last {tool_rounds - progress_until} tool calls.",
    )


# --- scenarios: legitimate repetition ------------------------------------------------------------


def scenario_legit_polling(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """Start a job, poll it while it is RUNNING, then SUCCEEDED: repeated calls, real progress."""
    run = _begin(rng, start, "legit_polling", "ok", ("research", "order_lookup", "refund"), run_prefix)
    run.warmup(rng.randint(0, 2))
    job_id = f"job_{run.token(12, string.ascii_lowercase + string.digits)}"
    run.step(
        Step(
            "start_export",
            {"dataset": f"{run.task_type}_history", "format": "csv"},
            {"job_id": job_id, "status": "QUEUED"},
            kind="write",
            step_id="start-export",
            operation_key=f"export:{run.run_id}",
        )
    )
    running = rng.randint(3, 12)
    # Half the jobs report no progress figure: the polls then return the very same RUNNING.
    with_progress = rng.random() < 0.5
    delay = 2.0
    for i in range(running + 1):
        run.wait(delay)
        delay = min(delay * 1.6, 30.0)
        if i < running:
            status: dict[str, Any] = {"job_id": job_id, "status": "RUNNING"}
            if with_progress:
                status["progress"] = round((i + 1) / (running + 1), 2)
        else:
            status = {
                "job_id": job_id,
                "status": "SUCCEEDED",
                "url": f"https://exports.example.com/{job_id}.csv",
            }
        run.think(output_tokens=rng.randint(15, 40))
        run.calls([Step("get_job_status", {"job_id": job_id}, status, kind="poll")], think=False)
    run.step(
        Step(
            "download_export",
            {"job_id": job_id},
            {"rows": rng.randint(100, 90_000), "bytes": rng.randint(10**4, 10**7)},
        )
    )
    run.answer(f"The export is ready: https://exports.example.com/{job_id}.csv")
    return run.finish("succeeded")


def scenario_legit_paging(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """The same list call, page after page with an advancing page number or cursor."""
    run = _begin(rng, start, "legit_paging", "ok", ("order_lookup", "refund", "purchase"), run_prefix)
    run.warmup(rng.randint(0, 1))
    pages = rng.randint(3, 9)
    by_cursor = rng.random() < 0.4
    customer = run.plan.ctx["customer"]
    cursor: str | None = None
    for page in range(1, pages + 1):
        items = [
            f"ORD-{rng.randint(100_000, 999_999)}" for _ in range(20 if page < pages else rng.randint(1, 20))
        ]
        last = page == pages
        if by_cursor:
            args: dict[str, Any] = {"customer_id": customer["customer_id"], "limit": 20}
            if cursor is not None:
                args["cursor"] = cursor
            cursor_next = None if last else run.token(16, string.ascii_letters + string.digits + "-_")
            result: dict[str, Any] = {"items": items, "next_cursor": cursor_next}
            cursor = cursor_next
        else:
            args = {"customer_id": customer["customer_id"], "page": page, "page_size": 20}
            result = {"orders": items, "page": page, "next_page": None if last else page + 1}
        run.step(Step("list_orders", args, result))
    run.answer(f"I went through all {pages} pages of your order history; nothing else is open.")
    return run.finish("succeeded")


def scenario_legit_double_purchase(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """The user asks for two of the same item: two identical writes, two steps, two operation keys."""
    run = _begin(rng, start, "legit_double_purchase", "ok", ("purchase",), run_prefix, ask=False)
    ctx = run.plan.ctx
    run.user(
        f"Please order two of the {ctx['name']} for me, as two separate orders: one is a gift. "
        f"I'm {ctx['customer']['email']}."
    )
    run.warmup(rng.randint(1, 2))
    base = run.plan.writes[0]
    orders = [
        Step(
            base.tool,
            base.args,
            {
                "order_id": f"ORD-{rng.randint(100_000, 999_999)}",
                "status": "confirmed",
                "total": ctx["price"],
            },
            kind="write",
            step_id=f"place-order-{n}",
            operation_key=f"{base.operation_key}:{n}",
            external_request_id=f"po_{run.token(16)}",
        )
        for n in (1, 2)
    ]
    if run.agent.parallel and rng.random() < 0.5:
        run.calls(orders)
    else:
        run.step(orders[0])
        run.step(orders[1])
    run.answer(f"Both orders are placed: {orders[0].result['order_id']} and {orders[1].result['order_id']}.")
    return run.finish("succeeded")


def scenario_legit_transient_retry(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """A 503 (transient), a backoff, the same call again, and it works."""
    run = _begin(
        rng,
        start,
        "legit_transient_retry",
        "ok",
        ("order_lookup", "refund", "purchase", "research"),
        run_prefix,
    )
    run.warmup(rng.randint(0, 2))
    target = run.plan.writes[0] if run.plan.writes and rng.random() < 0.3 else run.next_read()
    if target in run.plan.writes:
        run.plan.writes.remove(target)
    failures = 1 if rng.random() < 0.7 else 2
    failed = Step(
        target.tool,
        target.args,
        {"error": "503 Service Unavailable", "retry_after_s": 2},
        kind=target.kind,
        status="error",
        error_class="transient",
        step_id=target.step_id,
        operation_key=target.operation_key,
    )
    # Half the time the runtime retries by itself within the round, under the model's call id;
    # otherwise the model sees the error and calls again in a new round.
    by_runtime = rng.random() < 0.5
    call_id = run.step(failed)
    for attempt in range(failures):
        run.wait(2 * 2**attempt + rng.uniform(0, 0.5))
        step = target if attempt == failures - 1 else failed
        if by_runtime:
            run.calls([dataclasses.replace(step, call_id=call_id)], think=False)
        else:
            run.step(step)
    run.work(rng.randint(0, 2))
    run.answer(run.plan.answer)
    return run.finish("succeeded")


def scenario_write_timeout(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """A write times out: its outcome is UNKNOWN. The agent checks, gives up, or tells the user it is pending."""
    run = _begin(rng, start, "write_timeout", "unknown_write", ("refund", "purchase"), run_prefix)
    run.warmup(rng.randint(1, 2))
    write = run.plan.writes[0]
    request_id = f"req_{run.token(20)}" if rng.random() < 0.5 else None
    run.step(
        Step(
            write.tool,
            write.args,
            kind="write",
            status="timeout",
            step_id=write.step_id,
            operation_key=write.operation_key,
            external_request_id=request_id,
            latency_ms=float(rng.choice((15_000, 30_000, 60_000))),
        )
    )
    outcome = rng.choices(("checked", "failed", "pending"), weights=(40, 30, 30))[0]
    if outcome == "checked":
        lookup = "get_refund" if write.tool == "create_refund" else "get_order_by_key"
        run.step(Step(lookup, {"operation_key": write.operation_key}, {**write.result, "found": True}))
        run.answer(run.plan.answer)
        return run.finish("succeeded")
    if outcome == "failed":
        return run.finish(
            "failed",
            terminated_by="error",
            reason=f"{write.tool} timed out; outcome unknown, needs reconciliation",
        )
    run.answer(
        "Your request was sent, but the confirmation timed out. We'll email you as soon as it is confirmed."
    )
    return run.finish("succeeded")


# --- the mix -------------------------------------------------------------------------------------

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
