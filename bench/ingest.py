"""End-to-end REST ingest benchmark, with the raw COPY ceiling measured in the same run.

    .venv/bin/python bench/ingest.py [--events 100000] [--batch 1000] [--clients 4] [--workers 2]
        [--runs-per-batch 20,1000] [--rounds 3] [--database-url postgres://postgres@127.0.0.1:5432/loopwatch_bench]
        [--redis-url redis://127.0.0.1:6379/15] [--port 8765]

1. Creates the bench database if missing, migrates it, empties the event and run tables
   (only in a database whose name holds "bench"), creates a tenant and an ingest key.
   Steps 2 to 4 run --rounds times (default 3) per shape of --runs-per-batch (default 20, then
   1,000 runs per batch of 1,000 events: the cost of ingest is per run a batch touches), each
   round on emptied tables. The machine's speed drifts by a third between runs of a few seconds:
   a round's REST and COPY run back to back, and the verdict takes the median round.
2. Starts uvicorn (--workers) on 127.0.0.1:PORT with DEBUG off, REDIS_URL set (detection tasks are
   queued to Redis, nothing consumes them), and waits until it answers.
3. REST: --clients processes, each with its own stream of generated trace events (~600 bytes,
   runs interleaved: a batch holds the events of --runs-per-batch runs; pre-serialised with orjson
   before the clock starts), POST batches of --batch events over keep-alive connections, a new one every --reconnect-every batches (so that the
   connections spread over the uvicorn workers). Every answer must be 200 with accepted == batch size.
4. Stops the server, then the ceiling: the same rows (run ids mapped to fresh ints) copied with
   psycopg COPY into bench_ceiling (LIKE ingest_event INCLUDING ALL), one transaction per --batch
   rows, from --clients processes, then again from a single process.
5. Prints a table per shape (its median round) and a summary: per shape and round REST / COPY
   against one COPY process, the yardstick of the 0.50 target (see TARGET), and against
   --clients COPY processes for reference; empties bench_ceiling, purges the Redis bench db.
   The bench database and its ingest_event rows stay (emptied at the start of the next run).

Exits 1 when any batch failed, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for bench.harness
from bench.harness import (
    HOST,
    Server,
    SetupError,
    _post,
    background_load,
    checkpoint,
    cpu_line,
    ensure_database,
    manage,
    percentile,
    port_free,
    redis_purge,
    reset_tables,
    run_phase,
    server_env,
    split,
)

ROOT = Path(__file__).resolve().parent.parent
TENANT = "bench"
CEILING_TABLE = "bench_ceiling"
COPY_COLUMNS = "(tenant_id, run_id, seq, event_id, type, ts, body)"
# REST / COPY to reach, COPY being one process copying the same rows, one transaction a batch: the
# yardstick of the independent benchmark that found ingest slow over many runs a batch (issue 16:
# "22,100 events/s = 0.71 x COPY" over 20 runs a batch). Against --clients COPY processes, which
# fill both cores of a 2-core machine with PostgreSQL's work alone, the 20-run shape itself reads
# 0.37-0.48 x here: that ratio is printed beside it, for reference.
TARGET = 0.50
WARM_UP = 4  # warm-up batches per client, each over a new connection


# --- event generation ---------------------------------------------------------------------------

WORDS = (
    "order customer ticket status refund shipping invoice account payment address delivery "
    "warehouse carrier tracking number pending open closed escalate priority summary the a of to "
    "and for with on in is was not found please check again later update record confirm request "
    "latest page cursor result error retry timeout quota limit region europe billing plan annual "
    "monthly discount coupon applied cancelled returned damaged missing item product sku quantity"
).split()

TOOLS = (
    ("search_orders", "read"),
    ("get_order", "read"),
    ("query_db", "read"),
    ("http_get", "read"),
    ("poll_job", "poll"),
    ("update_ticket", "write"),
    ("send_email", "write"),
    ("create_refund", "write"),
)
BACKENDS = (("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4"), ("vllm", "llama-3.1-70b"))
AGENTS = ("shop-assistant", "support-triage", "billing-bot", "ops-runner")
TASK_TYPES = ("order_lookup", "refund", "ticket_triage", "report")
ERROR_CLASSES = ("transient", "rate_limited", "not_found", "invalid_argument")
EPOCH = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _args(rng: random.Random, tool: str) -> dict[str, Any]:
    if tool == "search_orders":
        return {
            "customer": f"cus_{rng.randrange(10**6):06d}",
            "status": rng.choice(("open", "shipped", "returned")),
            "query": _words(rng, rng.randint(10, 24)),
            "limit": 20,
            "fields": ["id", "status", "total", "created_at"],
        }
    if tool == "get_order":
        return {
            "order_id": f"ord_{rng.randrange(10**8):08d}",
            "expand": ["items", "shipping", "payments", "customer"],
            "reason": _words(rng, rng.randint(14, 30)),
        }
    if tool == "query_db":
        return {
            "sql": "SELECT id, status, total FROM orders WHERE customer_id = $1 AND created_at > $2 "
            "ORDER BY created_at DESC LIMIT 50",
            "params": [rng.randrange(10**6), "2026-10-01"],
        }
    if tool == "http_get":
        return {
            "url": f"https://api.example.com/v2/shipments/{rng.randrange(10**8)}/events",
            "headers": {"Accept": "application/json", "X-Request-Source": "agent"},
            "query": {"since": "2026-11-01T00:00:00Z", "limit": 100, "q": _words(rng, rng.randint(10, 20))},
            "timeout_s": 10,
        }
    if tool == "poll_job":
        return {
            "job_id": f"job_{rng.randrange(10**6)}",
            "wait_s": 5,
            "note": _words(rng, rng.randint(20, 40)),
        }
    if tool == "update_ticket":
        return {
            "ticket_id": f"T-{rng.randrange(10**5)}",
            "status": rng.choice(("pending", "escalated", "solved")),
            "comment": _words(rng, rng.randint(30, 60)),
        }
    if tool == "send_email":
        return {
            "to": f"customer{rng.randrange(10**5)}@example.com",
            "subject": _words(rng, 5),
            "body": _words(rng, rng.randint(40, 80)),
        }
    return {
        "order_id": f"ord_{rng.randrange(10**8):08d}",
        "amount": round(rng.uniform(5, 300), 2),
        "currency": "EUR",
        "reason": _words(rng, rng.randint(15, 35)),
    }


def _result(rng: random.Random, tool: str) -> Any:
    if tool in ("search_orders", "query_db"):
        items = [
            {
                "id": f"ord_{rng.randrange(10**8):08d}",
                "status": rng.choice(("open", "shipped", "returned", "cancelled")),
                "total": round(rng.uniform(5, 500), 2),
                "created_at": f"2026-11-2{rng.randrange(10)}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z",
            }
            for _ in range(rng.randint(1, 6))
        ]
        return {
            "items": items,
            "count": len(items),
            "next_cursor": None if rng.random() < 0.7 else _uuid(rng),
        }
    if tool == "get_order":
        return {
            "id": f"ord_{rng.randrange(10**8):08d}",
            "status": "shipped",
            "items": [{"sku": f"SKU-{rng.randrange(10**5)}", "qty": rng.randint(1, 3)} for _ in range(2)],
            "shipping": {"carrier": "DHL", "tracking": f"JD{rng.randrange(10**12):012d}"},
        }
    if tool == "http_get":
        return {
            "status": 200,
            "events": [
                {"at": "2026-11-28T09:00:00Z", "what": _words(rng, 8)} for _ in range(rng.randint(2, 5))
            ],
        }
    if tool == "poll_job":
        return {
            "state": rng.choice(("RUNNING", "RUNNING", "SUCCEEDED")),
            "progress": rng.randrange(100),
            "log_tail": _words(rng, rng.randint(30, 60)),
        }
    return {"ok": True, "id": _uuid(rng), "message": _words(rng, rng.randint(25, 50))}


class _Run:
    __slots__ = ("backend", "left", "model", "number", "pending", "round", "run_id")

    def __init__(self, rng: random.Random, run_id: str, number: int) -> None:
        self.run_id = run_id
        self.number = number  # 0, 1, 2, ... within the client's stream
        self.left = rng.randint(40, 120)  # events this run will have
        self.round = 0
        self.backend, self.model = rng.choice(BACKENDS)
        self.pending: list[dict[str, Any]] = [
            {
                "type": "run_started",
                "tenant": TENANT,
                "agent": rng.choice(AGENTS),
                "task_type": rng.choice(TASK_TYPES),
                "backend": self.backend,
                "model": self.model,
                "budgets": {"max_rounds": 40, "max_tool_calls": 80, "max_cost_usd": 2.5},
                "labels": {"prompt_version": f"v{rng.randint(1, 9)}", "deployment": "bench"},
            }
        ]

    def next_round(self, rng: random.Random) -> None:
        self.round += 1
        calls = rng.choice((1, 1, 1, 2, 3))
        if self.left <= 2 * calls + 3:
            self.pending = [
                {
                    "type": "model_round",
                    "round": self.round,
                    "input_tokens": rng.randint(2000, 9000),
                    "output_tokens": rng.randint(50, 400),
                    "text": _words(rng, rng.randint(30, 60)),
                },
                {
                    "type": "run_finished",
                    "status": rng.choice(("succeeded", "succeeded", "succeeded", "failed")),
                    "reason": _words(rng, 6),
                },
            ]
            return
        round_event: dict[str, Any] = {
            "type": "model_round",
            "round": self.round,
            "input_tokens": rng.randint(800, 9000),
            "output_tokens": rng.randint(20, 300),
        }
        if rng.random() < 0.3:
            round_event["cost_usd"] = round(rng.uniform(0.001, 0.05), 6)
        if rng.random() < 0.7:
            round_event["text"] = _words(rng, rng.randint(50, 120))
        self.pending = [round_event]
        results = []
        for i in range(calls):
            tool, kind = rng.choice(TOOLS)
            call_id = f"call_{self.round}_{i}_{rng.getrandbits(40):010x}"
            call = {
                "type": "tool_call",
                "round": self.round,
                "call_id": call_id,
                "tool": tool,
                "kind": kind,
                "args": _args(rng, tool),
            }
            if kind == "write":
                call["step_id"] = f"step-{self.round}-{i}"
            self.pending.append(call)
            roll = rng.random()
            status = "ok" if roll < 0.9 else ("error" if roll < 0.97 else "timeout")
            result: dict[str, Any] = {
                "type": "tool_result",
                "call_id": call_id,
                "status": status,
                "latency_ms": round(rng.uniform(20, 2500), 1),
            }
            if status == "ok":
                result["result"] = _result(rng, tool)
            else:
                result["result"] = {
                    "error": _words(rng, rng.randint(10, 30)),
                    "code": rng.choice((400, 404, 429, 503)),
                }
                result["error_class"] = rng.choice(ERROR_CLASSES)
            if kind == "write" and status == "ok":
                result["external_request_id"] = f"ext_{rng.getrandbits(48):012x}"
            results.append(result)
        self.pending.extend(results)


def client_stream(seed: int, client: int, n_events: int, pool: int, prefix: str) -> list[tuple[int, dict]]:
    """One client's events, deterministic in (seed, client): [(run number, event)], in send order.

    `pool` runs are active at once; the stream takes one event of each in turn, in an order
    shuffled every round, so a batch of `pool` events touches `pool` runs and a batch of 1,000
    events with a pool of 20 touches 20 (and the runs that replace those that finish). Runs
    interleave and span several batches.
    """
    rng = random.Random(seed * 7919 + client)
    clock = EPOCH + timedelta(seconds=client * 3600)
    made = 0

    def new_run() -> _Run:
        nonlocal made
        made += 1
        return _Run(rng, f"{prefix}-c{client}-r{made - 1:06d}", made - 1)

    active = [new_run() for _ in range(pool)]
    out: list[tuple[int, dict]] = []
    order: list[int] = []
    while len(out) < n_events:
        if not order:
            order = list(range(len(active)))
            rng.shuffle(order)
        slot = order.pop()
        run = active[slot]
        if not run.pending:
            run.next_round(rng)
        body = run.pending.pop(0)
        clock += timedelta(microseconds=rng.randint(100, 20_000))
        event = {
            "type": body.pop("type"),
            "run_id": run.run_id,
            "ts": clock.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "event_id": _uuid(rng),
            **body,
            "span_id": f"{rng.getrandbits(64):016x}",
            "sdk": "loopwatch-py/0.4.2",
        }
        out.append((run.number, event))
        run.left -= 1
        if event["type"] == "run_finished":
            active[slot] = new_run()
    return out


def share(events: int, batch: int, clients: int) -> list[int]:
    """Events per client, in whole batches (the last client also takes the remainder)."""
    full, rest = divmod(events, batch)
    per_client = [n * batch for n in split(full, clients)]
    per_client[-1] += rest
    return per_client


# --- REST client -----------------------------------------------------------------------------------


def rest_client(idx: int, cfg: dict, key: str, barrier, out_q) -> None:
    """Send this client's batches over keep-alive connections; report counts and latencies.

    A connection stays on the worker that accepted it: a new one every cfg["reconnect_every"] batches
    (0: one for the whole run) lets the kernel hand the client to whichever worker accepts it, so that
    4 clients do not end up on one of 2 workers for the whole run.
    """
    try:
        stream = client_stream(cfg["seed"], idx, cfg["per_client"][idx], cfg["pool"], cfg["prefix"])
        events = [e for _, e in stream]
        size_total = sum(len(orjson.dumps(e)) for e in events)
        batch = cfg["batch"]
        bodies = [
            (orjson.dumps(events[i : i + batch]), len(events[i : i + batch]))
            for i in range(0, len(events), batch)
        ]
        del stream, events
        # Warm-up: small batches of its own run, each over a new connection, so that every worker (not
        # only the first to accept) has its DB connection and has sent its first detection task (the
        # broker connection and its imports: ~0.2 s of CPU once per worker) before the clock starts.
        warm = [e for _, e in client_stream(cfg["seed"] + 1, idx, 5 * WARM_UP, 1, cfg["prefix"] + "-warm")]
        for i in range(WARM_UP):
            conn = http.client.HTTPConnection(HOST, cfg["port"], timeout=cfg["request_timeout"])
            status, data = _post(conn, orjson.dumps(warm[5 * i : 5 * i + 5]), key)
            conn.close()
            if status != 200:
                raise RuntimeError(f"warm-up batch answered {status}: {data[:300]!r}")

        barrier.wait(timeout=cfg["timeout"])
        cpu0 = time.process_time()
        conn = http.client.HTTPConnection(HOST, cfg["port"], timeout=cfg["request_timeout"])
        first = time.monotonic()
        deadline = first + cfg["timeout"]
        latencies: list[float] = []
        failed_batches = failed_events = 0
        failures: list[str] = []
        reconnect = cfg["reconnect_every"]
        for n, (body, count) in enumerate(bodies):
            if reconnect and n and n % reconnect == 0:
                conn.close()
                conn = http.client.HTTPConnection(HOST, cfg["port"], timeout=cfg["request_timeout"])
            if time.monotonic() > deadline:
                left = bodies[n:]
                failed_batches += len(left)
                failed_events += sum(c for _, c in left)
                failures.append(f"hard timeout ({cfg['timeout']} s): {len(left)} batches not sent")
                break
            t0 = time.monotonic()
            try:
                status, data = _post(conn, body, key)
            except (OSError, http.client.HTTPException) as exc:
                failed_batches += 1
                failed_events += count
                failures.append(f"batch {n}: {type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection(HOST, cfg["port"], timeout=cfg["request_timeout"])
                continue
            latencies.append(time.monotonic() - t0)
            accepted = None
            if status == 200:
                with contextlib.suppress(orjson.JSONDecodeError):
                    accepted = orjson.loads(data).get("accepted")
            if status != 200 or accepted != count:
                failed_batches += 1
                failed_events += count
                failures.append(f"batch {n}: HTTP {status}, accepted={accepted} of {count}: {data[:300]!r}")
        last = time.monotonic()
        conn.close()
        out_q.put(
            {
                "idx": idx,
                "first": first,
                "last": last,
                "events": sum(c for _, c in bodies),
                "batches": len(bodies),
                "bytes": size_total,
                "latencies": latencies,
                "failed_batches": failed_batches,
                "failed_events": failed_events,
                "failures": failures[:5],
                "cpu": time.process_time() - cpu0,
            }
        )
    except BaseException as exc:  # reported by the parent, which counts the whole share as failed
        with contextlib.suppress(Exception):
            barrier.abort()  # the others (and the parent) stop waiting at the start line
        out_q.put({"idx": idx, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})


# --- COPY ceiling -----------------------------------------------------------------------------------


def ceiling_rows(cfg: dict, idx: int, tenant_id: int) -> list[tuple]:
    """Client idx's events as ingest_event rows, as the server stores them.

    Run ids become fresh ints, or with --ceiling-fk the pks the server gave the same runs.
    """
    run_pks: dict[str, int] | None = cfg.get("run_pks")
    seqs: dict[int, int] = {}
    rows = []
    for number, event in client_stream(cfg["seed"], idx, cfg["per_client"][idx], cfg["pool"], cfg["prefix"]):
        run_int = run_pks[event["run_id"]] if run_pks is not None else (idx + 1) * 1_000_000 + number
        seq = seqs[run_int] = seqs.get(run_int, 0) + 1
        ts = datetime.fromisoformat(event["ts"])
        rows.append(
            (tenant_id, run_int, seq, event["event_id"], event["type"], ts, orjson.dumps(event).decode())
        )
    return rows


def copy_client(idxs: list[int], cfg: dict, tenant_id: int, barrier, out_q) -> None:
    """COPY the rows of clients idxs into the ceiling table, one transaction per batch."""
    try:
        rows = [row for idx in idxs for row in ceiling_rows(cfg, idx, tenant_id)]
        batch = cfg["batch"]
        copy_sql = sql.SQL("COPY {} " + COPY_COLUMNS + " FROM STDIN").format(sql.Identifier(CEILING_TABLE))
        with psycopg.connect(cfg["database_url"], autocommit=True) as conn:
            barrier.wait(timeout=cfg["timeout"])
            cpu0 = time.process_time()
            first = time.monotonic()
            deadline = first + cfg["timeout"]
            latencies: list[float] = []
            done = 0
            for start in range(0, len(rows), batch):
                if time.monotonic() > deadline:
                    break
                t0 = time.monotonic()
                with conn.transaction(), conn.cursor() as cur, cur.copy(copy_sql) as copy:
                    for row in rows[start : start + batch]:
                        copy.write_row(row)
                latencies.append(time.monotonic() - t0)
                done += min(batch, len(rows) - start)
            last = time.monotonic()
        out_q.put(
            {
                "idx": idxs[0],
                "first": first,
                "last": last,
                "events": done,
                "expected": len(rows),
                "latencies": latencies,
                "cpu": time.process_time() - cpu0,
            }
        )
    except BaseException as exc:
        with contextlib.suppress(Exception):
            barrier.abort()
        out_q.put({"idx": idxs[0], "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})


# --- orchestration ------------------------------------------------------------------------------------


def summarise(phase: dict) -> dict:
    ok = [r for r in phase["reports"] if "error" not in r]
    errors = [r["error"] for r in phase["reports"] if "error" in r]
    if not ok:
        return {
            "rate": 0.0,
            "wall": 0.0,
            "events": 0,
            "latencies": [],
            "errors": errors,
            "ok": ok,
            "client_cpu": 0.0,
        }
    wall = max(r["last"] for r in ok) - min(r["first"] for r in ok)
    events = sum(r["events"] - r.get("failed_events", 0) for r in ok)
    latencies = [x for r in ok for x in r["latencies"]]
    return {
        "rate": events / wall if wall > 0 else 0.0,
        "wall": wall,
        "events": events,
        "latencies": latencies,
        "errors": errors,
        "ok": ok,
        "client_cpu": sum(r["cpu"] for r in ok),
    }


CEILING_FK_DROP = f"""
ALTER TABLE {CEILING_TABLE} DROP CONSTRAINT IF EXISTS {CEILING_TABLE}_run_fk,
    DROP CONSTRAINT IF EXISTS {CEILING_TABLE}_tenant_fk
