"""Legitimate: long explorations and parallel batches."""

from __future__ import annotations

import random

from tests.ingest.detection.corpus.builder import Run, ok, order_record

LONG_RUN_BUDGETS = {
    "max_tool_calls": 200,
    "max_rounds": 150,
    "max_tokens": 8_000_000,
    "max_cost_usd": 30.0,
    "max_wall_s": 7200,
}


PACKAGES = {
    "src/ledger": ["accounts", "entries", "journal", "balances", "periods", "closing", "fx", "exports"],
    "src/billing": "invoice tax credit_notes dunning pricing proration coupons statements".split(),
    "src/payments": "gateway webhooks refunds disputes payouts retries mandates tokens".split(),
    "src/api": ["views", "serializers", "permissions", "pagination", "throttling", "errors", "routes"],
    "src/users": ["models", "auth", "sessions", "invites", "roles", "audit"],
    "src/common": ["money", "dates", "ids", "cache", "locks", "events", "settings"],
}


VERBS = (
    "load save compute validate render apply build parse merge close post reverse sync match split".split()
)


def py_source(rng: random.Random, path: str) -> str:
    mod = path.rsplit("/", 1)[1].removesuffix(".py")
    funcs = rng.sample(VERBS, 3)
    body = [
        f'"""{mod.replace("_", " ").capitalize()} for {path.split("/")[1]}."""',
        "",
        "from __future__ import annotations",
        "",
    ]
    for f in funcs:
        body += [
            "",
            f"def {f}_{mod}(obj, *, strict=False):",
            f"    # {rng.randint(2, 40)} lines elided",
            "    ...",
        ]
    return "\n".join(body) + "\n"


