"""Ledger benchmark: claim + complete operations/s over HTTP, beside the raw INSERT ... ON CONFLICT rate.

    .venv/bin/python bench/ledger.py [--ops 2000] [--clients 1,4] [--workers 2]
        [--database-url postgres://postgres@127.0.0.1:5432/loopwatch_bench] [--port 8766]

1. Creates the bench database if missing, migrates it, empties the ledger tables (only in a
   database whose name holds "bench"), creates tenant `bench` and a key (scopes ledger, read).
2. Starts uvicorn (--workers) on 127.0.0.1:PORT with DEBUG off, a random SECRET_KEY,
   LOG_LEVEL=WARNING and no REDIS_URL (claim and complete queue no task), waits until it answers.
3. For each --clients count C: C processes (loopwatch_client.LedgerClient, one keep-alive
   connection each) claim a fresh key and complete it `succeeded`, --ops operations in all,
   after a warm-up; every claim must answer `execute` and every completion SUCCEEDED.
4. Stops the server, then the raw rate: `CREATE TABLE bench_claims (LIKE ingest_operation
   INCLUDING ALL)` and, for each C, C psycopg processes doing the claim's INSERT ... ON CONFLICT
   (tenant_id, operation_key) DO NOTHING RETURNING id + COMMIT, one per claim, --ops in all.
5. Prints the table (ops/s, claim and complete p50/p99, raw claims/s, ratio against the targets:
   >= 50 % of the raw rate, p99 < 25 ms), drops bench_claims.

The server and the raw phase share helpers with bench/ingest.py (loaded from its file).
Exits 1 when an operation failed, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # loopwatch_client, also in the spawned client processes

from bench import harness as bi  # noqa: E402 - the database, server and figure helpers
from loopwatch_client import LedgerClient  # noqa: E402 - needs ROOT on the path

HOST = bi.HOST
TENANT = "bench"
TOOL = "create_refund"
RAW_TABLE = "bench_claims"
TARGET_RATIO = 0.50  # ledger claim+complete ops/s over raw INSERT ... ON CONFLICT claims/s
TARGET_P99_S = 0.025
WARMUP_OPS = 20


def _args(rng: random.Random, n: int) -> dict[str, Any]:
    return {
        "order_id": f"ord_{rng.randrange(10**8):08d}",
        "amount": round(rng.uniform(5, 300), 2),
        "currency": "EUR",
        "reason": f"damaged item {n}, customer asked twice",
    }


def ledger_client(idx: int, cfg: dict, key: str, barrier, out_q) -> None:
    """Claim a fresh key and complete it, op after op; report latencies of each call."""
    try:
        rng = random.Random(cfg["seed"] * 7919 + idx)
        prefix = f"{cfg['prefix']}-c{cfg['clients']}-{idx}"
        ops = [(f"{prefix}-{n}", _args(rng, n)) for n in range(cfg["per_client"][idx])]
        warm = [(f"{prefix}-warm-{n}", _args(rng, n)) for n in range(WARMUP_OPS)]
        result = {"refund_id": "re_" + "x" * 24, "status": "succeeded", "amount": 10.5}
        client = LedgerClient(f"http://{HOST}:{cfg['port']}", key, worker_id=f"bench-{idx}", timeout=30)
        for op_key, args in warm:
            claim = client.claim(operation_key=op_key, tool=TOOL, args=args, lease_s=60, attempt_id=op_key)
            client.complete(op_key, outcome="succeeded", result=result, attempt=claim.attempt)

        barrier.wait(timeout=cfg["timeout"])
        cpu0 = time.process_time()
        first = time.monotonic()
        claim_lat: list[float] = []
        complete_lat: list[float] = []
        failures: list[str] = []
        for op_key, args in ops:
            t0 = time.monotonic()
            try:
                # As invoke_once does: an attempt id on the claim, the fencing token on the completion.
                claim = client.claim(
                    operation_key=op_key, tool=TOOL, args=args, lease_s=60, attempt_id=op_key
                )
                t1 = time.monotonic()
                if claim.decision != "execute":
                    failures.append(f"{op_key}: claim answered {claim.decision}")
                    continue
                state = client.complete(op_key, outcome="succeeded", result=result, attempt=claim.attempt)
                t2 = time.monotonic()
            except Exception as exc:
                failures.append(f"{op_key}: {type(exc).__name__}: {exc}")
                continue
            if state.get("status") != "SUCCEEDED":
                failures.append(f"{op_key}: completed as {state.get('status')}")
                continue
            claim_lat.append(t1 - t0)
            complete_lat.append(t2 - t1)
        out_q.put(
            {
                "idx": idx,
                "first": first,
                "last": time.monotonic(),
                "ops": len(claim_lat),
                "claim": claim_lat,
                "complete": complete_lat,
                "failures": failures,
                "cpu": time.process_time() - cpu0,
            }
        )
    except BaseException as exc:
        with contextlib.suppress(Exception):
            barrier.abort()
        out_q.put({"idx": idx, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})


RAW_INSERT = """
INSERT INTO {table} (tenant_id, operation_key, tool, fingerprint, args, status, lease_owner,
    lease_expires_at, attempts, attempt_id, external_request_id, result_digest, error_class, source,
    call_id, step_id, executions, needs_person, unverified, reconcile_attempts, created_at, updated_at)
