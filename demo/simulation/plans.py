"""What an ordinary run of each task type does: the reads it makes, the writes it ends with, and an
endless supply of further distinct reads (fillers) for runs that go on longer."""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from demo.simulation.content import (
    CARRIERS,
    DOMAINS,
    FACETS,
    FAQS,
    FIRST_NAMES,
    LAST_NAMES,
    PRODUCTS,
    RESEARCH_TOPICS,
    SENTENCES,
)


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


class PlanContext(Protocol):
    """What a plan needs of the run it is made for (demo.simulation.runs.RunBuilder)."""

    rng: random.Random
    start: datetime

    def token(self, n: int, alphabet: str = ...) -> str: ...


# --- plans per task type ---------------------------------------------------------------------


def _customer(rng: random.Random) -> dict[str, Any]:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    return {
        "customer_id": f"C-{rng.randint(10_000, 99_999)}",
        "name": f"{first} {last}",
        "email": f"{first.lower()}.{last.lower()}@example.com",
        "tier": rng.choice(("standard", "standard", "plus", "gold")),
    }


def _order(run: PlanContext, customer: dict[str, Any], *, days_ago: int | None = None) -> dict[str, Any]:
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


def _kb_filler(run: PlanContext) -> Iterator[Step]:
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


def _plan_faq(run: PlanContext) -> Plan:
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


def _order_filler(run: PlanContext, customer: dict[str, Any]) -> Iterator[Step]:
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


def _plan_order_lookup(run: PlanContext) -> Plan:
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


def _plan_refund(run: PlanContext) -> Plan:
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


def _plan_purchase(run: PlanContext) -> Plan:
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


def _research_filler(run: PlanContext, topic: str) -> Iterator[Step]:
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


def _plan_research(run: PlanContext) -> Plan:
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


PLANS: dict[str, Callable[[PlanContext], Plan]] = {
    "faq": _plan_faq,
    "order_lookup": _plan_order_lookup,
    "refund": _plan_refund,
    "purchase": _plan_purchase,
    "research": _plan_research,
}
