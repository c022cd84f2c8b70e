"""Loops: no progress — different-looking calls whose results bring nothing new."""

from __future__ import annotations

from tests.ingest.detection.corpus.builder import FUZZY_SLACK, NO_PROGRESS_K, Action, Run, loop


def _stall(r: Run, calls: list[Action], *, texts: dict[int, str] | None = None) -> None:
    """Different-looking calls whose results bring nothing new; the label point is the K-th call of
    the stall + FUZZY_SLACK. `texts` number the calls from 1.
    """
    r.steps(calls, label_at=NO_PROGRESS_K + FUZZY_SLACK, texts=texts)


@loop("no_progress", "no_progress_varied_queries", "helpdesk", "it_support", "gpt-4o")
def loop_no_progress_kb_queries(r: Run) -> None:
    """Helpdesk agent tries 24 differently worded KB/ticket searches that keep returning what it has already
    read.
    """
    r.user("Outlook on my Mac keeps asking for my password every few minutes. How do I stop it?")
    arts = {
        "articles": [
            {"id": "KB-311", "title": "Outlook password prompts (Windows)"},
            {"id": "KB-318", "title": "Reset your network password"},
        ]
    }
    r.step("search_kb", {"query": "outlook keeps asking for password"}, arts)
    r.step(
        "get_article",
        {"id": "KB-311"},
        {"id": "KB-311", "body": "On Windows, clear Credential Manager entries for Outlook, then restart."},
    )
    r.step("get_article", {"id": "KB-318"}, {"id": "KB-318", "body": "Use https://pw.corp.example to reset."})
    tickets = {"tickets": [{"id": "T-4411", "title": "Outlook password loop", "resolution": "see KB-311"}]}
    r.step("search_tickets", {"query": "outlook password prompt"}, tickets)
    kb_queries = [
        "outlook mac password prompt",
        "outlook macOS repeated login",
        "mac mail credentials keychain",
        "outlook for mac authentication loop",
        "exchange password prompt mac",
        "keychain outlook reset",
        "modern authentication outlook mac",
        "outlook asks for credentials repeatedly",
        "office 365 mac sign in loop",
        "outlook profile reset mac",
        "macos keychain access outlook",
        "password prompt every few minutes",
    ]
    ticket_queries = [
        "mac outlook password",
        "keychain outlook",
        "outlook login loop mac",
        "o365 prompt mac",
        "outlook credentials macOS",
        "exchange auth mac",
        "outlook sign-in mac",
        "password popup mac",
        "outlook keeps prompting",
        "outlook mac 16.8 password",
        "mac mail password prompt",
        "outlook repeated authentication",
    ]
    calls: list[Action] = []
    for kq, tq in zip(kb_queries, ticket_queries, strict=True):
        calls.append(("search_kb", {"query": kq}, arts))
        calls.append(("search_tickets", {"query": tq}, tickets))
    _stall(
        r,
        calls,
        texts={
            1: "Those articles are for Windows. Let me search for the Mac-specific fix.",
            9: "Let me try different wording.",
        },
    )
    r.finish("abandoned", terminated_by="user")


@loop("no_progress", "no_progress_empty_searches", "code-fixer", "coding", "claude-sonnet-4-5")
def loop_no_progress_empty_greps(r: Run) -> None:
    """Coding agent greps 24 different patterns/paths for a symbol that doesn't exist; no matches ever."""
    r.user("Where do we compute the loyalty discount? Customers say it's applied twice.")
    r.step("list_dir", {"path": "src"}, {"entries": ["billing", "cart", "catalog", "users", "promotions"]})
    r.step(
        "grep",
        {"pattern": "discount", "path": "src/cart"},
        {"matches": [{"path": "src/cart/totals.py", "line": 33, "text": "total -= promotions.apply(cart)"}]},
    )
    patterns = (
        "loyalty_discount LoyaltyDiscount loyalty apply_loyalty LOYALTY_RATE tier_discount member_discount "
        "points_discount discount_pct loyalty_tier LoyaltyRule get_loyalty"
    ).split()
    paths = ["src", "src/promotions", "src/billing", "src/users"]
    calls = [
        ("grep", {"pattern": p, "path": paths[i % 4], "ignore_case": i % 2 == 0}, {"matches": []})
        for i, p in enumerate(patterns)
    ]
    calls += [
        ("find_files", {"glob": g}, {"files": []})
        for g in (
            "**/*loyal* **/*tier*.py **/discount*.py src/**/rules_*.py **/*member* **/*points* **/*reward* "
            "**/*bonus*.py **/*perk* **/*vip* **/*club* **/*promo_*.py"
        ).split()
    ]
    r.rng.shuffle(calls)
    _stall(r, calls, texts={1: "The discount must be computed in a loyalty module; let me find it."})
    r.finish("truncated", terminated_by="loop")


