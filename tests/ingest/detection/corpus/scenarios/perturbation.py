"""Loops: parameter perturbation — nearly-equal calls (offsets, spelling, flags) without new information."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.ingest.detection.corpus.builder import FUZZY_SLACK, Run, loop


def _perturb(
    r: Run,
    tool: str,
    variants: list[dict[str, Any]],
    result: Any | Callable[[dict[str, Any]], Any],
    *,
    texts: dict[int, str] | None = None,
) -> None:
    """Call the tool with each variant in turn (`result` may be a function of the args); the label
    point is the 3rd nearly-equal call + FUZZY_SLACK. `texts` number the calls from 1.
    """
    actions = [(tool, args, result(args) if callable(result) else result) for args in variants]
    r.steps(actions, label_at=3 + FUZZY_SLACK, texts=texts)


@loop("perturbation", "perturb_offset_jitter", "oncall-helper", "incident_triage", "gpt-4o")
def loop_perturb_offset_jitter(r: Run) -> None:
    """After paging to the end (43 hits), the agent jitters offset 40/41/39/42 and only gets hits it has
    already seen.
    """
    r.user(
        "Find every checkout timeout in the logs from the last hour and tell me which upstream caused them."
    )
    hits = [
        {
            "ts": f"2026-03-09T10:{10 + k // 3:02d}:{(k * 7) % 60:02d}Z",
            "service": "checkout",
            "msg": f"upstream timeout after 5000ms (upstream={['payments', 'inventory', 'pricing'][k % 3]})",
        }
        for k in range(43)
    ]

    def page(args: dict) -> dict:
        off = args["offset"]
        return {"total": 43, "offset": off, "limit": 20, "hits": hits[off : off + 20]}

    for off in (0, 20):
        args = {"service": "checkout", "query": "timeout", "since": "1h", "offset": off, "limit": 20}
        r.step("search_logs", args, page(args), text="Reading the next page of log hits." if off else None)
    offsets = [40, 41, 40, 39, 42, 41, 40, 39, 41, 42, 40]
    _perturb(
        r,
        "search_logs",
        [
            {"service": "checkout", "query": "timeout", "since": "1h", "offset": o, "limit": 20}
            for o in offsets
        ],
        page,
        texts={
            2: "There may be more hits; let me adjust the offset.",
            6: "Let me try a slightly different offset.",
        },
    )
    r.finish("truncated", terminated_by="loop")


@loop("perturbation", "perturb_synonyms_spelling", "support-bot", "order_lookup", "claude-sonnet-4-5")
def loop_perturb_synonyms(r: Run) -> None:
    """'cancelled orders' / 'canceled orders' / 'orders that were cancelled' ... all return the same two."""
    r.user("Why did my last order get cancelled? I never cancelled anything. Customer C-7702.")
    res = {
        "orders": [
            {"order_id": "A-60233", "status": "canceled", "reason": "payment_failed"},
            {"order_id": "A-58112", "status": "canceled", "reason": "customer_request"},
        ]
    }
    queries = [
        "cancelled orders",
        "canceled orders",
        "orders that were cancelled",
        "cancelled order",
        "canceled",
        "cancellations",
        "orders cancelled recently",
        "Cancelled Orders",
    ]
    _perturb(
        r,
        "search_orders",
        [{"customer_id": "C-7702", "query": q} for q in queries],
        res,
        texts={2: "Let me search with a different spelling.", 4: "Maybe the search is sensitive to wording."},
    )
    r.finish("abandoned", terminated_by="user")


@loop("perturbation", "perturb_extra_irrelevant_field", "crm-assistant", "crm", "gpt-4.1-mini")
def loop_perturb_extra_field(r: Run) -> None:
    """get_customer re-sent with verbose/include flags the API ignores; the same record every time."""
    r.user("What's the phone number on file for customer C-1188? I need to call them about a delivery.")
    rec = {
        "customer_id": "C-1188",
        "name": "Tomasz Wojcik",
        "email": "t.wojcik@example.pl",
        "phone": None,
        "address": "ul. Dluga 4, Gdansk",
    }
    variants = [
        {"customer_id": "C-1188"},
        {"customer_id": "C-1188", "verbose": True},
        {"customer_id": "C-1188", "include_contacts": True},
        {"customer_id": "C-1188", "verbose": True, "fields": "all"},
        {"verbose": True, "customer_id": "C-1188"},
        {"customer_id": "C-1188", "include_history": False},
        {"customer_id": "C-1188", "verbose": True, "include_contacts": True},
    ]
    _perturb(
        r, "get_customer", variants, rec, texts={2: "The phone field is empty; let me request full details."}
    )
    r.finish("truncated", terminated_by="loop")


@loop("perturbation", "perturb_case_punctuation", "oncall-helper", "incident_triage", "deepseek-chat")
def loop_perturb_case(r: Run) -> None:
    """The same web search retried with only letter case and punctuation changed; same results."""
    r.user("Pods keep restarting with exit code 137. What does that mean and how do I fix it?")
    res = {
        "results": [
            {"title": "Exit code 137 - OOMKilled", "url": "https://kubernetes.example.io/oomkilled"},
            {"title": "Troubleshooting OOMKilled pods", "url": "https://blog.example.dev/oomkilled"},
        ]
    }
    queries = [
        "Kubernetes OOMKilled exit code 137",
        "kubernetes oomkilled exit code 137",
        "KUBERNETES OOMKILLED EXIT CODE 137",
        "Kubernetes OOMKilled exit code 137?",
        "kubernetes OOMKilled Exit Code 137.",
        "Kubernetes oomKilled exit-code 137",
        "kubernetes oomkilled exit code 137!",
    ]
    _perturb(r, "web_search", [{"query": q, "num_results": 10} for q in queries], res)
    r.finish("truncated", terminated_by="loop")


@loop(
    "perturbation", "perturb_mixed_small_changes", "shopping-assistant", "shopping", "llama-3.1-70b-instruct"
)
def loop_perturb_limit_whitespace(r: Run) -> None:
    """Product search nudged by spacing, hyphens, limit 10/11/12 and a default sort; the same 8 hits."""
    r.user("I need a USB-C hub with 4K HDMI and at least 85W passthrough, under 60 euros.")
    res = {
        "total": 8,
        "products": [
            {"sku": f"HUB-{k:03d}", "name": n, "price": p}
            for k, (n, p) in enumerate(
                [
                    ("7-in-1 USB-C Hub 4K", 39.9),
                    ("USB C Dock 4K60", 58.0),
                    ("Slim Hub 4K HDMI", 24.5),
                    ("Travel Hub 100W PD", 33.0),
                    ("8-port Hub", 45.0),
                    ("Hub Pro 4K", 59.0),
                    ("Mini Hub HDMI", 19.9),
                    ("Hub 6-in-1", 29.0),
                ]
            )
        ],
    }
    variants = [
        {"query": "usb-c hub 4k hdmi 85w", "limit": 10},
        {"query": "USB-C hub  4K HDMI 85W", "limit": 10},
        {"query": "usb c hub 4k hdmi 85w", "limit": 11},
        {"query": "usb-c hub 4k hdmi 85 w", "limit": 12},
        {"query": "usb-c hub 4K hdmi 85w", "limit": 10, "sort": "relevance"},
        {"query": " usb-c hub 4k hdmi 85w ", "limit": 10},
        {"query": "usb-c  hub 4k hdmi 85W", "limit": 11},
        {"query": "USB-C Hub 4K HDMI 85w", "limit": 10, "sort": "relevance"},
    ]
    _perturb(r, "search_products", variants, res, texts={2: "Let me refine the search to catch more hubs."})
    r.finish("truncated", terminated_by="loop")
