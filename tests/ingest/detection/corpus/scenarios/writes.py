"""Legitimate: writes and retries — identical writes the user asked for, retries with backoff."""

from __future__ import annotations

from tests.ingest.detection.corpus.builder import Run, ok


@ok("double_purchase", "shop-assistant", "purchase", "gpt-4o")
def ok_double_purchase_operation_key(r: Run) -> None:
    """The user asks for two separate orders of the same gift; two identical place_order calls with different
    operation_keys.
    """
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
    for n, nth in ((1, "first"), (2, "second")):
        r.step(
            "place_order",
            args,
            {"order_id": f"A-6600{n}", "status": "placed"},
            operation_key="op-" + r.hex(16),
            step_id=f"order-{n}",
            external_request_id=f"ord_6600{n}",
            text=f"Placing the {nth} order.",
        )
    r.finish("succeeded", answer="Done: two separate orders, A-66001 and A-66002.")


@ok("double_purchase", "wallet-assistant", "purchase", "claude-sonnet-4-5")
def ok_double_purchase_step_id(r: Run) -> None:
    """Two identical top-up writes without operation_key but different step_ids, as the user asked."""
    r.user(
        "Top up my transit card with 20 euros, and then do another 20 — I need two separate receipts for "
        "expenses."
    )
    r.step("get_customer", {"customer_id": "C-3012"}, {"customer_id": "C-3012", "transit_card": "TC-88120"})
    args = {"card": "TC-88120", "amount": 20.0, "currency": "EUR"}
    for n, receipt in ((1, "RC-5510"), (2, "RC-5511")):
        r.step("place_order", args, {"receipt": receipt, "status": "completed"}, step_id=f"topup-{n}")
    r.finish("succeeded", answer="Two top-ups of 20 EUR done; receipts RC-5510 and RC-5511.")


@ok("identical_writes_user_intended", "pm-assistant", "project_admin", "deepseek-chat")
def ok_three_identical_tickets(r: Run) -> None:
    """Three identical create_ticket writes in a row (the user asked for three placeholders), each with its
    own operation_key.
    """
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


@ok("retry_transient_backoff", "ops-bot", "inventory", "gpt-4.1-mini")
def ok_retry_transient_once(r: Run) -> None:
    """A 503 on the first try, one retry after a 2s backoff succeeds."""
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


@ok("retry_transient_backoff", "ops-bot", "inventory", "claude-3-5-haiku")
def ok_retry_transient_twice(r: Run) -> None:
    """Two 503s with exponential backoff (1s, 4s), the third attempt succeeds."""
    r.user("Is the shipping-rates service returning a rate for a 2kg parcel to Vienna?")
    args = {"url": "https://rates.internal.example/v2/quote", "params": {"weight_kg": 2, "to": "AT-1010"}}
    r.step("http_get", args, {"status": 503}, status="error", error_class="transient")
    r.step("http_get", args, {"status": 503}, status="error", error_class="transient", wait=1.0)
    r.step("http_get", args, {"status": 200, "rate_eur": 9.4, "service": "standard"}, wait=4.0)
    r.finish("succeeded", answer="Yes: 9.40 EUR standard.")


@ok("retry_rate_limited_backoff", "repo-analyst", "research", "deepseek-chat")
def ok_retry_rate_limited_backoff(r: Run) -> None:
    """Rate limited with retry_after=20s; the agent waits 20s and the retry succeeds."""
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


@ok("write_retry_after_definite_error", "shop-assistant", "purchase", "gpt-4o")
def ok_write_503_retry_same_key(r: Run) -> None:
    """place_order fails with a definite 503 (not a timeout); retried after backoff with the same
    operation_key and succeeds: idempotent, no duplicate.
    """
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


@ok("write_timeout_reconciled", "billing-assistant", "refund", "claude-sonnet-4-5")
def ok_write_timeout_reconciled(r: Run) -> None:
    """refund_payment times out; the agent checks the refund status by operation key instead of retrying,
    finds it completed.
    """
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


@ok("distinct_writes", "collections-bot", "dunning", "gpt-4.1-mini")
def ok_send_emails_distinct(r: Run) -> None:
    """The same reminder template sent to four different recipients."""
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
