"""Loops in model output, labelled by round: clarification, monologue, empty responses."""

from __future__ import annotations

from tests.ingest.detection.corpus.builder import Run, loop

# Label points: the 2nd asking/announcement when it is word for word, the 3rd when it is paraphrased;
# the 3rd empty response in a row.
VERBATIM, PARAPHRASED, EMPTY = 2, 3, 3


def _say(
    r: Run,
    texts: list[str | None],
    *,
    label_at: int,
    replies: list[str] | None = None,
    think: tuple[float, float] = (4, 40),
    out: int | None = None,
) -> None:
    """Model rounds without a tool call, one per text, each answered by the next reply while any are
    left; `label_at` numbers the rounds from 1. `out`: the output tokens of an empty response.
    """
    for n, text in enumerate(texts, 1):
        r.model(text, out=out, label=n == label_at)
        if replies and n <= len(replies):
            r.user(replies[n - 1], think=think)


@loop("clarification", "clarify_same_question_verbatim", "support-bot", "order_support", "gpt-4o")
def loop_clarify_verbatim(r: Run) -> None:
    """The agent asks which order to cancel four times, word for word, although the user answered."""
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
    replies = [
        "The headphones one.",
        "A-40112. The headphones.",
        "I already told you twice. A-40112!",
        "Forget it, I'll call support.",
    ]
    _say(r, [q] * 4, replies=replies, label_at=VERBATIM)
    r.finish("abandoned", terminated_by="user")


@loop("clarification", "clarify_paraphrased", "shop-assistant", "order_support", "claude-sonnet-4-5")
def loop_clarify_paraphrased(r: Run) -> None:
    """The agent keeps asking the user to confirm the shipping address in new words; the user answered."""
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
    _say(r, asks, replies=answers, label_at=PARAPHRASED)
    r.finish("abandoned", terminated_by="user")


@loop(
    "clarification", "clarify_paraphrased_between_tools", "travel-planner", "trip_planning", "deepseek-chat"
)
def loop_clarify_after_tools(r: Run) -> None:
    """Travel agent asks for the travel dates, searches, then asks for the dates again (x4)."""
    r.user("Find me a flight from Berlin to Lisbon.")
    asks = [
        "What dates would you like to travel?",
        "Could you tell me your travel dates?",
        "Which dates are you planning to fly?",
        "When would you like to depart and return?",
    ]
    for i, ask in enumerate(asks):
        r.model(ask, label=i + 1 == PARAPHRASED)
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


@loop("monologue", "monologue_same_announcement", "support-bot", "order_lookup", "llama-3.1-70b-instruct")
def loop_monologue_will_check(r: Run) -> None:
    """'I will now check the order status.' six rounds in a row with no tool call."""
    r.user("Has order A-77310 shipped?")
    _say(r, ["I will now check the order status."] * 6, label_at=VERBATIM)
    r.finish("truncated", terminated_by="loop")


@loop("monologue", "monologue_paraphrased_with_nudges", "billing-assistant", "billing", "gpt-4.1-mini")
def loop_monologue_paraphrased(r: Run) -> None:
    """The agent announces it will retrieve the invoice in new words each round, never calls the tool; the
    runtime nudges it to continue.
    """
    r.user("Send me a copy of my March invoice.")
    texts = [
        "Let me look up the invoice now.",
        "I'll pull up your March invoice now.",
        "Now I will retrieve the invoice for March.",
        "Next, I'm going to fetch the March invoice.",
        "I will now get the invoice.",
        "Let me retrieve the March invoice for you now.",
    ]
    nudges = ["Please continue with the task."] * (len(texts) - 1)
    _say(r, texts, replies=nudges, think=(0.2, 0.6), label_at=PARAPHRASED)
    r.finish("truncated", terminated_by="loop")


@loop("monologue", "monologue_after_real_work", "account-manager", "reporting", "claude-sonnet-4-5")
def loop_monologue_after_work(r: Run) -> None:
    """After real work the agent repeats 'I will now send the summary email' five times, never sends."""
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
    _say(r, ["I will now send the summary email to it-admin@globex.example."] * 5, label_at=VERBATIM)
    r.finish("truncated", terminated_by="loop")


@loop("empty_responses", "empty_rounds_no_text", "doc-writer", "writing", "qwen2.5-32b-instruct")
def loop_empty_local(r: Run) -> None:
    """A local model returns six empty responses in a row (no text, no tokens, no calls)."""
    r.user("Write release notes for v2.4 from the merged PRs.")
    r.step(
        "http_get",
        {"url": "https://git.internal.example/api/v4/projects/12/merge_requests?state=merged&milestone=v2.4"},
        {
            "status": 200,
            "items": [{"iid": 811, "title": "Add CSV export"}, {"iid": 815, "title": "Fix TZ bug"}],
        },
    )
    _say(r, [None] * 6, out=0, label_at=EMPTY)
    r.finish("failed", terminated_by="error", reason="model returned no output")


@loop("empty_responses", "empty_rounds_after_error", "ops-bot", "inventory", "deepseek-chat")
def loop_empty_after_error(r: Run) -> None:
    """After a tool error the model returns empty strings five rounds in a row."""
    r.user("Restock report for the Lyon warehouse, please.")
    r.step(
        "sql_query",
        {"sql": "SELECT sku, qty FROM stock WHERE wh = 'LYS1' AND qty < reorder_point"},
        {"error": 'relation "stock" does not exist'},
        status="error",
        error_class="invalid_argument",
    )
    _say(r, [""] * 5, out=1, label_at=EMPTY)
    r.finish("failed")


@loop("empty_responses", "empty_rounds_whitespace", "research-assistant", "research", "gpt-4o")
def loop_empty_whitespace(r: Run) -> None:
    """The model answers with only whitespace/newlines five rounds in a row."""
    r.user("Compare the battery life of the two laptops I shortlisted yesterday.")
    r.step(
        "read_file",
        {"path": "notes/shortlist.md"},
        {"content": "- ThinkPad X1 Carbon Gen 12\n- MacBook Air 13 M3\n", "lines": 2},
    )
    _say(r, ["\n", "\n\n", " ", "\n", " \n "], out=1, label_at=EMPTY)
    r.finish("failed")