"""
CEILING_FK_ADD = f"""
ALTER TABLE {CEILING_TABLE}
    ADD CONSTRAINT {CEILING_TABLE}_run_fk FOREIGN KEY (run_id) REFERENCES ingest_run (id)
        DEFERRABLE INITIALLY DEFERRED
"""

TABLE_SUMS = """
SELECT count(*), coalesce(sum(e.seq), 0),
       coalesce(sum(hashtext(concat_ws('|', e.seq, e.event_id, e.type, e.ts, e.body::text))::bigint), 0)
FROM {table} e {where}
"""


def stored_sums(url: str, *, prefix: str | None = None) -> tuple[int, int, int]:
    """(rows, sum of seq, checksum) of the REST-stored events of this run (prefix) or of the ceiling."""
    with psycopg.connect(url) as conn:
        if prefix is None:
            query = sql.SQL(TABLE_SUMS).format(table=sql.Identifier(CEILING_TABLE), where=sql.SQL(""))
            return conn.execute(query).fetchone()
        query = sql.SQL(TABLE_SUMS).format(
            table=sql.Identifier("ingest_event"),
            where=sql.SQL("JOIN ingest_run r ON r.id = e.run_id WHERE r.run_id LIKE %s"),
        )
        return conn.execute(query, (prefix + "-c%",)).fetchone()


def redis_queued(url: str) -> tuple[int, int]:
    """(tasks queued, runs waiting for detection) in the bench's Redis db."""
    import redis

    client = redis.Redis.from_url(url)
    try:  # the names come from settings (CELERY_QUEUE): every list (a queue) and set (runs) in the db
        kinds = {k: client.type(k) for k in client.scan_iter(count=1000)}
        tasks = sum(client.llen(k) for k, kind in kinds.items() if kind == b"list")
        runs = sum(client.scard(k) for k, kind in kinds.items() if kind == b"set")
        return tasks, runs
    finally:
        client.close()