VALUES (%s, %s, %s, %s, %s::jsonb, 'RUNNING', %s, now() + interval '60 seconds', 1, %s, '', '', '',
    'api', '', '', 0, false, false, 0, now(), now())
ON CONFLICT (tenant_id, operation_key) DO NOTHING RETURNING id
"""


def raw_client(idx: int, cfg: dict, tenant_id: int, barrier, out_q) -> None:
    """The claim's INSERT ... ON CONFLICT DO NOTHING + COMMIT, one per claim, nothing else."""
    try:
        import orjson

        rng = random.Random(cfg["seed"] * 7919 + idx)
        prefix = f"{cfg['prefix']}-raw-c{cfg['clients']}-{idx}"
        rows = [
            (
                tenant_id,
                f"{prefix}-{n}",
                TOOL,
                f"{rng.getrandbits(256):064x}",
                orjson.dumps(_args(rng, n)).decode(),
            )
            for n in range(cfg["per_client"][idx] + WARMUP_OPS)
        ]
        warm, rows = rows[:WARMUP_OPS], rows[WARMUP_OPS:]
        query = sql.SQL(RAW_INSERT).format(table=sql.Identifier(RAW_TABLE))
        with psycopg.connect(cfg["database_url"]) as conn:
            for row in warm:
                conn.execute(query, (*row[:4], row[4], f"raw-{idx}", row[1]))
                conn.commit()
            barrier.wait(timeout=cfg["timeout"])
            cpu0 = time.process_time()
            first = time.monotonic()
            latencies: list[float] = []
            failures: list[str] = []
            for row in rows:
                t0 = time.monotonic()
                inserted = conn.execute(query, (*row[:4], row[4], f"raw-{idx}", row[1])).fetchone()
                conn.commit()
                latencies.append(time.monotonic() - t0)
                if inserted is None:
                    failures.append(f"{row[1]}: not inserted")
            last = time.monotonic()
        out_q.put(
            {
                "idx": idx,
                "first": first,
                "last": last,
                "ops": len(latencies) - len(failures),
                "claim": latencies,
                "complete": [],
                "failures": failures,
                "cpu": time.process_time() - cpu0,
            }
        )
    except BaseException as exc:
        with contextlib.suppress(Exception):
            barrier.abort()
        out_q.put({"idx": idx, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})


def summarise(phase: dict, expected: int) -> dict:
    ok = [r for r in phase["reports"] if "error" not in r]
    errors = [r["error"] for r in phase["reports"] if "error" in r]
    failures = [f for r in ok for f in r["failures"]]
    ops = sum(r["ops"] for r in ok)
    wall = (max(r["last"] for r in ok) - min(r["first"] for r in ok)) if ok else 0.0
    return {
        "rate": ops / wall if wall > 0 else 0.0,
        "wall": wall,
        "ops": ops,
        "missing": expected - ops,
        "claim": [x for r in ok for x in r["claim"]],
        "complete": [x for r in ok for x in r["complete"]],
        "errors": errors,
        "failures": failures,
        "client_cpu": sum(r["cpu"] for r in ok),
        "phase": phase,
    }


