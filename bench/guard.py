"""Guard latency: POST /api/v1/runs/{run_id}/check at a fixed rate, beside a SELECT 1 through the same stack.

    .venv/bin/python bench/guard.py [--rates 50,300] [--seconds 20] [--runs 50] [--workers 2]
        [--database-url postgres://postgres@127.0.0.1:5432/loopwatch_bench_guard]
        [--redis-url redis://127.0.0.1:6379/13] [--port 8767] [--threads 8] [--writes 0.0]

1. Creates the bench database if missing, migrates it, empties runs and events (only in a
   database whose name holds "bench"), creates tenant `bench` and a key (scopes ingest, ledger).
2. Starts uvicorn (--workers) serving this file's `make_app`: loopwatch's own ASGI application
   with one route more, POST /bench/select1 — a DRF view with the same authentication and
   permission as the check (Bearer key, ingest scope) that runs only `SELECT 1`. It is the
   baseline: the same request path (uvicorn, Django, DRF, the key lookup) with the least
   database work. DEBUG off, REDIS_URL set (ingest queues detection tasks; nothing consumes
   them: the checks bring the runs up to date themselves).
3. Sends --runs runs of 30 tool calls each (run_started, rounds, calls and results: 28 distinct
   searches, then the same search twice in a row with the same result) and one check per run, which processes its events.
4. For each of --rates, two phases (select1, then check), each an open-loop load: requests are
   due at a fixed rate (that many per second for --seconds) and sent by --threads threads over keep-alive connections;
   the latency of each is counted from the moment it was due, not from when a thread got to it
   (a slow answer delays the next ones, and that delay counts). The checks propose reads, a
   third of them the repeated call (the `reuse` path, which reads the run's calls), the rest
   new arguments (`allow`), and --writes of them a write with a fresh key (a ledger claim).
   Every answer must be 200 (and a check's decision allow, reuse, correct or execute).
5. Prints p50/p90/p99/max and the rate achieved for both at each rate, the target (check p99 <
   10 ms at 300/s), and the machine's background load (other processes make every figure worse).
   A low rate shows the cost of one request; the target rate adds the queueing of a busy server.

Exits 1 when a request failed, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
TARGET_P99_MS = 10.0
TARGET_RATE = 300.0
CALLS_PER_RUN = 30
HOST = "127.0.0.1"


# --- the server side: loopwatch plus the baseline route ---------------------------------------------


def make_app():
    """uvicorn --factory: loopwatch's ASGI app with POST /bench/select1 added to its URLconf."""
    # uvicorn --app-dir put bench/ first on the path, where bench/ingest.py would shadow the app.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")
    import django

    django.setup()  # before anything that imports models

    from django.db import connection
    from django.http import HttpResponse
    from django.urls import clear_url_caches, path
    from rest_framework.views import APIView

    from ingest.auth import HasIngestScope
    from loopwatch import urls
    from loopwatch.asgi import application

    class Select1Api(APIView):
        """The baseline: authentication, permission, one SELECT 1, a small JSON answer."""

        permission_classes = [HasIngestScope]
        parser_classes: list = []

        def post(self, request):
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                (one,) = cursor.fetchone()
            return HttpResponse(b'{"one": %d}' % one, content_type="application/json")

    urls.urlpatterns.append(path("bench/select1", Select1Api.as_view()))
    clear_url_caches()
    return application


# --- the driver ----------------------------------------------------------------------------------------


