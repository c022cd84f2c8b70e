"""Loops: duplicate writes — a write retried under the same idempotency key after a timeout."""

from __future__ import annotations

from tests.ingest.detection.corpus.builder import Run, loop


@loop("duplicate_write", "write_retry_after_timeout_same_key", "shop-assistant", "purchase", "gpt-4o")
def loop_dup_write_place_order_timeout(r: Run) -> None:
    """place_order times out (UNKNOWN) and is retried twice with the same operation_key; two orders exist."""
    r.user("Order one pack of Lavazza Qualita Oro beans, 1kg, to my usual address.")
    r.step(
        "search_products",
        {"query": "Lavazza Qualita Oro 1kg beans"},
        {"products": [{"sku": "LAV-QO-1000", "name": "Lavazza Qualita Oro 1kg", "price": 18.9}]},
    )
    args = {"sku": "LAV-QO-1000", "qty": 1, "address_id": "ADDR-1", "payment_method": "card_on_file"}
    key = "op-ord-" + r.hex(12)
    timeout = {"status": "timeout", "operation_key": key, "step_id": "s3"}
    r.step("place_order", args, "Timed out after 30s", text="Placing the order now.", **timeout)
    retry = "The order request timed out; let me try again."
    r.step("place_order", args, "Timed out after 30s", text=retry, label=True, **timeout)
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


@loop(
    "duplicate_write",
    "write_retry_after_timeout_same_step",
    "billing-assistant",
    "refund",
    "claude-sonnet-4-5",
)
def loop_dup_write_refund_step_id(r: Run) -> None:
    """refund_payment (no operation_key, same step_id) times out and is re-sent; the customer gets two
    refunds.
    """
    r.user("Refund the 49.90 charge on payment PAY-30218, the item never shipped.")
    r.step(
        "get_payment",
        {"payment_id": "PAY-30218"},
        {"payment_id": "PAY-30218", "amount": 49.9, "currency": "EUR", "status": "captured", "refunds": []},
    )
    args = {"payment_id": "PAY-30218", "amount": 49.9, "reason": "not_shipped"}
    r.step("refund_payment", args, None, status="timeout", step_id="refund-PAY-30218")
    r.step(
        "refund_payment",
        args,
        {"refund_id": "RF-1182", "status": "succeeded"},
        step_id="refund-PAY-30218",
        text="The refund call timed out. Retrying it.",
        external_request_id="re_3NqT1182",
        label=True,
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


@loop(
    "duplicate_write", "write_retry_after_timeout_key_new_step", "collections-bot", "dunning", "deepseek-chat"
)
def loop_dup_write_email_same_key(r: Run) -> None:
    """send_email times out; retried under a new step_id but the same operation_key (the key wins)."""
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
    retry = "The email service timed out; sending again."
    r.step(
        "send_email",
        body,
        None,
        status="timeout",
        operation_key=key,
        step_id="step-5",
        text=retry,
        label=True,
    )
    r.step(
        "send_email",
        body,
        {"message_id": "<a81f@mail.example>", "status": "queued"},
        operation_key=key,
        step_id="step-6",
    )
    r.finish("succeeded", answer="The reminder has been sent to ap@brightwave.example.")
