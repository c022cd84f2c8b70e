"""Loops: oscillation — two or three actions taking turns with unchanged results."""

from __future__ import annotations

from typing import Any

from tests.ingest.detection.corpus.builder import Action, Run, loop, order_record


def _oscillate(
    r: Run, cycle: list[Action], *, cycles: int, texts: dict[int, str] | None = None, noisy: bool = False
) -> None:
    """Play the cycle's actions in turn `cycles` times; the label is the call completing the 3rd cycle.

    `noisy`: every call carries a fresh request_id and timestamp, its keys shuffled.
    """
    actions = ((tool, _noisy(r, args) if noisy else args, result) for tool, args, result in cycle * cycles)
    r.steps(actions, label_at=3 * len(cycle), texts=texts)


def _noisy(r: Run, args: dict[str, Any]) -> dict[str, Any]:
    out = dict(args)
    out["request_id"] = r.req_id()
    out["timestamp"] = r.now()
    keys = list(out)
    r.rng.shuffle(keys)
    return {k: out[k] for k in keys}


@loop("oscillation", "oscillation_2_actions", "support-bot", "order_lookup", "gpt-4o")
def loop_oscillate_search_get(r: Run) -> None:
    """search_orders and get_order alternate five times with unchanged results (A-B-A-B...)."""
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
    _oscillate(
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


@loop("oscillation", "oscillation_3_actions", "code-fixer", "coding", "claude-sonnet-4-5")
def loop_oscillate_three_files(r: Run) -> None:
    """Coding agent cycles list_dir -> read_file -> grep over the same auth module 4 times."""
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
    _oscillate(
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


@loop("oscillation", "oscillation_2_actions_noise", "research-assistant", "research", "deepseek-chat")
def loop_oscillate_web_noise(r: Run) -> None:
    """web_search <-> http_get alternate with fresh request_id/timestamp and shuffled keys every call."""
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
    _oscillate(
        r,
        [
            ("web_search", {"query": "Ariane 64 GTO payload capacity", "num_results": 5}, search),
            ("http_get", {"url": "https://en.wikipedia.org/wiki/Ariane_6"}, page),
        ],
        cycles=5,
        noisy=True,
    )
    r.finish("truncated", terminated_by="loop")


@loop("oscillation", "oscillation_3_actions", "billing-assistant", "billing", "llama-3.1-70b-instruct")
def loop_oscillate_abc_invoices(r: Run) -> None:
    """get_customer -> list_invoices -> get_invoice repeated 4 full cycles, nothing changes."""
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
    _oscillate(
        r,
        [
            ("get_customer", {"customer_id": "C-6021"}, cust),
            ("list_invoices", {"customer_id": "C-6021", "month": "2026-02"}, invs),
            ("get_invoice", {"invoice_id": "INV-2026-0211"}, inv),
        ],
        cycles=4,
    )
    r.finish("abandoned", terminated_by="user")


@loop("oscillation", "oscillation_2_actions", "scheduler", "scheduling", "gpt-4.1-mini")
def loop_oscillate_calendar(r: Run) -> None:
    """Meeting scheduler alternates check_availability and list_rooms for the same slot; no free room."""
    r.user("Book a room for 8 people on April 14 at 10:00 with Ana, Bo and Chen.")
    avail = {"date": "2026-04-14", "slot": "10:00-11:00", "all_free": True, "conflicts": []}
    rooms = {
        "building": "HQ",
        "rooms": [
            {"room": "Fjord", "capacity": 8, "free": False},
            {"room": "Delta", "capacity": 10, "free": False},
        ],
    }
    _oscillate(
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
