"""Loops: interval loops — an action that comes back every few calls among calls that bring nothing new."""

from __future__ import annotations

from tests.ingest.detection.corpus.builder import FUZZY_SLACK, Action, Run, loop, order_record


def _interval(
    r: Run, actions: dict[str, Action], order: str, *, stale_return: int, texts: dict[int, str] | None = None
) -> None:
    """Play the actions by letter in `order`.

    `stale_return` is the call (numbered from 1) at which the returning action first comes back with
    only repeated results since its previous occurrence, and for at least the 3rd time; the label
    point is FUZZY_SLACK calls later.
    """
    r.steps([actions[letter] for letter in order], label_at=stale_return + FUZZY_SLACK, texts=texts)


@loop("interval_loop", "interval_search_returns", "research-assistant", "research", "gpt-4o")
def loop_interval_research_search(r: Run) -> None:
    """The same web search comes back every 3-4 calls between re-fetches of the same three pages."""
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
    _interval(
        r,
        actions,
        "SABCSABSCASBCAS",
        stale_return=8,
        texts={5: "I still need the exact revenue figure; let me search again."},
    )
    r.finish("truncated", terminated_by="loop")


@loop("interval_loop", "interval_context_truncation", "code-fixer", "coding", "claude-3-5-haiku")
def loop_interval_file_reread(r: Run) -> None:
    """Context truncation: settings.py is re-read every 3-4 calls among repeated greps/listings."""
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
    _interval(r, actions, "DRGLERGLREGRLEGR", stale_return=9)
    r.finish("truncated", terminated_by="loop")


@loop("interval_loop", "interval_lookup_returns", "support-bot", "order_lookup", "deepseek-chat")
def loop_interval_order_support(r: Run) -> None:
    """Support agent keeps coming back to get_order every 3-4 calls; everything in between repeats too."""
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
    _interval(r, actions, "XOYZOXZYOXYOZXYO", stale_return=9)
    r.finish("abandoned", terminated_by="user")


@loop("interval_loop", "interval_search_returns", "helpdesk", "it_support", "qwen2.5-32b-instruct")
def loop_interval_kb(r: Run) -> None:
    """Helpdesk agent's KB search returns every 3-4 calls among re-reads of the same two articles."""
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
    _interval(r, actions, "KMNKPMNKPMKNPMKNP", stale_return=11)
    r.finish("truncated", terminated_by="loop")