def _request(conn: http.client.HTTPConnection, path: str, body: bytes, key: str) -> tuple[int, bytes]:
    conn.request(
        "POST",
        path,
        body=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    return response.status, response.read()


def seed_runs(port: int, key: str, runs: int, prefix: str) -> list[str]:
    """runs of CALLS_PER_RUN calls each, sent through the API; the run ids."""
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    run_ids = []
    for r in range(runs):
        run_id = f"{prefix}-{r}"
        run_ids.append(run_id)
        ts = "2026-11-29T10:00:00Z"
        events: list[dict[str, Any]] = [
            {"type": "run_started", "run_id": run_id, "ts": ts, "agent": "bench", "backend": "openai"}
        ]
        for n in range(1, CALLS_PER_RUN + 1):
            # Distinct searches that each find something, then the same search twice in a row.
            repeat = n > CALLS_PER_RUN - 2
            args = {"customer": "42", "status": "open"} if repeat else {"query": f"order {r}-{n}", "page": 1}
            result = {"orders": ["o42"]} if repeat else {"hits": [f"{r}-{n}"]}
            events += [
                {"type": "model_round", "run_id": run_id, "ts": ts, "round": n, "input_tokens": 900, "output_tokens": 40},
                {"type": "tool_call", "run_id": run_id, "ts": ts, "round": n, "call_id": f"c{n}",
                 "tool": "search_orders", "kind": "read", "args": args},
                {"type": "tool_result", "run_id": run_id, "ts": ts, "call_id": f"c{n}", "status": "ok", "result": result},
            ]  # fmt: skip
        status, body = _request(conn, "/api/v1/events", json.dumps(events).encode(), key)
        if status != 200:
            raise RuntimeError(f"seeding {run_id}: HTTP {status}: {body[:300]!r}")
    conn.close()
    return run_ids


def check_body(rng: random.Random, i: int, writes: float, prefix: str) -> bytes:
    ts = "2026-11-29T10:01:00Z"
    if rng.random() < writes:
        body = {"tool": "refund", "kind": "write", "args": {"order": f"o{i}", "amount": 10},
                "operation_key": f"{prefix}-w{i}", "worker_id": "bench", "ts": ts}  # fmt: skip
    elif rng.random() < 1 / 3:
        body = {
            "tool": "search_orders",
            "kind": "read",
            "args": {"customer": "42", "status": "open"},
            "ts": ts,
        }
    else:
        body = {"tool": "search_orders", "kind": "read", "args": {"query": f"new {i}", "page": 1}, "ts": ts}
    return json.dumps(body).encode()


def load(
    port: int, key: str, requests: list[tuple[str, bytes]], rate: float, threads: int, check: bool
) -> dict[str, Any]:
    """Send requests[i] due at start + i / rate from `threads` threads; latencies from the due time."""
    latencies: list[float] = []
    failures: list[str] = []
    decisions: dict[str, int] = {}
    lock = threading.Lock()
    counter = iter(range(len(requests)))
    start = time.perf_counter() + 0.2

    def worker() -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=30)
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            due = start + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            path, body = requests[i]
            try:
                status, answer = _request(conn, path, body, key)
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = http.client.HTTPConnection(HOST, port, timeout=30)
                with lock:
                    failures.append(f"{path}: {type(exc).__name__}: {exc}")
                continue
            took = time.perf_counter() - due
            decision = json.loads(answer).get("decision", "") if check and status == 200 else ""
            with lock:
                latencies.append(took)
                if status != 200 or (check and decision not in ("allow", "reuse", "correct", "execute")):
                    failures.append(f"{path}: HTTP {status} {answer[:200]!r}")
                decisions[decision] = decisions.get(decision, 0) + 1
        conn.close()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    wall = time.perf_counter() - start
    return {
        "latencies": latencies,
        "failures": failures,
        "rate": len(latencies) / wall,
        "decisions": decisions,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--rates",
        default="50,300",
        help="comma-separated request rates per second, each a phase pair (default 50,300)",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--runs", type=int, default=50, help="runs the checks are spread over")
    parser.add_argument("--threads", type=int, default=8, help="client threads (keep-alive connections)")
    parser.add_argument("--writes", type=float, default=0.0, help="share of checks that are writes (0..1)")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_bench_guard")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--port", type=int, default=8767)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if "bench" not in urlsplit(args.database_url).path:
        parser.error("--database-url: its name must contain 'bench' (its runs and events are emptied)")
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        parser.error("--rates: comma-separated numbers, like 50,300")
    if not 0 <= args.writes <= 1 or not rates or min(rates) <= 0 or args.runs < 1:
        parser.error("--writes 0..1, --rates > 0, --runs >= 1")
    sys.path.insert(0, str(ROOT))
    from bench import harness as bi

    signal.signal(signal.SIGTERM, bi.interrupted)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    rng = random.Random(seed)
    prefix = f"gb-{seed:08x}"
    env = bi.server_env(argparse.Namespace(database_url=args.database_url, redis_url=args.redis_url))
    server = log = None
    try:
        if not bi.port_free(args.port):
            raise bi.SetupError(f"port {args.port} on {HOST} is in use")
        bi.ensure_database(args.database_url)
        bi.manage(env, "migrate", "--noinput", "-v", "0")
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute("TRUNCATE ingest_event, ingest_run, ingest_operation RESTART IDENTITY CASCADE")
            pg_version = conn.execute("SHOW server_version").fetchone()[0]
        key = bi.manage(
            env, "create_api_key", "bench", "--scopes", "ingest,ledger", "--name", "guard-bench"
        ).strip()
        idle_busy = bi.background_load()
        log = open(f"/tmp/loopwatch-bench-guard-{args.port}.log", "w")
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "uvicorn"), "--factory", "--app-dir", str(ROOT / "bench"),
             "guard:make_app", "--host", HOST, "--port", str(args.port), "--workers", str(args.workers),
             "--log-level", "warning", "--no-access-log"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise bi.SetupError(f"uvicorn did not start; see {log.name}")
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection(HOST, args.port, timeout=2)
                if _request(conn, "/bench/select1", b"", key)[0] == 200:
                    conn.close()
                    break
            time.sleep(0.25)
        time.sleep(2.0)  # the other worker boots too

        run_ids = seed_runs(args.port, key, args.runs, prefix)
        warm = [(f"/api/v1/runs/{r}/check", check_body(rng, i, 0, prefix)) for i, r in enumerate(run_ids * 2)]
        load(args.port, key, warm, 100.0, args.threads, True)  # processes each run's events once
        phases = []
        for rate in rates:
            total = int(rate * args.seconds)
            print(f"select1: {total} requests at {rate:g}/s ...", flush=True)
            base = load(args.port, key, [("/bench/select1", b"")] * total, rate, args.threads, False)
            checks = [
                (f"/api/v1/runs/{rng.choice(run_ids)}/check", check_body(rng, i, args.writes, prefix))
                for i in range(total)
            ]
            print(f"check: {total} requests at {rate:g}/s ...", flush=True)
            phases.append((rate, base, load(args.port, key, checks, rate, args.threads, True)))
    except bi.SetupError as exc:
        print(f"SETUP ERROR: {exc}", file=sys.stderr)
        return 2
    finally:
        if server is not None and server.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        if log is not None:
            log.close()
        with contextlib.suppress(Exception):
            bi.redis_purge(args.redis_url)

    def row(name: str, r: dict[str, Any]) -> str:
        ms = [x * 1000 for x in r["latencies"]]
        return (
            f"{name:<22} {r['rate']:>7.1f}/s  p50 {percentile(ms, 0.5):6.2f}  p90 {percentile(ms, 0.9):6.2f}  "
            f"p99 {percentile(ms, 0.99):6.2f}  max {max(ms, default=float('nan')):7.2f} ms  failed {len(r['failures'])}"
        )

    print()
    print(f"guard bench: {args.seconds:g} s per phase, {args.threads} client threads, uvicorn --workers {args.workers}, "
          f"{args.runs} runs of {CALLS_PER_RUN} calls, writes {args.writes:.0%}; latency from the time each request was due")  # fmt: skip
    print(f"environment : {os.cpu_count()} cores, PostgreSQL {pg_version}, Python {sys.version.split()[0]}, "
          f"background load before the run {idle_busy:.0%} of the machine")  # fmt: skip
    failures = []
    for rate, base, result in phases:
        print(f"at {rate:g}/s:")
        print("  " + row("SELECT 1 (same stack)", base))
        print("  " + row("check", result))
        print(f"  decisions: {', '.join(f'{k} {v}' for k, v in sorted(result['decisions'].items()))}")
        failures += base["failures"] + result["failures"]
    at_target = [p for p in phases if p[0] >= TARGET_RATE]
    if at_target:
        rate, base, result = at_target[0]
        p99 = percentile([x * 1000 for x in result["latencies"]], 0.99)
        p99_base = percentile([x * 1000 for x in base["latencies"]], 0.99)
        verdict = "met" if p99 < TARGET_P99_MS and result["rate"] >= 0.95 * rate else "NOT met"
        print(f"target      : check p99 < {TARGET_P99_MS:g} ms at {TARGET_RATE:g}/s: {verdict} "
              f"(p99 {p99:.2f} ms; the SELECT 1 path alone {p99_base:.2f} ms)")  # fmt: skip
    for failure in failures[:10]:
        print(f"  failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