def count_stored(url: str, prefix: str) -> tuple[int, int]:
    """(SUCCEEDED operations, their transitions) of this run's timed keys."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT count(DISTINCT o.id), count(t.id) FROM ingest_operation o "
            "JOIN ingest_operationtransition t ON t.operation_id = o.id "
            "WHERE o.status = 'SUCCEEDED' AND o.operation_key LIKE %s AND o.operation_key NOT LIKE %s",
            (prefix + "-c%", "%-warm-%"),
        ).fetchone()


def _ms(values: list[float], q: float) -> str:
    return f"{bi.percentile(values, q) * 1000:.1f}" if values else "-"


def report(args, rows: list[dict], env_line: str, idle_busy: float, notes: list[str]) -> None:
    line = "-" * 100
    print()
    print(line)
    print(f"{'loopwatch ledger benchmark':<60}{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC")
    print(line)
    print(env_line)
    warn = "   <-- OTHER LOAD: figures skewed" if idle_busy > 0.10 else ""
    print(f"background load  : {idle_busy:.0%} of the machine busy before the run{warn}")
    print(f"load             : {args.ops} claim+complete per client count, uvicorn --workers {args.workers}")
    print(line)
    print(
        f"{'clients':>7} | {'ledger ops/s':>12} | {'claim p50 / p99 ms':>18} | {'complete p50 / p99 ms':>21} | "
        f"{'raw claims/s':>12} | {'ratio':>6} | verdict"
    )
    print(line)
    for row in rows:
        led, raw = row["ledger"], row["raw"]
        ratio = led["rate"] / raw["rate"] if raw and raw["rate"] else None
        p99 = max(bi.percentile(led["claim"], 0.99), bi.percentile(led["complete"], 0.99))
        verdicts = []
        if ratio is not None:
            verdicts.append(f"ratio {'meets' if ratio >= TARGET_RATIO else 'BELOW'} {TARGET_RATIO:.0%}")
        verdicts.append(f"p99 {'meets' if p99 < TARGET_P99_S else 'ABOVE'} {TARGET_P99_S * 1000:.0f} ms")
        claim = f"{_ms(led['claim'], 0.5)} / {_ms(led['claim'], 0.99)}"
        complete = f"{_ms(led['complete'], 0.5)} / {_ms(led['complete'], 0.99)}"
        raw_rate = f"{raw['rate']:,.0f}" if raw else "-"
        ratio_s = f"{ratio:.0%}" if ratio is not None else "-"
        print(
            f"{row['clients']:>7} | {led['rate']:>12,.0f} | {claim:>18} | {complete:>21} | "
            f"{raw_rate:>12} | {ratio_s:>6} | {', '.join(verdicts)}"
        )
    print(line)
    for row in rows:
        led, raw = row["ledger"], row["raw"]
        if led["ops"]:
            print(
                f"CPU per op, {row['clients']} client(s): "
                + bi.cpu_line(led["phase"], led["ops"], "server workers", led["client_cpu"])
            )
        if raw and raw["ops"]:
            print(
                f"CPU per raw claim, {row['clients']} client(s): "
                + bi.cpu_line(raw["phase"], raw["ops"], None, raw["client_cpu"])
                + f"; txn p50 {_ms(raw['claim'], 0.5)} ms, p99 {_ms(raw['claim'], 0.99)} ms"
            )
    print(line)
    for note in notes:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--ops", type=int, default=2000, help="claim+complete operations per client count")
    parser.add_argument("--clients", default="1,4", help="comma-separated client counts (default 1,4)")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_bench")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--timeout", type=float, default=600.0, help="hard limit in seconds for each phase")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--skip-raw", action="store_true", help="only the ledger phases")
    parser.add_argument("--app", default="loopwatch.asgi:application", help="the ASGI app uvicorn serves")
    args = parser.parse_args(argv)
    try:
        counts = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        parser.error("--clients: comma-separated integers, like 1,4")
    if not counts or min(counts) < 1 or args.workers < 1 or args.ops < max(counts):
        parser.error("--clients >= 1, --workers >= 1, --ops at least the largest client count")
    db_name = urlsplit(args.database_url).path.lstrip("/")
    if "bench" not in db_name:
        parser.error(f"--database-url: {db_name!r} would be emptied; its name must contain 'bench'")

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, bi.interrupted)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    prefix = f"lb-{seed:08x}"
    env = bi.server_env(argparse.Namespace(database_url=args.database_url, redis_url=""))
    env.pop("REDIS_URL", None)  # eager Celery: claim and complete queue nothing anyway
    rows: list[dict] = []
    notes: list[str] = []
    failed = 0
    server = None
    try:
        if not bi.port_free(args.port):
            raise bi.SetupError(f"port {args.port} on {HOST} is in use")
        bi.ensure_database(args.database_url)
        bi.manage(env, "migrate", "--noinput", "-v", "0")
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute("TRUNCATE ingest_operation, ingest_operationtransition RESTART IDENTITY CASCADE")
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(RAW_TABLE)))
        key = bi.manage(env, "create_api_key", TENANT, "--scopes", "ledger,read", "--name", "bench").strip()
        with psycopg.connect(args.database_url) as conn:
            tenant_id = conn.execute("SELECT id FROM ingest_tenant WHERE slug = %s", (TENANT,)).fetchone()[0]
            settings_shown = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("server_version", "synchronous_commit", "shared_buffers")
            }
        env_line = (
            f"environment      : {os.cpu_count()} cores, PostgreSQL {settings_shown['server_version']} "
            f"(synchronous_commit={settings_shown['synchronous_commit']}, shared_buffers="
            f"{settings_shown['shared_buffers']}), Python {sys.version.split()[0]}"
        )
        idle_busy = bi.background_load()

        # --- the ledger over HTTP ---
        server_args = argparse.Namespace(port=args.port, workers=args.workers, app=args.app)
        server = bi.Server(server_args, env, key)
        server.wait_ready()
        workers = server.worker_pids()
        for clients in counts:
            cfg = {
                "seed": seed,
                "prefix": prefix,
                "clients": clients,
                "per_client": bi.split(args.ops, clients),
                "port": args.port,
                "timeout": args.timeout,
                "database_url": args.database_url,
            }
            bi.checkpoint(args.database_url)
            print(
                f"ledger: {args.ops} claim+complete, {clients} client(s), {args.workers} workers ...",
                flush=True,
            )
            phase = bi.run_phase(
                ledger_client, [(i, cfg, key) for i in range(clients)], args.timeout, workers
            )
            rows.append({"clients": clients, "ledger": summarise(phase, args.ops), "raw": None, "cfg": cfg})
        server.stop()
        server = None
        stored, transitions = count_stored(args.database_url, prefix)
        expected = sum(row["ledger"]["ops"] for row in rows)
        if (stored, transitions) != (expected, 2 * expected):
            failed += 1
            notes.append(
                f"stored {stored} SUCCEEDED operations / {transitions} transitions, expected {expected} / {2 * expected}"
            )
        else:
            notes.append(f"checked: {stored} operations SUCCEEDED with 2 transitions each")

        # --- the raw claim ---
        if not args.skip_raw:
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE TABLE {} (LIKE ingest_operation INCLUDING ALL)").format(
                        sql.Identifier(RAW_TABLE)
                    )
                )
            for row in rows:
                bi.checkpoint(args.database_url)
                print(f"raw INSERT ... ON CONFLICT: {row['clients']} client(s) ...", flush=True)
                jobs = [(i, row["cfg"], tenant_id) for i in range(row["clients"])]
                row["raw"] = summarise(bi.run_phase(raw_client, jobs, args.timeout), args.ops)
        for row in rows:
            for part in ("ledger", "raw"):
                result = row[part]
                if result is None:
                    continue
                for err in result["errors"]:
                    print(f"  {part} client error: {err}", file=sys.stderr)
                for failure in result["failures"][:10]:
                    print(f"  {part}: {failure}", file=sys.stderr)
                if result["errors"] or result["failures"] or result["missing"]:
                    failed += 1
                    notes.append(
                        f"{part}, {row['clients']} client(s): {result['missing']} of {args.ops} operations "
                        "failed or missing"
                    )
    except bi.SetupError as exc:
        print(f"SETUP ERROR: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"INTERRUPTED ({exc or 'Ctrl-C'}): server stopped, clean-up done", file=sys.stderr)
        return 130
    finally:
        if server is not None:
            server.stop()
        with contextlib.suppress(Exception):
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(RAW_TABLE)))

    notes.append(
        "ledger op = POST claim (execute) + POST complete (succeeded), 2 transactions; "
        "raw = INSERT ... ON CONFLICT DO NOTHING + COMMIT only (no auth, no HTTP, no history row)"
    )
    report(args, rows, env_line, idle_busy, notes)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
