"""Legitimate: paging, tailing and scrolling — the same tool again, with new results each time."""

from __future__ import annotations

from typing import Any

from tests.ingest.detection.corpus.builder import Run, ok


@ok("paging_page", "triage-bot", "ticket_triage", "gpt-4o")
def ok_paging_page(r: Run) -> None:
    """Ticket export pages 1..8 (page number advances, new tickets each page)."""
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


@ok("paging_offset", "oncall-helper", "incident_triage", "deepseek-chat")
def ok_paging_offset(r: Run) -> None:
    """Log search pages by offset 0,50,...,350 with new hits each time."""
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


@ok("paging_cursor", "crm-assistant", "crm", "claude-sonnet-4-5")
def ok_paging_cursor(r: Run) -> None:
    """Customer list walked with an opaque cursor token for 10 pages."""
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


@ok("paging_since_tail", "deploy-watcher", "deploy", "llama-3.1-70b-instruct")
def ok_tail_since(r: Run) -> None:
    """Event stream tailed with an advancing 'since' timestamp; new events each time until done."""
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


@ok("paging_restart_after_filter", "triage-bot", "ticket_triage", "gpt-4o")
def ok_paging_restart_after_filter(r: Run) -> None:
    """Pages 1-3 of open tickets, then the filter changes to pending and paging restarts at page 1."""
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


@ok("paging_start_line", "code-fixer", "coding", "claude-sonnet-4-5")
def ok_paging_read_file_start(r: Run) -> None:
    """A large file read in 200-line chunks (start=1,201,401,...)."""
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


@ok("paging_offset_by_one", "ops-bot", "queue_triage", "deepseek-chat")
def ok_paging_offset_step1(r: Run) -> None:
    """Dead-letter queue inspected one message at a time: offset 0..9, a different message each time."""
    r.user("Look at the 10 oldest messages in the orders dead-letter queue and tell me why they failed.")
    reasons = (
        "schema_mismatch timeout schema_mismatch duplicate_key timeout schema_mismatch missing_customer "
        "timeout schema_mismatch duplicate_key"
    ).split()
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


@ok("tail_log_changing", "deploy-watcher", "deploy", "qwen2.5-32b-instruct")
def ok_tail_log(r: Run) -> None:
    """The identical tail_log call repeated 9 times during a migration; new lines every time."""
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


@ok("scroll_changing", "browser-agent", "browsing", "gpt-4o")
def ok_scroll_feed(r: Run) -> None:
    """Browser agent scrolls a review page 10 times with the same action; new reviews appear each time."""
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
