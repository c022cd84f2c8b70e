"""Legitimate: near-misses of the loop rules (adversarial) and everyday runs."""

from __future__ import annotations

from tests.ingest.detection.corpus.builder import Run, ok, order_record


@ok("same_read_twice", "billing-assistant", "refund", "claude-sonnet-4-5")
def ok_single_retry_same_read(r: Run) -> None:
    """The agent re-reads an order once (same result) to double-check before refunding: 2, not 3."""
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


@ok("read_retry_after_timeout", "research-assistant", "research", "deepseek-chat")
def ok_read_retry_after_timeout(r: Run) -> None:
    """A read times out once and the identical retry succeeds."""
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


@ok("user_repeats_question", "support-bot", "order_lookup", "gpt-4o")
def ok_user_asks_twice(r: Run) -> None:
    """The user asks the same status question twice, ten minutes apart; two lookups, two different answers."""
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


@ok("reread_after_change", "code-fixer", "coding", "claude-sonnet-4-5")
def ok_config_reread_after_edit(r: Run) -> None:
    """config.yaml read three times, with edits in between; the content differs every time."""
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


@ok("clarify_once", "travel-planner", "trip_planning", "deepseek-chat")
def ok_clarify_once(r: Run) -> None:
    """One clarification question, the user answers, the agent proceeds."""
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


@ok("clarify_two_different", "finance-bot", "reporting", "gpt-4o")
def ok_two_different_questions(r: Run) -> None:
    """Two different clarification questions in a row (account, then date range), both answered."""
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


@ok("refine_loop_converges", "code-fixer", "coding", "claude-sonnet-4-5")
def ok_refine_converges(r: Run) -> None:
    """run_tests <-> edit_file alternate 4 times; the identical run_tests call shows fewer failures each time
    until green.
    """
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


@ok("alternation_results_change", "treasury-bot", "treasury", "deepseek-chat")
def ok_oscillation_results_change(r: Run) -> None:
    """check_balance <-> list_pending_transfers alternate 5 times with identical args while transfers settle:
    both results change every cycle.
    """
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


@ok("similar_calls_new_results", "shopping-assistant", "shopping", "gpt-4.1-mini")
def ok_similar_queries_new_results(r: Run) -> None:
    """Product searches that differ by size/colour/type only, each returning different products."""
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


@ok("noise_fields_distinct_args", "support-bot", "order_lookup", "claude-sonnet-4-5")
def ok_noise_fields_distinct_reads(r: Run) -> None:
    """Eight get_order calls carrying request_id noise, each for a different order."""
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


@ok("uuid_ids_are_core_args", "contract-reviewer", "legal_review", "deepseek-chat")
def ok_uuid_document_ids(r: Run) -> None:
    """Seven get_document calls whose only argument is a different UUID document_id (not noise)."""
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


@ok("multi_turn_read_after_write", "support-bot", "order_support", "claude-sonnet-4-5")
def ok_multi_turn_support(r: Run) -> None:
    """Multi-turn support chat: read order, change address (write), read the order again (changed)."""
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


@ok("short_lookup", "support-bot", "order_lookup", "gpt-4.1-mini")
def ok_short_lookup(r: Run) -> None:
    """A plain two-call lookup."""
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


@ok("same_announcement_with_action", "support-bot", "order_lookup", "deepseek-chat")
def ok_announce_with_action(r: Run) -> None:
    """'I will now check the next order.' seven times, each time with a get_order for a new id."""
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


@ok("single_empty_response", "doc-writer", "writing", "llama-3.1-70b-instruct")
def ok_empty_then_recovers(r: Run) -> None:
    """One empty model response; the runtime nudges and the model continues normally."""
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


@ok("error_then_corrected_call", "support-bot", "order_lookup", "gpt-4o")
def ok_error_then_fixed_args(r: Run) -> None:
    """invalid_argument on the first call; the agent fixes the id format and succeeds."""
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


@ok("distinct_not_found_probes", "code-fixer", "coding", "claude-3-5-haiku")
def ok_probe_missing_files(r: Run) -> None:
    """Looking for the app's config: three different candidate paths are not_found, the fourth exists."""
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


@ok("changing_errors_converge", "sql-analyst", "analytics", "qwen2.5-32b-instruct")
def ok_different_errors_then_success(r: Run) -> None:
    """Three SQL attempts fail with different errors as the agent fixes each one; the 4th succeeds."""
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


@ok("mixed_everyday", "scheduler", "scheduling", "gpt-4o")
def ok_weather_then_book(r: Run) -> None:
    """Weather check, calendar check, room booking: an ordinary short run with a write."""
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