@ok("explore_many_files", "code-reviewer", "code_review", "claude-sonnet-4-5", budgets=LONG_RUN_BUDGETS)
def ok_explore_many_files(r: Run) -> None:
    """Code-review agent lists 6 packages, reads 44 different files and greps 6 patterns (56 calls)."""
    r.user(
        "Do an architecture review of the finance monolith: how do ledger, billing and payments depend on "
        "each other?"
    )
    paths = []
    for pkg, mods in PACKAGES.items():
        r.step("list_dir", {"path": pkg}, {"entries": [f"{m}.py" for m in mods] + ["__init__.py"]})
        paths += [f"{pkg}/{m}.py" for m in mods]
    paths = paths[:44]
    for i, p in enumerate(paths):
        r.step(
            "read_file",
            {"path": p},
            {"path": p, "lines": r.rng.randint(40, 400), "content": py_source(r.rng, p)},
            text="Reading the next module." if i % 9 == 0 else None,
        )
        if i % 8 == 7:
            pat = [
                "from src.ledger",
                "from src.billing",
                "from src.payments",
                "import gateway",
                "post_entry",
                "Money(",
            ][i // 8]
            r.step(
                "grep",
                {"pattern": pat, "path": "src"},
                {"matches": [{"path": paths[(i * 3 + j) % len(paths)], "line": 3 + j} for j in range(4)]},
            )
    r.finish(
        "succeeded",
        answer="Ledger is the core; billing posts through ledger.journal; payments depends on "
        "billing only for refunds. Two cycles found: payments<->billing via credit_notes, users<->api.",
    )


@ok("explore_many_greps", "code-fixer", "coding", "gpt-4o", budgets=LONG_RUN_BUDGETS)
def ok_grep_many_patterns(r: Run) -> None:
    """Deprecation sweep: 24 different grep patterns, each with new matches, plus reads of hits."""
    r.user(
        "Find every use of deprecated datetime APIs (utcnow, utcfromtimestamp, naive datetimes) and list them."
    )
    pats = (
        "datetime.utcnow utcfromtimestamp datetime.now() time.mktime pytz.localize tzinfo=None "
        "replace(tzinfo= dateutil.parser strptime( date.today() timezone.utc astimezone() fromtimestamp( "
        "isoformat() timedelta(days calendar.timegm time.time() USE_TZ make_aware make_naive localtime( "
        "utc_offset datetime.min datetime.max"
    ).split()
    files = [f"{pkg}/{m}.py" for pkg, mods in PACKAGES.items() for m in mods]
    for i, p in enumerate(pats):
        hits = [
            {"path": files[(i * 5 + j) % len(files)], "line": 10 + i + j * 7, "text": f"x = {p}"}
            for j in range(1 + i % 3)
        ]
        r.step("grep", {"pattern": p, "path": "src", "fixed_string": True}, {"matches": hits})
        if i % 6 == 5:
            r.step(
                "read_file",
                {"path": hits[0]["path"], "start": max(1, hits[0]["line"] - 10), "lines": 30},
                {"content": py_source(r.rng, hits[0]["path"])},
            )
    r.finish("succeeded", answer="Found 48 uses across 31 files; table attached.")


@ok("parallel_batch_distinct", "travel-planner", "trip_planning", "gpt-4o")
def ok_parallel_weather(r: Run) -> None:
    """One round with get_weather for 5 cities, then one with get_forecast for the same 5."""
    r.user("Which of Porto, Seville, Valencia, Nice or Split is warmest this week?")
    cities = ["Porto", "Seville", "Valencia", "Nice", "Split"]
    r.batch(
        [
            (
                "get_weather",
                {"city": c, "units": "metric"},
                {
                    "city": c,
                    "temp_c": 14 + k * 1.5,
                    "conditions": ["cloudy", "sunny", "sunny", "windy", "sunny"][k],
                },
            )
            for k, c in enumerate(cities)
        ],
        text="Checking the current weather in all five cities.",
    )
    r.batch(
        [
            (
                "get_forecast",
                {"city": c, "days": 7},
                {"city": c, "max_c": [17, 24, 21, 18, 19][k], "rain_days": [4, 0, 1, 2, 1][k]},
            )
            for k, c in enumerate(cities)
        ]
    )
    r.finish("succeeded", answer="Seville: up to 24°C and no rain all week.")


@ok("parallel_same_tool_distinct_ids", "support-bot", "order_lookup", "deepseek-chat")
def ok_parallel_get_orders(r: Run) -> None:
    """get_order for 6 different ids in one round, then get_shipment for the 6 tracking numbers."""
    r.user("Status of all my orders from February please. Customer C-1000.")
    ids = [f"A-{30100 + k * 17}" for k in range(6)]
    r.step("search_orders", {"customer_id": "C-1000", "month": "2026-02"}, {"order_ids": ids})
    r.batch(
        [
            (
                "get_order",
                {"order_id": i},
                order_record(
                    i,
                    "shipped",
                    [("SKU-" + str(k), 1, 10.0 + k)],
                    f"2026-02-1{k}T10:00:00Z",
                    tracking=f"TRK{k}{i[-3:]}",
                ),
            )
            for k, i in enumerate(ids)
        ]
    )
    statuses = "delivered in_transit delivered out_for_delivery delivered in_transit".split()
    r.batch(
        ("get_shipment", {"tracking_number": f"TRK{k}{i[-3:]}"}, {"status": statuses[k]})
        for k, i in enumerate(ids)
    )
    r.finish("succeeded", answer="3 delivered, 2 in transit, 1 out for delivery.")


@ok("parallel_batch_repeated_changing", "oncall-helper", "incident_watch", "claude-3-5-haiku")
def ok_parallel_metrics_rounds(r: Run) -> None:
    """Incident watch: the same 3-metric batch every 30s for 5 rounds; every value changes each round."""
    r.user("Watch checkout for the next few minutes after the rollback and tell me when it's stable.")
    series = {
        "latency_p99_ms": [2400, 1800, 950, 610, 540],
        "error_rate": [0.081, 0.044, 0.012, 0.004, 0.003],
        "rps": [310, 355, 402, 441, 447],
    }
    for k in range(5):
        r.batch(
            [
                (
                    "get_metric",
                    {"service": "checkout", "metric": metric, "window": "1m"},
                    {"value": values[k]},
                )
                for metric, values in series.items()
            ],
            wait=(28, 32) if k else 0.0,
            text="Checking checkout metrics." if k < 4 else None,
        )
    r.finish("succeeded", answer="Checkout is stable: p99 540ms, error rate 0.3%, traffic back to normal.")


@ok("parallel_batch_distinct", "research-assistant", "research", "deepseek-chat")
def ok_research_parallel(r: Run) -> None:
    """Research agent sends 5 rounds of 4 parallel searches with different queries, all new results."""
    r.user("Compare heat pump subsidies in Germany, France, Italy and Spain for 2026.")
    countries = ["Germany", "France", "Italy", "Spain"]
    aspects = [
        "heat pump subsidy 2026",
        "income limits heat pump grant",
        "max amount heat pump grant",
        "application process heat pump subsidy",
        "heat pump subsidy changes 2026",
    ]
    for a, aspect in enumerate(aspects):
        r.batch(
            [
                (
                    "web_search",
                    {"query": f"{c} {aspect}"},
                    {
                        "results": [
                            {
                                "title": f"{c}: {aspect} ({k})",
                                "url": f"https://gov-{c.lower()}.example/{a}/{k}",
                            }
                            for k in range(3)
                        ]
                    },
                )
                for c in countries
            ]
        )
    r.finish("succeeded", answer="Summary table of 2026 subsidies for DE/FR/IT/ES attached.")


@ok("long_research", "research-assistant", "research", "gpt-4o", budgets=LONG_RUN_BUDGETS)
def ok_long_research(r: Run) -> None:
    """64-call research run: varied searches and page fetches, each bringing new facts."""
    r.user(
        "Write a briefing on the European battery supply chain: cell makers, raw materials, recycling, "
        "policy and prices."
    )
    topics = [
        "LFP cell plants Europe",
        "NMC cathode suppliers EU",
        "lithium refining Germany",
        "graphite anode Europe",
        "battery recycling black mass prices",
        "EU Battery Regulation passport",
        "Northvolt restructuring",
        "CATL Hungary plant",
        "ACC gigafactory status",
        "nickel sulphate Finland",
        "manganese supply Europe",
        "sodium-ion Europe pilot",
        "cell prices per kWh 2025",
        "EU critical raw materials act",
        "cobalt sourcing due diligence",
        "battery electrolyte plants EU",
        "separator film production Europe",
        "recycling capacity 2030 EU",
        "Portugal lithium mine",
        "Serbia Jadar project",
        "Spanish gigafactory plans",
        "Italy battery plant cancellation",
        "US IRA impact on EU batteries",
        "battery storage deployment Europe",
        "second-life batteries EU",
        "anode recycling processes",
        "hydrometallurgy vs pyrometallurgy",
        "battery import tariffs EU",
        "energy prices impact cell making",
        "EU battery alliance funding",
        "solid state battery pilots EU",
        "cell chemistry market share 2025",
    ]
    for k, t in enumerate(topics):
        url = f"https://briefs.example.org/{k:02d}-{t.lower().replace(' ', '-')[:40]}"
        r.step(
            "web_search",
            {"query": t, "num_results": 5},
            {
                "results": [
                    {"title": f"{t} — overview", "url": url},
                    {"title": f"{t} — news", "url": url + "/news"},
                ]
            },
            text="Next topic." if k % 10 == 9 else None,
        )
        r.step(
            "http_get",
            {"url": url},
            {"status": 200, "facts": [f"{t}: fact {k}.{j} ({2020 + (k + j) % 6})" for j in range(3)]},
        )
    r.finish("succeeded", answer="Briefing drafted: 7 sections, 96 sourced facts.")


@ok("explore_many_dirs", "repo-mapper", "coding", "qwen2.5-32b-instruct")
def ok_list_dirs_walk(r: Run) -> None:
    """Walks 34 different directories of a monorepo to build an ownership map."""
    r.user("Map which directories in the monorepo have a CODEOWNERS entry and which don't.")
    dirs = [
        f"services/{s}/{sub}"
        for s in ["auth", "billing", "search", "orders", "notify", "media"]
        for sub in ["api", "worker", "migrations", "tests", "docs"]
    ] + ["libs/common", "libs/proto", "tools", "infra"]
    for d in dirs:
        r.step(
            "list_dir",
            {"path": d},
            {
                "entries": [f"{d.rsplit('/', 1)[-1]}_{k}.py" for k in range(3)]
                + (["CODEOWNERS"] if len(d) % 3 == 0 else [])
            },
        )
    r.finish("succeeded", answer="12 of 34 directories have CODEOWNERS; list of the 22 without attached.")


@ok("varied_queries_new_results", "sql-analyst", "analytics", "llama-3.1-70b-instruct")
def ok_sql_exploration(r: Run) -> None:
    """Analyst runs 15 different queries building up a churn analysis; each returns new data."""
    r.user("Why did churn go up in February?")
    queries = [
        (
            "SELECT count(*) FROM subscriptions WHERE canceled_at >= '2026-02-01' AND canceled_at < "
            "'2026-03-01'",
            [[1822]],
        ),
        (
            "SELECT count(*) FROM subscriptions WHERE canceled_at >= '2026-01-01' AND canceled_at < "
            "'2026-02-01'",
            [[1311]],
        ),
    ]
    queries += [
        (
            f"SELECT {dim}, count(*) FROM subscriptions s JOIN customers c ON c.id = s.customer_id WHERE "
            f"canceled_at >= '2026-02-01' GROUP BY {dim} ORDER BY 2 DESC LIMIT 5",
            [[f"{dim}_{k}", 400 - k * 50 - j] for k in range(3)],
        )
        for j, dim in enumerate(
            (
                "plan country acquisition_channel payment_method tenure_bucket support_tickets_bucket "
                "price_change_flag seats_bucket industry cancel_reason last_login_bucket nps_bucket "
                "discount_expired"
            ).split()
        )
    ]
    for sql, rows in queries:
        r.step("sql_query", {"sql": sql, "database": "warehouse"}, {"rows": rows, "row_count": len(rows)})
    r.finish(
        "succeeded",
        answer="February churn rose 39%, concentrated in customers whose launch discount expired in January.",
    )