@loop("no_progress", "no_progress_same_block_page", "price-watcher", "scraping", "deepseek-chat")
def loop_no_progress_blocked_scrape(r: Run) -> None:
    """Price scraper fetches 22 different product URLs of one shop and gets the same captcha page."""
    r.user("Get the current prices of our 5 competitors' espresso machines.")
    r.step(
        "http_get",
        {"url": "https://shop-a.example/espresso/barista-pro"},
        {"status": 200, "title": "Barista Pro", "price": 649.0},
    )
    r.step(
        "http_get",
        {"url": "https://shop-b.example/p/ec-685"},
        {"status": 200, "title": "EC 685", "price": 179.0},
    )
    captcha = {
        "status": 200,
        "title": "Just a moment...",
        "text": "Please verify you are a human. Enable JavaScript and cookies to continue.",
    }
    slugs = (
        "magnifica-s dedica-style la-specialista primadonna eletta-explore rivelia stilosa magnifica-evo "
        "dinamica-plus perfecto maestosa icona-vintage scultura autentica caffe-corso lattissima gran-dama "
        "clessidra specialista-arte distinta brillante avvolta"
    ).split()
    calls = [
        (
            "http_get",
            {"url": f"https://shop-c.example/products/{s}", "headers": {"Accept-Language": "de-DE"}},
            captcha,
        )
        for s in slugs
    ]
    _stall(r, calls, texts={1: "Next, the third shop.", 6: "Let me try other product pages on this shop."})
    r.finish("truncated", terminated_by="loop")


@loop("no_progress", "no_progress_zero_rows", "sql-analyst", "analytics", "llama-3.1-70b-instruct")
def loop_no_progress_sql_variants(r: Run) -> None:
    """Analyst agent rewrites its query 22 ways looking for a customer that isn't there; 0 rows each."""
    r.user("What did the customer 'Brightwave GmbH' spend in 2025?")
    r.step("sql_query", {"sql": "SELECT count(*) FROM customers"}, {"rows": [[48211]], "row_count": 1})
    empty = {"rows": [], "row_count": 0}
    names = [
        "Brightwave GmbH",
        "Brightwave",
        "BrightWave GmbH",
        "Bright Wave GmbH",
        "brightwave gmbh",
        "Brightwave AG",
        "Brightwave%",
        "%wave GmbH",
        "%Brightwave%",
        "BRIGHTWAVE",
        "Brightwave Gmbh.",
        "Brightwave-GmbH",
    ]
    calls = []
    for i, n in enumerate(names):
        op = "ILIKE" if "%" in n or i % 3 == 0 else "="
        calls.append(("sql_query", {"sql": f"SELECT id, name FROM customers WHERE name {op} '{n}'"}, empty))
        calls.append(
            (
                "sql_query",
                {
                    "sql": f"SELECT sum(total) FROM orders o JOIN customers c ON c.id = "
                    f"o.customer_id WHERE c.name {op} '{n}' AND o.year = 2025"
                },
                {"rows": [[None]], "row_count": 1},
            )
        )
    calls = calls[:22]
    _stall(r, calls, texts={1: "Let me find the customer id first."})
    r.finish("truncated", terminated_by="loop")
