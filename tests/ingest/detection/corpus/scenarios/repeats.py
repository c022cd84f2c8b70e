"""Loops: exact repeats — the same read again and again, behind noise, key order, whitespace or batches.

The label point is the 3rd consecutive identical read: the last call of the 3rd identical parallel
batch, 2 calls later where the result carries noise too.
"""

from __future__ import annotations

from tests.ingest.detection.corpus.builder import Run, loop, order_record


@loop("exact_repeat", "repeat_noise_request_id", "support-bot", "order_lookup", "gpt-4o")
def loop_repeat_get_order_request_id(r: Run) -> None:
    """Support agent re-reads the same order eight times; only a fresh request_id changes per call."""
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
    text = "The carrier reports an address exception. Let me double-check the order details."
    for i in range(8):
        args = {"order_id": "A-20931", "request_id": r.req_id()}
        if i % 2:  # the same keys in the other order
            args = {"request_id": args["request_id"], "order_id": "A-20931"}
        r.step("get_order", args, order, text=text if i < 3 else None, label=i == 2)
    r.finish(
        "truncated", terminated_by="loop", reason="get_order A-20931 repeated 8 times with the same result"
    )


@loop(
    "exact_repeat",
    "repeat_key_order_whitespace_numbers",
    "billing-assistant",
    "order_lookup",
    "claude-sonnet-4-5",
)
def loop_repeat_search_key_order_whitespace(r: Run) -> None:
    """The same order search re-sent with shuffled keys, stray spaces and 100 vs 100.0; identical results."""
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
    r.steps(
        (("search_orders", args, result) for args in variants),
        label_at=3,
        texts={1: "Let me search for the cancelled orders above 100 EUR."},
    )
    r.user("Hello? You keep searching. I only need the two order numbers.")
    r.finish(
        "succeeded",
        answer="You have two cancelled orders over 100 EUR: A-18820 (149.00 EUR) and A-19977 (312.50 EUR).",
        terminated_by="user",
    )


@loop("exact_repeat", "paging_stuck_page_2", "triage-bot", "ticket_triage", "deepseek-chat")
def loop_repeat_page_stuck(r: Run) -> None:
    """Ticket triage pages 1 then asks for page=2 six times in a row (page 2,2,2 is a loop, not paging)."""
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

    pages = [1, 2, 2, 2, 2, 2, 2, 2]
    for i, n in enumerate(pages):
        r.step(
            "list_tickets",
            {"queue": "billing", "status": "open", "page": n, "per_page": 25},
            page(n),
            text="Fetching the next page." if i else "Fetching the open billing tickets.",
            label=i == 3,  # page=2 for the 3rd consecutive time
        )
    r.finish("truncated", terminated_by="loop", reason="page 2 requested 7 times")


@loop("exact_repeat", "repeat_noise_trace_uuid_nonce", "oncall-helper", "incident_triage", "gpt-4.1-mini")
def loop_repeat_http_trace_uuid(r: Run) -> None:
    """Status-page fetch repeated with a fresh trace_id UUID, timestamp and nonce each time; same body."""
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
        text = "Checking the incident feed again for an update." if i else None
        r.step("http_get", args, body, text=text, label=i == 2)
    r.finish("truncated", terminated_by="loop")


@loop("exact_repeat", "repeat_read_same_file", "code-fixer", "coding", "claude-sonnet-4-5")
def loop_repeat_read_file_plain(r: Run) -> None:
    """Coding agent re-reads tax.py six times in a row between no edits; byte-identical calls and results."""
    r.user("tests/test_tax.py::test_rounding_half_even fails on main. Please fix it.")
    tax = (
        "from decimal import Decimal, ROUND_HALF_UP\n\n\ndef vat(amount: Decimal, rate: Decimal) -> Decimal:\n"
        "    return (amount * rate).quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)\n"
    )
    r.step(
        "list_dir", {"path": "src/billing"}, {"entries": ["__init__.py", "invoice.py", "tax.py", "ledger.py"]}
    )
    read = (
        "read_file",
        {"path": "src/billing/tax.py"},
        {"path": "src/billing/tax.py", "content": tax, "lines": 6},
    )
    r.step(*read)
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
        r.step(*read, text="Let me re-read tax.py to check the rounding mode.", label=i == 2)
    r.finish("truncated", terminated_by="loop", reason="read_file tax.py repeated without edits")


@loop("exact_repeat", "repeat_sql_whitespace_variants", "sql-analyst", "analytics", "qwen2.5-32b-instruct")
def loop_repeat_sql_whitespace(r: Run) -> None:
    """Analyst agent re-runs one SQL statement with only line breaks, tabs and spaces changed."""
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
    r.steps(
        (("sql_query", {"sql": sql, "database": "shop"}, rows) for sql in sqls),
        label_at=3,
        texts=dict.fromkeys((1, 4), "Running the aggregation query."),
    )
    r.finish("truncated", terminated_by="loop")


@loop("exact_repeat", "repeat_parallel_batch_by_round", "travel-planner", "trip_planning", "deepseek-chat")
def loop_repeat_parallel_batches(r: Run) -> None:
    """A backend that emits parallel batches repeats the same 3-city weather batch every round."""
    r.user(
        "I'm choosing between Paris, Lyon and Marseille for this weekend. Which will have the best weather?"
    )
    cities = {"Paris": (11, "light rain", 82), "Lyon": (14, "cloudy", 64), "Marseille": (17, "sunny", 12)}
    items = [
        (
            "get_weather",
            {"city": c, "country": "FR", "units": "metric"},
            {"city": c, "temp_c": t, "conditions": cond, "precip_prob": p},
        )
        for c, (t, cond, p) in cities.items()
    ]
    r.batch(items, text="Let me get the current weather for all three cities.")
    for i in range(5):
        r.batch(items, label=i == 1)  # the third identical batch, counted by round
    r.finish("truncated", terminated_by="loop")


@loop("exact_repeat", "repeat_noise_in_args_and_result", "finance-bot", "account_lookup", "gpt-4o")
def loop_repeat_result_noise(r: Run) -> None:
    """Balance re-read 9 times; request_id in args and as_of/response_id in the result change, the balance
    never does (label has +2 slack: needs result normalisation or novelty).
    """
    r.user("Has the 2,400 EUR transfer from Nordbank arrived on account ACC-7781 yet?")
    r.step(
        "list_pending_transfers",
        {"account_id": "ACC-7781"},
        {"pending": [{"transfer_id": "TR-55102", "amount": 2400.0, "from": "Nordbank", "eta": "2026-03-12"}]},
    )
    for i in range(9):
        r.step(
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
            label=i == 4,
        )
    r.finish("abandoned", terminated_by="loop")