def measure_shape(args, cfg: dict, env: dict[str, str], key: str, tenant_id: int, notes: list[str]) -> dict:
    """One shape (cfg["pool"] runs per batch): the REST phase against a fresh server, then the COPY
    ceiling of the same rows from --clients processes and from one. Returns the phases' summaries
    and the number of failures."""
    failed = 0
    rest: dict = {}
    par: dict = {}
    single: dict = {}
    server: Server | None = None
    spy: subprocess.Popen | None = None
    try:
        # --- REST ---
        server = Server(args, env, key)
        server.wait_ready()
        workers = server.worker_pids()
        checkpoint(args.database_url)
        if args.py_spy:
            out = Path(args.py_spy)
            fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(out.suffix, "raw")
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(workers[0]),
                    "--idle",
                    "--format",
                    fmt,
                    "-o",
                    str(out),
                    "--rate",
                    "200",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            time.sleep(1.0)
        print(
            f"REST: {args.events} events, batches of {args.batch}, {args.clients} clients, "
            f"{args.workers} workers (pids {workers}), {cfg['pool']} runs per batch, seed {cfg['seed']} ...",
            flush=True,
        )
        phase = run_phase(rest_client, [(i, cfg, key) for i in range(args.clients)], args.timeout, workers)
        rest = summarise(phase)
        rest["phase"] = phase
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            try:
                _, err = spy.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
                _, err = spy.communicate()
            notes.append(f"py-spy profile of worker {workers[0]}: {args.py_spy} (exit {spy.returncode})")
            if spy.returncode:
                notes.append(f"py-spy said: {err.decode(errors='replace')[-500:]}")
            spy = None
        failed_batches = sum(r["failed_batches"] for r in rest["ok"])
        failed_events = sum(r["failed_events"] for r in rest["ok"])
        for r in rest["ok"]:
            for line in r["failures"]:
                print(f"  client {r['idx']}: {line}", file=sys.stderr)
        for err in rest["errors"]:
            print(f"  client error: {err}", file=sys.stderr)
        lost = args.events - sum(r["events"] for r in rest["ok"])  # clients that crashed or never reported
        failed = failed_batches + (lost + args.batch - 1) // args.batch
        rest["failed_batches"] = failed
        rest["failed_events"] = failed_events + lost
        rest["bytes"] = sum(r["bytes"] for r in rest["ok"])
        rest["queued"] = redis_queued(args.redis_url)
        server.stop()
        server = None
        rest_sums = stored_sums(args.database_url, prefix=cfg["prefix"])
        if rest_sums[0] != args.events - rest["failed_events"]:
            notes.append(
                f"ingest_event holds {rest_sums[0]} rows of this run, expected "
                f"{args.events - rest['failed_events']}"
            )

        # --- COPY ceiling ---
        if not args.skip_ceiling:
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE TABLE IF NOT EXISTS {} (LIKE ingest_event INCLUDING ALL)").format(
                        sql.Identifier(CEILING_TABLE)
                    )
                )
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(CEILING_TABLE)))
                conn.execute(CEILING_FK_DROP)
                if args.ceiling_fk:
                    # LIKE copies no foreign key: add ingest_event's one (to the run; deferred, as Django makes it),
                    # and use the run pks the server stored, so that the rows satisfy them.
                    conn.execute(CEILING_FK_ADD)
                    cfg["run_pks"] = dict(
                        conn.execute(
                            "SELECT run_id, id FROM ingest_run WHERE run_id LIKE %s", (cfg["prefix"] + "-c%",)
                        ).fetchall()
                    )
            checkpoint(args.database_url)
            print(f"COPY ceiling: {args.clients} processes ...", flush=True)
            phase = run_phase(copy_client, [([i], cfg, tenant_id) for i in range(args.clients)], args.timeout)
            par = summarise(phase)
            par["phase"] = phase
            ceiling_sums = stored_sums(args.database_url)
            if rest_sums != ceiling_sums and not rest["failed_events"]:
                notes.append(f"the ceiling rows differ from the REST rows: {ceiling_sums} vs {rest_sums}")
            elif not rest["failed_events"]:
                notes.append(
                    f"checked: bench_ceiling holds the same {ceiling_sums[0]} rows as ingest_event "
                    "(count, sum of seq, checksum of seq|event_id|type|ts|body)"
                )
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(CEILING_TABLE)))
            checkpoint(args.database_url)
            print("COPY ceiling: 1 process ...", flush=True)
            phase = run_phase(copy_client, [(list(range(args.clients)), cfg, tenant_id)], args.timeout)
            single = summarise(phase)
            single["phase"] = phase
            for part in (par, single):
                for err in part["errors"]:
                    print(f"  ceiling error: {err}", file=sys.stderr)
                short = sum(r["expected"] - r["events"] for r in part["ok"]) + (
                    args.events if not part["ok"] else 0
                )
                if short or part["errors"]:
                    failed += 1
                    notes.append("the ceiling did not copy every row (error or hard timeout)")
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        if server is not None:
            server.stop()
    return {"rest": rest, "par": par, "single": single, "failed": failed}


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--events", type=int, default=100_000, help="events in all (default 100000)")
    parser.add_argument("--batch", type=int, default=1000, help="events per HTTP batch / COPY transaction")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client processes")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--timeout", type=float, default=600.0, help="hard limit in seconds for each phase")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="socket timeout of one batch")
    parser.add_argument("--seed", type=int, default=None, help="generator seed (default: random)")
    parser.add_argument(
        "--reconnect-every",
        type=int,
        default=1,
        metavar="N",
        help="each client opens a new connection every N batches (default 1; 0: one keep-alive "
        "connection for the whole run, which can leave a worker idle)",
    )
    parser.add_argument(
        "--py-spy",
        metavar="OUT",
        help="record one server worker with py-spy during REST "
        "(OUT.svg flamegraph, OUT.json speedscope, else raw collapsed stacks; wall time)",
    )
    parser.add_argument("--skip-ceiling", action="store_true", help="only the REST phase")
    parser.add_argument(
        "--runs-per-batch",
        default="20,1000",
        help="the shapes to measure, one after the other: runs whose events a batch holds, comma "
        "separated (default 20,1000: an agent framework's batches, an OpenTelemetry collector's)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds per shape, each REST then COPY on emptied tables; the verdict takes the median (default 3)",
    )
    parser.add_argument(
        "--app",
        default="loopwatch.asgi:application",
        help="the ASGI app uvicorn serves (to measure a variant; PYTHONPATH is passed on)",
    )
    parser.add_argument(
        "--ceiling-fk",
        action="store_true",
        help="give bench_ceiling ingest_event's foreign key to the run too (LIKE copies none) and "
        "the server's run pks",
    )
    args = parser.parse_args(argv)

    for name in ("events", "batch", "clients", "workers", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.reconnect_every < 0:
        parser.error("--reconnect-every must be 0 or more")
    if args.events < args.batch * args.clients:
        parser.error("--events must be at least --batch x --clients (every client sends whole batches)")
    db_name = urlsplit(args.database_url).path.lstrip("/")
    if "bench" not in db_name:
        parser.error(
            f"--database-url: the database {db_name!r} would be emptied; its name must contain 'bench'"
        )
    if urlsplit(args.redis_url).path.strip("/") in ("", "0"):
        parser.error("--redis-url: name a Redis db of its own (like /15); it is flushed at the end")
    try:
        shapes = [int(part) for part in args.runs_per_batch.split(",")]
    except ValueError:
        parser.error("--runs-per-batch: whole numbers separated by commas, like 20,1000")
    if not shapes or min(shapes) < 1:
        parser.error("--runs-per-batch: each shape must be at least 1 run")

    # Ctrl-C or a plain kill must still stop the server and clean up (the finally below): also when
    # started in the background, where SIGINT comes ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupted)

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    prefix = f"bench-{seed:08x}"
    cfg = {
        "seed": seed,
        "prefix": prefix,
        "batch": args.batch,
        "per_client": share(args.events, args.batch, args.clients),
        "pool": shapes[0],  # runs per batch: set per shape below
        "port": args.port,
        "timeout": args.timeout,
        "request_timeout": min(args.request_timeout, args.timeout),
        "reconnect_every": args.reconnect_every,
        "database_url": args.database_url,
    }
    env = server_env(args)
    failed = 0
    results: dict[int, list[dict]] = {}
    notes: list[str] = []
    try:
        if not port_free(args.port):
            raise SetupError(f"port {args.port} on {HOST} is in use")
        ensure_database(args.database_url)
        manage(env, "migrate", "--noinput", "-v", "0")
        reset_tables(args.database_url)
        key = manage(env, "create_api_key", TENANT, "--scopes", "ingest,read", "--name", "bench").strip()
        with psycopg.connect(args.database_url) as conn:
            tenant_id = conn.execute("SELECT id FROM ingest_tenant WHERE slug = %s", (TENANT,)).fetchone()[0]
            pg_version = conn.execute("SHOW server_version").fetchone()[0]
            sync_commit = conn.execute("SHOW synchronous_commit").fetchone()[0]
            shared_buffers = conn.execute("SHOW shared_buffers").fetchone()[0]
        redis_purge(args.redis_url)
        idle_busy = background_load()
        if idle_busy > 0.10:
            print(
                f"WARNING: the machine is {idle_busy:.0%} busy before the benchmark starts (other processes); "
                "the figures will be low and noisy",
                file=sys.stderr,
            )

        for runs_per_batch in shapes:
            print(f"--- {runs_per_batch} runs per batch ---", flush=True)
            cfg["pool"] = runs_per_batch
            cfg["prefix"] = f"{prefix}-r{runs_per_batch}"
            results[runs_per_batch] = rounds = []
            for n in range(args.rounds):
                if args.rounds > 1:
                    print(f"round {n + 1} of {args.rounds}", flush=True)
                cfg.pop("run_pks", None)
                reset_tables(args.database_url)
                redis_purge(args.redis_url)
                shape_notes: list[str] = []
                rounds.append(measure_shape(args, cfg, env, key, tenant_id, shape_notes))
                notes.extend(
                    f"{runs_per_batch} runs per batch, round {n + 1}: {note}" for note in shape_notes
                )
                failed += rounds[-1]["failed"]
    except SetupError as exc:
        print(f"SETUP ERROR: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"INTERRUPTED ({exc or 'Ctrl-C'}): server stopped, clean-up done", file=sys.stderr)
        return 130
    finally:
        with contextlib.suppress(Exception):
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(CEILING_TABLE)))
                conn.execute(CEILING_FK_DROP)
        with contextlib.suppress(Exception):
            purged = redis_purge(args.redis_url)
            notes.append(f"purged Redis {args.redis_url} ({purged} keys)")

    for runs_per_batch, rounds in results.items():
        if not rounds:
            continue
        shape = rounds[median_round(rounds)]
        report(
            args,
            runs_per_batch,
            shape["rest"],
            shape["par"],
            shape["single"],
            pg_version,
            sync_commit,
            shared_buffers,
            idle_busy,
            len(rounds),
        )
    summary(args, results, notes)
    return 1 if failed else 0


