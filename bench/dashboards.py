"""Server time of the overview page and of the live alerts page on a week of production-sized data.

    .venv/bin/python bench/dashboards.py [--runs 50000] [--calls 1000000] [--repeat 5]
        [--database-url postgres://postgres@127.0.0.1:5432/loopwatch_bench_dash] [--regenerate] [--no-rollup]
        [--alert-latency [ARGS]]

1. Creates the bench database if missing (its name must contain "bench") and migrates it.
2. Unless it already holds data of the same shape (a row in bench_dash_meta), generates it, straight
   into the tables the pages read: --runs runs (plus --other-runs of a second tenant the user is not a
   member of) spread over the last 7 days, over 6 (backend, model) pairs, 5 task types with their own
   long tails, 4 agents; --calls tool calls in all and their model rounds (generate_series in
   PostgreSQL), loop detections with actions and operator feedback, the ledger's write operations
   with some still UNKNOWN. Runs go in with one COPY, the rest with INSERT ... SELECT on the server.
   Raw events are not generated: no page reads them. Data generated earlier is moved forward in time
   (runs, detections, operations) so that "the last hour" holds what it held when generated.
3. Builds the overview's hourly rollup of every closed hour again (`manage.py overview_rollup
   --rebuild`, what the beat task keeps up to date), timed, then ANALYZE of its tables; with
   --no-rollup deletes it instead, and the pages read every hour live (the figures before it).
4. Runs Django in this process (DEBUG off) and times each page with the test client, signed in as a
   member of the bench tenant: a warm-up request, then --repeat requests; prints the median, the
   slowest, and the median count and time of the SQL queries, against the target (300 ms).
5. --alert-latency runs bench/alert_latency.py (alert latency from ingest to a browser) after, with
   the arguments given, when that script exists.

Exits 0 (the figures are for reading), 2 on a setup error.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import orjson
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 300.0
TENANT, OTHER_TENANT = "bench-dash", "bench-dash-other"
USERNAME = "bench-dash"
ALERT_LATENCY = ROOT / "bench" / "alert_latency.py"

# (backend, model, cost of a round in USD, share of runs)
BACKENDS = (
    ("openai", "gpt-4o", 0.012, 0.30),
    ("openai", "gpt-4o-mini", 0.0015, 0.15),
    ("anthropic", "claude-sonnet-4", 0.015, 0.25),
    ("anthropic", "claude-haiku-4", 0.002, 0.10),
    ("deepseek", "deepseek-chat", 0.0013, 0.12),  # through an aggregator: the price already marked up
    ("local", "llama-3.1-70b", 0.0, 0.08),
)
# (task type, share, rounds: lognormal mu and sigma, cap)
TASKS = (
    ("faq", 0.30, 0.5, 0.4, 3),
    ("order_lookup", 0.25, 1.3, 0.5, 12),
    ("refund", 0.15, 1.7, 0.5, 25),
    ("triage", 0.18, 1.9, 0.6, 40),
    ("research", 0.12, 2.8, 0.7, 150),
)
AGENTS = ("shop-assistant", "support-triage", "billing-bot", "research-agent")
BUDGET_TYPES = ("max_tool_calls", "max_rounds", "max_cost_usd", "max_wall_s", "max_tokens")
LOOP_KINDS = (
    ("exact_repeat", 0.30),
    ("oscillation", 0.10),
    ("interval_loop", 0.08),
    ("perturbation", 0.12),
    ("repeated_error", 0.15),
    ("no_progress", 0.12),
    ("clarification", 0.05),
    ("poll_budget", 0.04),
    ("budget", 0.04),
)
TOOLS = ("search_orders", "get_order", "query_db", "http_get", "poll_job", "update_ticket", "send_email")


class SetupError(Exception):
    pass


# --- the database -------------------------------------------------------------------------------


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def ensure_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    if "bench" not in name:
        raise SetupError(f"--database-url: the database name must contain 'bench' (got {name!r})")
    with psycopg.connect(_with_db(url, "postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created database {name}")


def django_env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        DEBUG="false",
        SECRET_KEY="bench-" + secrets.token_hex(24),
        LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="loopwatch.settings",
    )
    env.pop("REDIS_URL", None)  # pages only read; nothing is queued or published
    return env


def migrate(env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode:
        raise SetupError(f"migrate failed:\n{proc.stdout}\n{proc.stderr}")


# --- data ---------------------------------------------------------------------------------------


def _runs(rng: random.Random, n: int, calls: int, now: datetime, prefix: str) -> list[dict]:
    """n runs whose tool calls add up to `calls` exactly."""
    runs = []
    for i in range(n):
        backend, model, round_cost, _ = rng.choices(BACKENDS, weights=[b[3] for b in BACKENDS])[0]
        task, _, mu, sigma, cap = rng.choices(TASKS, weights=[t[1] for t in TASKS])[0]
        rounds = max(1, min(cap, round(rng.lognormvariate(mu, sigma))))
        if rng.random() < 0.015:  # the long tail: runs that went on and on
            rounds = rng.randint(cap, cap * 4)
        runs.append(
            {
                "run_id": f"{prefix}-{i:06d}",
                "backend": backend,
                "model": model,
                "round_cost": round_cost,
                "task_type": task,
                "agent": rng.choice(AGENTS),
                "rounds": rounds,
                "started_at": now - timedelta(seconds=rng.uniform(0, 7 * 86400)),
            }
        )
    # Tool calls in proportion to the rounds (one to three a round), then nudged to the exact total.
    weights = [r["rounds"] * rng.uniform(1.0, 3.0) for r in runs]
    scale = calls / sum(weights)
    counts = [max(1, int(w * scale)) for w in weights]
    short = calls - sum(counts)
    order = list(range(n))
    while short:
        rng.shuffle(order)
        for index in order:
            if not short:
                break
            if short > 0:
                counts[index] += 1
                short -= 1
            elif counts[index] > 1:
                counts[index] -= 1
                short += 1
    for run, count in zip(runs, counts, strict=True):
        run["tool_calls"] = count
    return runs


def _finish(rng: random.Random, run: dict, now: datetime) -> None:
    rounds, calls = run["rounds"], run["tool_calls"]
    duration = timedelta(seconds=rounds * rng.uniform(2, 12))
    run["last_event_at"] = min(now, run["started_at"] + duration)
    run["events_count"] = 2 + rounds + 2 * calls
    run["cost_usd"] = rounds * run["round_cost"] * rng.uniform(0.6, 1.6)
    run["input_tokens"] = rounds * rng.randint(800, 6000)
    run["output_tokens"] = rounds * rng.randint(50, 600)
    run["tool_errors"] = sum(rng.random() < 0.04 for _ in range(min(calls, 50)))
    run["terminated_by"] = run["budget_type"] = run["reason"] = ""
    run["finished_at"] = run["last_event_at"]
    still_open = run["started_at"] + duration > now
    draw = rng.random()
    looped = rng.random() < (0.35 if run["task_type"] == "research" else 0.12)
    if still_open:
        run["status"], run["finished_at"] = "running", None
    elif draw < 0.03:
        run["status"], run["finished_at"] = "waiting", None
    elif draw < 0.05:
        run["status"] = "abandoned"
    elif draw < (0.20 if looped else 0.09):
        run["status"], run["terminated_by"] = "truncated", "budget"
        run["budget_type"] = rng.choices(BUDGET_TYPES, weights=(5, 3, 2, 1, 1))[0]
        run["reason"] = f"{run['budget_type']} exhausted"
    elif draw < 0.30 if looped else draw < 0.15:
        run["status"] = "failed"
    else:
        run["status"] = "succeeded"
    run["loop"] = looped
    if looped:
        at = rng.uniform(0.2, 0.8)
        run["first_loop_seq"] = max(2, int(run["events_count"] * at))
        run["first_loop_at"] = run["started_at"] + duration * at
        run["cost_after_loop_usd"] = run["cost_usd"] * (1 - at)
    else:
        run["first_loop_seq"] = run["first_loop_at"] = None
        run["cost_after_loop_usd"] = 0.0


def _detections(rng: random.Random, run: dict) -> list[dict]:
    """A looping run: the signal observed, then corrected, sometimes handed off or terminated."""
    found = []
    if run["loop"]:
        kind = rng.choices([k for k, _ in LOOP_KINDS], weights=[w for _, w in LOOP_KINDS])[0]
        steps = ["observe", "correct"]
        if rng.random() < 0.35:
            steps.append("handoff")
        if run["terminated_by"] == "budget" or rng.random() < 0.15:
            steps.append("terminate")
        seq, ts = run["first_loop_seq"] - 1, run["first_loop_at"] - timedelta(seconds=3)
        for action in steps:
            feedback = ""
            if action != "observe" and rng.random() < 0.25:
                feedback = "false_alarm" if rng.random() < 0.12 else "true_loop"
            found.append({"seq": seq, "kind": kind, "action": action, "ts": ts, "feedback": feedback})
            seq, ts = seq + rng.randint(3, 12), ts + timedelta(seconds=rng.uniform(5, 40))
    elif rng.random() < 0.15:  # a repeat noticed and let go (legitimate polling, paging, a retry)
        seq = rng.randint(2, run["events_count"])
        found.append({"seq": seq, "kind": "exact_repeat", "action": "observe", "ts": run["started_at"]})
    for item in found:
        item["ts"] = min(item["ts"], run["last_event_at"])
        item.setdefault("feedback", "")
    return found


def generate(url: str, *, runs: int, other_runs: int, calls: int, seed: int) -> None:
    rng = random.Random(seed)
    now = datetime.now(UTC)
    started = time.perf_counter()
    main_runs = _runs(rng, runs, calls, now, "r")
    other = _runs(rng, other_runs, max(other_runs, calls * other_runs // max(runs, 1)), now, "o")
    with psycopg.connect(url) as conn:
        conn.execute(
            "TRUNCATE ingest_run, ingest_detection, ingest_toolcall, ingest_modelround, ingest_operation, "
            "ingest_runcursor, ingest_event, ingest_pendingresult RESTART IDENTITY CASCADE"
        )
        conn.execute("DROP TABLE IF EXISTS bench_dash_meta")
        tenants = {}
        for slug in (TENANT, OTHER_TENANT):
            row = conn.execute(
                "INSERT INTO ingest_tenant (slug, name, created_at) VALUES (%s, %s, now()) "
                "ON CONFLICT (slug) DO UPDATE SET name = EXCLUDED.name RETURNING id",
                (slug, slug),
            ).fetchone()
            tenants[slug] = row[0]
        run_columns = (
            "id, tenant_id, run_id, agent, task_type, backend, model, budgets, labels, status, terminated_by, "
            "budget_type, reason, started_at, finished_at, last_event_at, rounds, tool_calls, tool_errors, "
            "input_tokens, output_tokens, cost_usd, events_count, loop_flagged, first_loop_at, "
            "first_loop_seq, cost_after_loop_usd, max_action, last_progress_step, detections_count, "
            "handoff, created_at"
        )
        detection_columns = (
            "tenant_id, run_id, seq, kind, action, signature, tool, count, at_call, at_round, backend, "
            "model, task_type, agent, evidence, hint, ts, created_at, feedback, feedback_note, feedback_at"
        )
        detections = []
        pk = 0
        with conn.cursor() as cur, cur.copy(f"COPY ingest_run ({run_columns}) FROM STDIN") as copy:
            for slug, batch in ((TENANT, main_runs), (OTHER_TENANT, other)):
                for run in batch:
                    pk += 1
                    _finish(rng, run, now)
                    found = _detections(rng, run)
                    levels = ["observe", "correct", "handoff", "terminate"]
                    max_action = max((levels.index(d["action"]) for d in found), default=-1)
                    for d in found:
                        detections.append((tenants[slug], pk, run, d))
                    copy.write_row(
                        (
                            pk,
                            tenants[slug],
                            run["run_id"],
                            run["agent"],
                            run["task_type"],
                            run["backend"],
                            run["model"],
                            "{}",
                            "{}",
                            run["status"],
                            run["terminated_by"],
                            run["budget_type"],
                            run["reason"],
                            run["started_at"],
                            run["finished_at"],
                            run["last_event_at"],
                            run["rounds"],
                            run["tool_calls"],
                            run["tool_errors"],
                            run["input_tokens"],
                            run["output_tokens"],
                            run["cost_usd"],
                            run["events_count"],
                            run["loop"],
                            run["first_loop_at"],
                            run["first_loop_seq"],
                            run["cost_after_loop_usd"],
                            levels[max_action] if max_action >= 0 else "",
                            max(0, run["events_count"] - rng.randint(0, 30)),
                            len(found),
                            None,
                            run["started_at"],
                        )
                    )
        conn.execute("SELECT setval(pg_get_serial_sequence('ingest_run', 'id'), %s)", (pk,))
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY ingest_detection ({detection_columns}) FROM STDIN") as copy,
        ):
            for count, (tenant_id, run_pk, run, d) in enumerate(detections):
                tool = rng.choice(TOOLS)
                copy.write_row(
                    (
                        tenant_id,
                        run_pk,
                        d["seq"],
                        d["kind"],
                        d["action"],
                        f"{count:064x}"[-64:] if d["action"] != "observe" else f"s{run_pk:063x}",
                        tool,
                        3,
                        d["seq"] // 3,
                        d["seq"] // 6,
                        run["backend"],
                        run["model"],
                        run["task_type"],
                        run["agent"],
                        orjson.dumps({"tool": tool, "count": 3}).decode(),
                        f"{tool} called 3 times with the same arguments and the same result.",
                        d["ts"],
                        d["ts"] + timedelta(milliseconds=rng.uniform(20, 400)),
                        d["feedback"],
                        "",
                        d["ts"] + timedelta(minutes=5) if d["feedback"] else None,
                    )
                )
        print(f"  runs and detections: {time.perf_counter() - started:.1f} s", flush=True)
        # Tool calls, their rounds and the cursors, on the server: a call every third seq after seq 1.
        conn.execute(
            """
            INSERT INTO ingest_toolcall (run_id, seq, round, call_id, tool, kind, args, step_id,
                operation_key, ts, result_seq, result_status, result, result_truncated, result_sha256,
                error_class, latency_ms, external_request_id, result_ts)
            SELECT r.id, 2 + r.rounds + 2 * g, 1 + (g - 1) * r.rounds / r.tool_calls, 'c' || g,
                t.tool, t.kind, jsonb_build_object('q', r.id % 97, 'page', g % 5), '',
                CASE WHEN t.kind = 'write' THEN r.run_id || ':' || g ELSE '' END,
                r.started_at + (r.last_event_at - r.started_at) * g / (r.tool_calls + 1),
                3 + r.rounds + 2 * g, CASE WHEN (r.id + g) % 25 = 0 THEN 'error' ELSE 'ok' END,
                '{"rows": 3}'::jsonb, false, '',
                CASE WHEN (r.id + g) % 25 = 0 THEN 'transient' ELSE '' END,
                50 + (r.id * 7 + g * 13) % 900, '',
                r.started_at + (r.last_event_at - r.started_at) * g / (r.tool_calls + 1)
            FROM ingest_run r
            CROSS JOIN LATERAL generate_series(1, r.tool_calls) AS g
            CROSS JOIN LATERAL (
                SELECT (ARRAY['search_orders', 'get_order', 'query_db', 'http_get', 'poll_job',
                              'search_orders', 'get_order', 'query_db', 'update_ticket', 'send_email'
                       ])[1 + (r.id * 31 + g * 17) % 10] AS tool
            ) AS n
            CROSS JOIN LATERAL (
                SELECT n.tool, CASE WHEN n.tool IN ('update_ticket', 'send_email') THEN 'write'
                                    WHEN n.tool = 'poll_job' THEN 'poll' ELSE 'read' END AS kind
            ) AS t
            """
        )
        print(f"  tool calls: {time.perf_counter() - started:.1f} s", flush=True)
        conn.execute(
            """
            INSERT INTO ingest_modelround (run_id, seq, round, ts, input_tokens, output_tokens, cost_usd,
                cost_computed, text)
            SELECT r.id, 1 + g, g, r.started_at + (r.last_event_at - r.started_at) * g / (r.rounds + 1),
                r.input_tokens / r.rounds, r.output_tokens / r.rounds, r.cost_usd / r.rounds, true, ''
            FROM ingest_run r CROSS JOIN LATERAL generate_series(1, r.rounds) AS g
            """
        )
        conn.execute(
            "INSERT INTO ingest_runcursor (run_id, position, processed, engine_state, updated_at, failures, error) "
            "SELECT id, events_count, events_count, NULL, last_event_at, 0, '' FROM ingest_run"
        )
        # The ledger: every traced write is an operation; 1 in 150 is still UNKNOWN (timed out).
        conn.execute(
            """
            INSERT INTO ingest_operation (tenant_id, operation_key, tool, fingerprint, args, status,
                lease_owner, attempts, external_request_id, result_json, result_digest, error_class,
                source, run_id, call_id, step_id, executions, needs_person, reconcile_attempts,
                next_reconcile_at, unknown_since, created_at, updated_at, attempt_id, unverified)
            SELECT r.tenant_id, c.operation_key, c.tool, md5(c.operation_key) || md5(c.tool),
                c.args, CASE WHEN c.id % 150 = 0 THEN 'UNKNOWN' ELSE 'SUCCEEDED' END, '', 1, '',
                CASE WHEN c.id % 150 = 0 THEN NULL ELSE '{"ok": true}' END, '', '', 'trace', r.id,
                c.call_id, '', 1, c.id % 600 = 0, c.id % 7,
                CASE WHEN c.id % 150 = 0 THEN c.ts + interval '15 minutes' END,
                CASE WHEN c.id % 150 = 0 THEN c.ts END, c.ts, c.ts, '', false
            FROM ingest_toolcall c JOIN ingest_run r ON r.id = c.run_id
            WHERE c.kind = 'write'
            """
        )
        conn.execute("CREATE TABLE bench_dash_meta (shape text, generated_at timestamptz)")
        conn.execute(
            "INSERT INTO bench_dash_meta VALUES (%s, %s)", (_shape(runs, other_runs, calls, seed), now)
        )
    print(f"  generated in {time.perf_counter() - started:.1f} s", flush=True)


def _shape(runs: int, other_runs: int, calls: int, seed: int) -> str:
    return f"runs={runs} other={other_runs} calls={calls} seed={seed} v2"


def stored_shape(url: str) -> tuple[str, datetime] | None:
    with psycopg.connect(url) as conn:
        exists = conn.execute("SELECT to_regclass('bench_dash_meta')").fetchone()[0]
        if exists is None:
            return None
        return conn.execute("SELECT shape, generated_at FROM bench_dash_meta").fetchone()


def move_forward(url: str, generated_at: datetime) -> None:
    """Keep "the last hour" as it was when generated: shift the times the pages read."""
    shift = datetime.now(UTC) - generated_at
    if shift < timedelta(minutes=5):
        return
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE ingest_run SET started_at = started_at + %(s)s, finished_at = finished_at + %(s)s, "
            "last_event_at = last_event_at + %(s)s, first_loop_at = first_loop_at + %(s)s, "
            "created_at = created_at + %(s)s",
            {"s": shift},
        )
        conn.execute(
            "UPDATE ingest_detection SET ts = ts + %(s)s, created_at = created_at + %(s)s, "
            "feedback_at = feedback_at + %(s)s",
            {"s": shift},
        )
        conn.execute(
            "UPDATE ingest_operation SET unknown_since = unknown_since + %(s)s, "
            "created_at = created_at + %(s)s, updated_at = updated_at + %(s)s WHERE status = 'UNKNOWN'",
            {"s": shift},
        )
        conn.execute("UPDATE bench_dash_meta SET generated_at = generated_at + %s", (shift,))
    print(f"moved the data {shift} forward in {time.perf_counter() - started:.1f} s")


def rollup(env: dict[str, str], url: str, *, build: bool = True) -> None:
    """The overview's hourly rollup, built from scratch (moved or new data): the pages read it.
    build=False: deleted, so that the pages read every hour live (the figures before the rollup)."""
    began = time.perf_counter()
    command = ["overview_rollup", "--rebuild"] if build else ["shell", "-c", _CLEAR]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise SetupError(f"overview_rollup failed:\n{proc.stdout}\n{proc.stderr}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE dashboards_rolluphour, dashboards_runrollup, dashboards_detectionrollup")
        rows = conn.execute(
            "SELECT (SELECT count(*) FROM dashboards_runrollup), (SELECT count(*) FROM dashboards_detectionrollup)"
        ).fetchone()
    if not build:
        print("overview rollup deleted (--no-rollup): every hour is read live", flush=True)
        return
    print(
        f"overview rollup built in {time.perf_counter() - began:.1f} s ({proc.stdout.strip()}; "
        f"{rows[0]:,} run rows, {rows[1]:,} detection rows)",
        flush=True,
    )


_CLEAR = "from dashboards.overview.rollup import rollup_clear; rollup_clear()"


def analyze(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def describe(url: str) -> str:
    with psycopg.connect(url) as conn:
        runs, calls = conn.execute("SELECT count(*), sum(tool_calls) FROM ingest_run").fetchone()
        detections = conn.execute("SELECT count(*) FROM ingest_detection").fetchone()[0]
        unknown = conn.execute("SELECT count(*) FROM ingest_operation WHERE status = 'UNKNOWN'").fetchone()[0]
        stored_calls = conn.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE relname = 'ingest_toolcall'"
        ).fetchone()[0]
    return (
        f"{runs:,} runs ({calls:,} tool calls, ~{stored_calls:,} ToolCall rows), {detections:,} detections, "
        f"{unknown:,} UNKNOWN operations"
    )


# --- timing -------------------------------------------------------------------------------------


def scenarios(now: datetime) -> list[tuple[str, str]]:
    def overview(**params) -> str:
        return "/?" + urlencode(params) if params else "/"

    custom = {
        "range": "custom",
        "from": (now - timedelta(days=5)).strftime("%Y-%m-%dT%H:%M"),
        "to": (now - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M"),
    }
    return [
        ("overview, default (day)", overview()),
        ("overview, hour", overview(range="hour")),
        ("overview, day", overview(range="day")),
        ("overview, week", overview(range="week")),
        ("overview, custom 3 days", overview(**custom)),
        ("overview, week, tenant", overview(range="week", tenant=TENANT)),
        ("overview, week, backend", overview(range="week", backend="anthropic")),
        ("overview, week, backend+model", overview(range="week", backend="openai", model="gpt-4o")),
        ("overview, week, task type", overview(range="week", task_type="research")),
        ("overview, week, agent", overview(range="week", agent="billing-bot")),
        (
            "overview, week, all filters",
            overview(
                range="week",
                tenant=TENANT,
                backend="openai",
                model="gpt-4o",
                task_type="research",
                agent="research-agent",
            ),
        ),
        ("overview, week, tool calls tail", overview(range="week", metric="tool_calls")),
        (
            "overview, week, a tail bar's runs",
            overview(range="week", bin_task="research", bin_lo=49, bin_hi=64),
        ),
        (
            "tail runs fragment, week",
            "/overview/tail/?"
            + urlencode({"range": "week", "bin_task": "research", "bin_lo": 49, "bin_hi": 64}),
        ),
        ("alerts page", "/alerts/"),
    ]


def measure(repeat: int) -> list[dict]:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from dashboards.models import Membership
    from ingest.models import Tenant

    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    Membership.objects.get_or_create(user=user, tenant=Tenant.objects.get(slug=TENANT))
    client = Client()
    client.force_login(user)
    now = datetime.now(UTC)
    results = []
    for label, url in scenarios(now):
        queries: list[float] = []

        def timed(execute, sql_text, params, many, context, queries=queries):
            began = time.perf_counter()
            try:
                return execute(sql_text, params, many, context)
            finally:
                queries.append(time.perf_counter() - began)

        status = client.get(url).status_code  # warm: connection, templates, caches
        wall, db_time, db_count = [], [], []
        for _ in range(repeat):
            queries.clear()
            with connection.execute_wrapper(timed):
                began = time.perf_counter()
                response = client.get(url)
                wall.append((time.perf_counter() - began) * 1000)
            status = response.status_code
            db_time.append(sum(queries) * 1000)
            db_count.append(len(queries))
        results.append(
            {
                "label": label,
                "url": url,
                "status": status,
                "median": statistics.median(wall),
                "max": max(wall),
                "db_ms": statistics.median(db_time),
                "queries": statistics.median(db_count),
            }
        )
        print(
            f"  {label:<36} {statistics.median(wall):8.1f} ms  (status {status})",
            flush=True,
        )
    return results


def report(results: list[dict], repeat: int, data: str) -> None:
    print()
    print(f"data: {data}")
    print(f"server time in-process (Django test client, DEBUG off), median of {repeat} warm requests")
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        "(1 / 5 / 15 min; above the core count, other processes slow every figure)"
    )
    print(f"target: under {TARGET_MS:.0f} ms each")
    print()
    print(f"| {'page':<36} | status | median ms | max ms | SQL ms | queries | target |")
    print(f"|{'-' * 38}|--------|-----------|--------|--------|---------|--------|")
    for r in results:
        verdict = "ok" if r["status"] == 200 and r["median"] < TARGET_MS else "MISSED"
        print(
            f"| {r['label']:<36} | {r['status']:>6} | {r['median']:>9.1f} | {r['max']:>6.1f} "
            f"| {r['db_ms']:>6.1f} | {r['queries']:>7.0f} | {verdict:>6} |"
        )
    worst = max(results, key=lambda r: r["median"])
    print()
    print(f"slowest: {worst['label']} at {worst['median']:.1f} ms (target {TARGET_MS:.0f} ms)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50_000)
    parser.add_argument("--other-runs", type=int, default=5_000, help="runs of a tenant the user cannot see")
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_bench_dash")
    parser.add_argument("--regenerate", action="store_true", help="generate the data even if it is there")
    parser.add_argument(
        "--no-rollup", action="store_true", help="delete the overview's rollup: time the live reads alone"
    )
    parser.add_argument(
        "--alert-latency",
        nargs=argparse.REMAINDER,
        default=None,
        help="then run bench/alert_latency.py with the arguments that follow (when it exists)",
    )
    args = parser.parse_args()
    try:
        ensure_database(args.database_url)
        env = django_env(args.database_url)
        migrate(env)
        shape = _shape(args.runs, args.other_runs, args.calls, args.seed)
        stored = stored_shape(args.database_url)
        if args.regenerate or stored is None or stored[0] != shape:
            print(f"generating {shape} ...", flush=True)
            generate(
                args.database_url,
                runs=args.runs,
                other_runs=args.other_runs,
                calls=args.calls,
                seed=args.seed,
            )
            analyze(args.database_url)
        else:
            print(f"reusing the data ({shape})")
            move_forward(args.database_url, stored[1])
        rollup(env, args.database_url, build=not args.no_rollup)
    except (SetupError, psycopg.Error) as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 2
    data = describe(args.database_url)
    os.environ.update(env)
    print("timing ...", flush=True)
    results = measure(args.repeat)
    report(results, args.repeat, data)
    if args.alert_latency is not None:
        if ALERT_LATENCY.exists():
            print(f"\nrunning {ALERT_LATENCY.relative_to(ROOT)} {' '.join(args.alert_latency)}", flush=True)
            return subprocess.run(
                [sys.executable, str(ALERT_LATENCY), *args.alert_latency], cwd=ROOT
            ).returncode
        print(f"\n{ALERT_LATENCY.relative_to(ROOT)} does not exist yet: no alert latency measured")
    elif ALERT_LATENCY.exists():
        print(
            "\nalert latency (ingest -> browser): add --alert-latency [its options] to run bench/alert_latency.py"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
