"""Loops: declared budgets (tool calls, rounds, cost, tokens, wall clock) overrun."""

from __future__ import annotations

import zlib
from datetime import timedelta

from tests.ingest.detection.corpus.builder import Run, loop


def _overrun(r: Run, *, answer: str | None = None) -> None:
    """Label the point where consumption reaches the run's one declared budget, and end the run there.

    That is the call (`max_tool_calls`, `max_wall_s`: the first call at or after the wall limit) or
    the round (`max_rounds`; `max_tokens`, `max_cost_usd`: cumulative over the rounds) of the limit.
    """
    assert r.scenario.budgets is not None and len(r.scenario.budgets) == 1, r.name
    [(budget_type, limit)] = r.scenario.budgets.items()
    if budget_type == "max_tool_calls":
        r.label_call(limit)
    elif budget_type == "max_rounds":
        r.label_round(limit)
    elif budget_type in ("max_tokens", "max_cost_usd"):
        spent = {rnd: tokens if budget_type == "max_tokens" else cost for rnd, tokens, cost in r.round_totals}
        r.label_round(next(rnd for rnd, total in spent.items() if total >= limit))
    else:
        assert budget_type == "max_wall_s", budget_type
        wall = r.start + timedelta(seconds=limit)
        r.label_call(next(n for n, at in enumerate(r.call_times, 1) if at >= wall))
    r.finish("truncated", terminated_by="budget", budget_type=budget_type, answer=answer)


@loop("budget", "budget_tool_calls", "code-reviewer", "code_review", "gpt-4o", budgets={"max_tool_calls": 20})
def loop_budget_max_tool_calls(r: Run) -> None:
    """Coding agent reads file after file past its declared max_tool_calls=20 (26 calls)."""
    r.user("Review the PR that refactors the payment adapters.")
    files = [
        f"src/payments/adapters/{n}.py"
        for n in (
            "base stripe adyen paypal klarna mollie braintree square worldpay checkout_com gocardless sepa "
            "ideal bancontact giropay sofort eps przelewy24 blik twint mobilepay vipps swish trustly "
            "satispay bizum"
        ).split()
    ]
    for i, f in enumerate(files):
        r.step(
            "read_file",
            {"path": f},
            {
                "path": f,
                "lines": 60 + i * 3,
                "content": f"class {f.rsplit('/', 1)[1].title()}Adapter(BaseAdapter):\n    ...",
            },
        )
    _overrun(r)


@loop(
    "budget", "budget_rounds", "data-cleaner", "data_cleanup", "claude-3-5-haiku", budgets={"max_rounds": 10}
)
def loop_budget_max_rounds(r: Run) -> None:
    """Agent runs 15 model rounds against a declared max_rounds=10."""
    r.user("Find duplicate customer records created in February and list them.")
    for i in range(14):
        r.step(
            "sql_query",
            {
                "sql": f"SELECT a.id, b.id FROM customers a JOIN customers b ON a.email = b.email AND "
                f"a.id < b.id WHERE a.created_at::date = '2026-02-{i + 1:02d}'"
            },
            {"rows": [[40000 + i * 7, 40003 + i * 7]], "row_count": 1},
        )
    _overrun(r, answer="Found 14 duplicate pairs so far (one per day checked).")


@loop(
    "budget",
    "budget_cost",
    "doc-summariser",
    "summarisation",
    "deepseek-chat",
    budgets={"max_cost_usd": 0.03},
    with_cost=True,
)
def loop_budget_max_cost(r: Run) -> None:
    """A long-context summarisation burns past max_cost_usd=0.03 (cost_usd on every round)."""
    r.user("Summarise all 30 chapters of the 2025 annual report.")
    r.ctx = 9000
    for ch in range(1, 21):
        r.step(
            "read_file",
            {"path": f"reports/annual-2025/chapter-{ch:02d}.md"},
            {
                "path": f"reports/annual-2025/chapter-{ch:02d}.md",
                "lines": 400,
                "content": f"# Chapter {ch}\n" + ("Revenue grew in all regions. " * 220),
            },
        )
    _overrun(r)


@loop(
    "budget",
    "budget_tokens",
    "log-analyst",
    "log_analysis",
    "llama-3.1-70b-instruct",
    budgets={"max_tokens": 150000},
)
def loop_budget_max_tokens(r: Run) -> None:
    """A local model re-reads large logs until cumulative tokens pass max_tokens=150000."""
    r.user("Why did the nightly batch fail? Look at the worker logs.")
    for h in range(14):
        r.step(
            "read_file",
            {"path": f"/var/log/worker/nightly-2026-03-10T{h:02d}.log"},
            {
                "lines": 2000,
                "content": f"[{h:02d}:00:01] INFO batch step {h} started\n" + ("DEBUG tick\n" * 900),
            },
        )
    _overrun(r)


@loop("budget", "budget_wall_clock", "site-auditor", "crawl", "gpt-4.1-mini", budgets={"max_wall_s": 600})
def loop_budget_max_wall(r: Run) -> None:
    """Slow crawler keeps going past max_wall_s=600 (about 15 minutes in total)."""
    r.user("Check every page of docs.example.org for broken links.")
    for k in range(18):
        r.step(
            "http_get",
            {"url": f"https://docs.example.org/guide/section-{k + 1}"},
            {"status": 200, "links": 30 + k, "broken": [f"/old/page-{k}"] if k % 5 == 0 else []},
            latency=r.rng.uniform(40, 55),
        )
    _overrun(r)


@loop(
    "budget",
    "budget_tool_calls_parallel",
    "portfolio-bot",
    "portfolio",
    "deepseek-chat",
    budgets={"max_tool_calls": 30},
)
def loop_budget_tool_calls_parallel(r: Run) -> None:
    """Parallel batches of 6 quote lookups overrun max_tool_calls=30 (36 calls, the 30th mid-batch)."""
    r.user("Give me today's prices for every ticker in my watchlist.")
    tickers = (
        "AAPL MSFT NVDA AMZN GOOGL META ASML SAP NESN NOVO-B MC OR TTE SIE ALV AIR SAN BNP ENEL ISP IBE DTE "
        "BAS BAYN VOW3 BMW MBG RMS KER ADS ABI INGA PHIA HEIA DSY SU"
    ).split()
    for b in range(6):
        group = tickers[b * 6 : (b + 1) * 6]
        r.batch(
            [
                (
                    "get_stock_price",
                    {"symbol": t},
                    {"symbol": t, "price": round(20 + (zlib.crc32(t.encode()) % 50000) / 100, 2)},
                )
                for t in group
            ]
        )
    _overrun(r)