def ratios(shape: dict) -> tuple[float, float]:
    """A round's REST / COPY: (against one COPY process, against --clients processes); 0 unmeasured."""
    rest, par, single = shape["rest"], shape["par"], shape["single"]
    one = rest["rate"] / single["rate"] if single and single["rate"] else 0.0
    parallel = rest["rate"] / par["rate"] if par and par["rate"] else 0.0
    return one, parallel


def median_round(rounds: list[dict]) -> int:
    """The index of the round whose ratio to one COPY process is the median (the lower of two)."""
    order = sorted(range(len(rounds)), key=lambda i: ratios(rounds[i])[0])
    return order[(len(order) - 1) // 2]


def summary(args, results: dict[int, list[dict]], notes: list[str]) -> None:
    """The shapes side by side, round by round: REST against the COPY of the same rows by one process
    (the target's yardstick) and by --clients processes, and the verdict on the median round."""
    line = "-" * 74
    print()
    print(
        f"summary: REST / COPY of the same rows per shape and round; the target is {TARGET:.2f} x one COPY "
        f"process, judged on the median round ({args.clients} COPY processes for reference)"
    )
    print(line)
    for runs_per_batch, rounds in results.items():
        label = f"{runs_per_batch} runs per batch"
        for n, shape in enumerate(rounds, 1):
            rest, par, single = shape["rest"], shape["par"], shape["single"]
            if not par:
                print(f"{label:<22}round {n}  {rest['rate']:>8,.0f} events/s   (no ceiling measured)")
                continue
            one, parallel = ratios(shape)
            print(
                f"{label:<22}round {n}  {rest['rate']:>8,.0f} events/s   COPY {single['rate']:>7,.0f} rows/s: "
                f"{one:.2f} x   ({args.clients} processes {par['rate']:>7,.0f}: {parallel:.2f} x)"
            )
        if rounds and rounds[0]["par"]:
            one, parallel = ratios(rounds[median_round(rounds)])
            verdict = "meets" if one >= TARGET else "BELOW"
            print(
                f"{label:<22}median   {one:.2f} x one COPY process   {verdict} the target of {TARGET:.2f} x "
                f"({args.clients} processes: {parallel:.2f} x)"
            )
    # The issue asks a batch over 1,000 runs to do "like one that touches 20": the shapes' medians
    # side by side say what the runs cost, whatever the machine's COPY does that day.
    measured = {n: ratios(r[median_round(r)])[0] for n, r in results.items() if r and r[0]["par"]}
    if len(measured) > 1:
        base_shape = min(measured)
        for runs_per_batch, one in measured.items():
            if runs_per_batch != base_shape and measured[base_shape]:
                print(
                    f"{runs_per_batch} runs per batch against {base_shape}: {one / measured[base_shape]:.2f} "
                    f"of its ratio to COPY ({one:.2f} / {measured[base_shape]:.2f} x)"
                )
    print(line)
    for note in notes:
        print(f"note: {note}")
    print(
        f"note: the database {urlsplit(args.database_url).path.lstrip('/')} stays (ingest_event keeps the last "
        f"round's rows; {CEILING_TABLE} was emptied); the next run empties both first"
    )


def _ms(x: float) -> str:
    return f"{x * 1000:8.1f} ms"


def report(
    args, runs_per_batch, rest, par, single, pg_version, sync_commit, shared_buffers, idle_busy, rounds
) -> None:
    events_ok = rest["events"]
    mean_size = rest["bytes"] / max(1, sum(r["events"] for r in rest["ok"]))
    phase = rest["phase"]
    line = "-" * 74
    print()
    print(line)
    print(
        f"{f'loopwatch ingest benchmark: {runs_per_batch} runs per batch':<54}{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"
    )
    print(f"the median of {rounds} round(s) by REST / one COPY process" if rounds > 1 else "one round")
    print(line)
    print(
        f"environment      : {os.cpu_count()} cores, PostgreSQL {pg_version} (synchronous_commit={sync_commit}, "
        f"shared_buffers={shared_buffers}), Python {sys.version.split()[0]}"
    )
    print(
        f"load             : {args.events} events, mean {mean_size:.0f} bytes (orjson), batch {args.batch}, "
        f"clients {args.clients}, workers {args.workers}, "
        + (
            f"new connection every {args.reconnect_every} batches"
            if args.reconnect_every
            else "one connection each"
        )
    )
    warn = "   <-- OTHER LOAD: figures skewed" if idle_busy > 0.10 else ""
    print(
        f"background load  : {idle_busy:.0%} of the machine busy before the run (loadavg "
        f"{os.getloadavg()[0]:.2f} at the end){warn}"
    )
    print(line)
    print(f"{'REST ingest':<34}{rest['rate']:>10,.0f} events/s   ({events_ok} in {rest['wall']:.2f} s)")
    print(
        f"{'  batch latency p50 / p99':<34}{_ms(percentile(rest['latencies'], 0.5))} / "
        f"{_ms(percentile(rest['latencies'], 0.99)).strip()}"
    )
    if par:
        fk = " + FKs" if args.ceiling_fk else ""
        print(
            f"{f'COPY ceiling{fk}, {args.clients} processes':<34}{par['rate']:>10,.0f} rows/s     "
            f"({par['events']} in {par['wall']:.2f} s; txn p50 {_ms(percentile(par['latencies'], 0.5)).strip()})"
        )
        print(
            f"{f'COPY ceiling{fk}, 1 process':<34}{single['rate']:>10,.0f} rows/s     "
            f"({single['events']} in {single['wall']:.2f} s; txn p50 "
            f"{_ms(percentile(single['latencies'], 0.5)).strip()})"
        )
        ratio1, ratio = ratios({"rest": rest, "par": par, "single": single})
        verdict = "meets" if ratio1 >= TARGET else "BELOW"
        print(f"{'ratio REST / COPY (1 process)':<34}{ratio1:>10.0%}   {verdict} the target of {TARGET:.0%}")
        print(f"{f'ratio REST / COPY ({args.clients} processes)':<34}{ratio:>10.0%}   for reference")
    print(line)
    if events_ok:
        print(f"CPU per event    : {cpu_line(phase, events_ok, 'server workers', rest['client_cpu'])}")
        # Keep-alive connections stay on the worker that accepted them: few clients can load the
        # workers unevenly, and then one is saturated while another idles.
        split_s = " / ".join(f"{cpu:.1f}" for cpu in phase["per_worker_cpu"])
        cpus = phase["per_worker_cpu"]
        uneven = len(cpus) > 1 and min(cpus) < 0.5 * max(cpus)
        warn = "   <-- UNEVEN: connections landed unevenly on the workers" if uneven else ""
        print(f"worker CPU split : {split_s} s over {rest['wall']:.1f} s of wall time{warn}")
    if par:
        print(f"CPU per COPY row : {cpu_line(par['phase'], par['events'], None, par['client_cpu'])}")
    tasks, runs = rest["queued"]
    print(f"detection left in Redis: {tasks} task(s) queued, {runs:,} runs waiting (no worker runs here)")
    if rest["failed_batches"]:
        print(line)
        print(
            f"!!! FAILED: {rest['failed_batches']} batches ({rest['failed_events']} events) were not fully "
            "accepted — see the messages above !!!"
        )
    print(line)


if __name__ == "__main__":
    sys.exit(main())
