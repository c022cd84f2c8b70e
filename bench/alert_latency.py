"""Alert latency: from the ingest request that completes a loop to the alert on a signed-in page's socket.

    .venv/bin/python bench/alert_latency.py [--rate 2000] [--duration 60] [--probe-every 0.5]
        [--database-url postgres://postgres@127.0.0.1:5432/loopwatch_alert_bench]
        [--redis-url redis://127.0.0.1:6379/13] [--port 8766] [--workers 2] [--concurrency 2]

1. Creates the bench database if missing, migrates it, empties the run tables (only in a database
   whose name holds "bench"), creates a tenant, an ingest key, and an operator who can sign in.
2. Starts uvicorn (--workers, HTTP + WebSocket, Redis channel layer) and a Celery worker
   (--concurrency, prefork) on a queue of its own, as in production, and waits until they answer.
3. Signs in like a browser (GET the login page, POST the form with its CSRF token, keep the
   session cookie) and opens /ws/alerts with that cookie.
4. Background load: --load-clients processes post realistic traffic (bench/ingest.py's generator:
   interleaved runs, all event types, ~600 bytes an event) at --rate events/s in total, batches of
   --batch, paced on a schedule (a late batch goes at once; the rate reached is printed).
5. Probes, every --probe-every s once the load has run --warm-up s: a new run that repeats one
   call three times with the same answer, sent in one request (10 events); its correction is
   the alert. Latency = the alert's arrival on the socket - the moment before the request was
   sent (one process, one monotonic clock). A probe without its alert within --timeout is lost.
6. Stops everything (also on error or Ctrl-C), flushes the Redis db, prints the table.

Exits 0 when the p95 is under the target and no probe was lost, 1 otherwise, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import multiprocessing as mp
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `ingest` is the package, not bench/ingest.py beside this script
HOST = "127.0.0.1"
TENANT = "bench"  # bench/ingest.py's generator names this tenant in run_started
USERNAME = "bench-operator"
TARGET_P95_S = 1.0


from bench import harness as B  # noqa: E402 - the database and server helpers
from bench.ingest import client_stream  # noqa: E402 - the ingest bench's trace generator

# --- background load ----------------------------------------------------------------------------


def sim_stream(seed: int, n_events: int, pool: int, prefix: str) -> list[dict]:
    """`manage.py simulate`'s traffic (the scenario mix: ordinary runs, loops, legitimate repeats,
    budgets, writes that time out), `pool` runs interleaved, a finished run replaced by a new one."""
    from demo.simulation import run_generate

    rng = random.Random(seed)
    start = datetime.now(UTC)
    made = 0

    def new_run():
        nonlocal made
        made += 1
        return iter(run_generate(rng, start, run_prefix=f"{prefix}-{made}").events)

    active = [new_run() for _ in range(pool)]
    out: list[dict] = []
    while len(out) < n_events:
        slot = rng.randrange(pool)
        event = next(active[slot], None)
        if event is None:
            active[slot] = new_run()
            continue
        out.append(event)
    return out


def load_client(idx: int, cfg: dict, key: str, ready, start_at, out_q) -> None:
    try:
        _load_client(idx, cfg, key, ready, start_at, out_q)
    except BaseException as exc:
        out_q.put({"client": idx, "events": 0, "failed": 0, "late": 0, "seconds": 0.0, "error": repr(exc)})
        raise


def _load_client(idx: int, cfg: dict, key: str, ready, start_at, out_q) -> None:
    """Post pre-serialised batches on a fixed schedule until the deadline; report what was sent."""
    per_client = cfg["rate"] / cfg["clients"]
    n_events = int(per_client * (cfg["duration"] + 5))
    prefix = f"load{cfg['seed']}-c{idx}"
    if cfg["traffic"] == "sim":
        events = sim_stream(cfg["seed"] * 7919 + idx, n_events, cfg["pool"], prefix)
    else:
        events = [e for _, e in client_stream(cfg["seed"], idx, n_events, cfg["pool"], prefix)]
    batch = cfg["batch"]
    bodies = [orjson.dumps(events[i : i + batch]) for i in range(0, len(events) - batch + 1, batch)]
    interval = batch / per_client
    conn = http.client.HTTPConnection(HOST, cfg["port"], timeout=60)
    ready.wait()  # every client has built its batches; the main process then sets the start
    while start_at.value == 0.0 or time.time() < start_at.value:
        time.sleep(0.001)
    sent = failed = late = 0
    first = time.time()
    deadline = first + cfg["duration"]
    for i, body in enumerate(bodies):
        due = first + i * interval
        if due >= deadline:
            break
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        elif delay < -interval:
            late += 1
        try:
            status, _ = B._post(conn, body, key)
        except OSError:
            conn.close()
            conn = http.client.HTTPConnection(HOST, cfg["port"], timeout=60)
            status = 0
        if status == 200:
            sent += batch
        else:
            failed += 1
    out_q.put({"client": idx, "events": sent, "failed": failed, "late": late, "seconds": time.time() - first})


# --- the page's socket and the probes ------------------------------------------------------------


def probe_events(run_id: str) -> bytes:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    events = [
        {
            "type": "run_started",
            "run_id": run_id,
            "ts": now,
            "agent": "probe",
            "backend": "openai",
            "model": "gpt-4o",
        }
    ]
    for i in range(1, 4):
        events += [
            {
                "type": "model_round",
                "run_id": run_id,
                "ts": now,
                "round": i,
                "input_tokens": 900,
                "output_tokens": 40,
            },
            {
                "type": "tool_call",
                "run_id": run_id,
                "ts": now,
                "round": i,
                "call_id": f"c{i}",
                "tool": "search_orders",
                "kind": "read",
                "args": {"customer": "42", "status": "open"},
            },
            {
                "type": "tool_result",
                "run_id": run_id,
                "ts": now,
                "call_id": f"c{i}",
                "status": "ok",
                "result": {"orders": []},
            },
        ]
    return orjson.dumps(events)


async def probe_loop(args, key: str, cookie: str, load_started: float) -> dict:
    """Send the probes and time their alerts. The socket reconnects as the page does, from the last
    alert id it saw (catch-up); a probe whose alert came by catch-up counts with its arrival time."""
    import websockets

    arrivals: dict[str, float] = {}
    got = asyncio.Event()
    counts = {"other_alerts": 0, "reconnects": 0, "caught_up": 0}
    last_id = 0

    def note(alert: dict, now: float, *, caught_up: bool) -> None:
        nonlocal last_id
        last_id = max(last_id, alert["id"])
        run_id = alert["run_id"]
        if run_id.startswith("probe-"):
            if run_id not in arrivals:
                arrivals[run_id] = now
                counts["caught_up"] += caught_up
                got.set()
        else:
            counts["other_alerts"] += 1

    async def listen() -> None:
        while True:
            query = f"?after={last_id}" if last_id else ""
            url = f"ws://{HOST}:{args.port}/ws/alerts{query}"
            try:
                async with websockets.connect(
                    url,
                    origin=f"http://{HOST}:{args.port}",  # as the page does: other origins are refused
                    additional_headers={"Cookie": cookie},
                    max_queue=None,
                ) as ws:
                    async for raw in ws:
                        now = time.perf_counter()
                        message = orjson.loads(raw)
                        if message.get("type") == "alert":
                            note(message["alert"], now, caught_up=False)
                        elif message.get("type") == "catch_up":
                            for alert in message["alerts"]:
                                note(alert, now, caught_up=True)
            except (OSError, websockets.WebSocketException):
                pass
            counts["reconnects"] += 1
            await asyncio.sleep(0.5)

    listener = asyncio.ensure_future(listen())
    conn = http.client.HTTPConnection(HOST, args.port, timeout=30)
    sent: dict[str, tuple[float, float]] = {}
    await asyncio.sleep(max(0.0, load_started + args.warm_up - time.time()))
    stop_at = load_started + args.duration - 1.0
    n = 0
    while time.time() < stop_at:
        run_id = f"probe-{args.seed}-{n}"
        body = probe_events(run_id)
        t0 = time.perf_counter()
        status, _ = await asyncio.to_thread(B._post, conn, body, key)
        t_ack = time.perf_counter()
        if status == 200:
            sent[run_id] = (t0, t_ack)
        n += 1
        await asyncio.sleep(max(0.0, args.probe_every - (time.perf_counter() - t0)))
    deadline = time.perf_counter() + args.timeout
    while time.perf_counter() < deadline and not set(sent) <= set(arrivals):
        got.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(got.wait(), timeout=0.5)
    listener.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await listener
    conn.close()
    latencies = [arrivals[r] - t0 for r, (t0, _) in sent.items() if r in arrivals]
    after_ack = [arrivals[r] - t_ack for r, (_, t_ack) in sent.items() if r in arrivals]
    acks = [t_ack - t0 for t0, t_ack in sent.values()]
    return {
        "probes": len(sent),
        "lost": len(set(sent) - set(arrivals)),
        "latencies": latencies,
        "after_ack": after_ack,
        "acks": acks,
        **counts,
    }


# --- set-up -------------------------------------------------------------------------------------


class Worker:
    """A Celery worker in a session of its own; stop() ends that process group (and only it)."""

    def __init__(self, args, env: dict[str, str]) -> None:
        self.log_path = Path(f"/tmp/loopwatch-bench-alert-worker-{args.port}.log")
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "loopwatch", "worker", "-c", str(args.concurrency)),
                *("-Q", env["CELERY_QUEUE"], "-n", f"{env['CELERY_QUEUE']}@%h", "-l", "WARNING"),
                *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        B.stop_group(self.proc, timeout=20)
        self.log.close()


def detection_backlog(url: str) -> tuple[int, int, int]:
    """(runs whose events detection has not all processed, events waiting, events processed)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE c.position < r.events_count), "
            "coalesce(sum(r.events_count - c.position), 0), coalesce(sum(c.position), 0) "
            "FROM ingest_run r JOIN ingest_runcursor c ON c.run_id = r.id"
        ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def _ms(x: float) -> str:
    return f"{x * 1000:,.0f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rate", type=float, default=2000, help="background events/s in all")
    parser.add_argument("--duration", type=float, default=60, help="seconds of load")
    parser.add_argument("--warm-up", type=float, default=5, help="seconds of load before the first probe")
    parser.add_argument("--probe-every", type=float, default=0.5, help="seconds between probes")
    parser.add_argument("--timeout", type=float, default=10, help="seconds a probe's alert may take")
    parser.add_argument("--batch", type=int, default=100, help="events per background request")
    parser.add_argument("--load-clients", type=int, default=2, help="background client processes")
    parser.add_argument(
        "--traffic",
        choices=("sim", "ingest-bench"),
        default="sim",
        help="background traffic: manage.py simulate's scenario mix, or bench/ingest.py's (3 calls in 8 are writes)",
    )
    parser.add_argument("--pool", type=int, default=50, help="runs interleaved per background client")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--concurrency", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_alert_bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    args = parser.parse_args(argv)
    args.app = "loopwatch.asgi:application"  # for bench/ingest.py's Server
    if "bench" not in urlsplit(args.database_url).path:
        parser.error("--database-url: its name must contain 'bench' (its tables are emptied)")
    if urlsplit(args.redis_url).path in ("", "/", "/0"):
        parser.error("--redis-url: name a Redis db of its own (like /13); it is flushed at the end")
    signal.signal(signal.SIGTERM, B.interrupted)

    env = B.server_env(args)
    env["CELERY_QUEUE"] = f"alert-bench-{os.getpid()}"
    env["ALLOWED_HOSTS"] = HOST
    server = worker = None
    try:
        if not B.port_free(args.port):
            raise B.SetupError(f"port {args.port} is in use")
        B.ensure_database(args.database_url)
        B.manage(env, "migrate", "--noinput", "-v", "0")
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute("TRUNCATE ingest_event, ingest_run, ingest_detection RESTART IDENTITY CASCADE")
        key = B.manage(
            env, "create_api_key", TENANT, "--scopes", "ingest,read", "--name", "alert-bench"
        ).strip()
        password = secrets.token_urlsafe(12)
        B.manage(
            env,
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model; from dashboards.models import Membership; "
            "from ingest.models import Tenant; U = get_user_model(); "
            f"u = U.objects.filter(username='{USERNAME}').first() or U(username='{USERNAME}'); "
            f"u.set_password('{password}'); u.save(); "
            f"Membership.objects.update_or_create(user=u, tenant=Tenant.objects.get(slug='{TENANT}'), "
            "defaults={'role': 'operator'})",
        )
        idle = B.background_load(2.0)
        server = B.Server(args, env, key)
        worker = Worker(args, env)
        server.wait_ready()
        cookie = B.sign_in(args.port, USERNAME, password)

        cfg = {
            "rate": args.rate,
            "clients": args.load_clients,
            "duration": args.duration,
            "batch": args.batch,
            "seed": args.seed,
            "port": args.port,
            "traffic": args.traffic,
            "pool": args.pool,
        }
        ctx = mp.get_context("fork")
        start_at = ctx.Value("d", 0.0)
        out_q = ctx.Queue()
        n_clients = args.load_clients if args.rate > 0 else 0  # --rate 0: the probes alone
        ready = ctx.Barrier(n_clients + 1)
        clients = [
            ctx.Process(target=load_client, args=(i, cfg, key, ready, start_at, out_q))
            for i in range(n_clients)
        ]
        for p in clients:
            p.start()
        ready.wait(timeout=600)  # the clients build their streams first; then everyone starts together
        start_at.value = time.time() + 1.0
        busy0 = B.system_busy()
        result = asyncio.run(probe_loop(args, key, cookie, start_at.value))
        reports = [out_q.get(timeout=args.duration + 120) for _ in clients]
        for p in clients:
            p.join(timeout=30)
        busy1 = B.system_busy()
        backlog = detection_backlog(args.database_url)
    except B.SetupError as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.stop()
        if worker is not None:
            worker.stop()
        with contextlib.suppress(Exception):
            B.redis_purge(args.redis_url)

    for report in reports:
        if "error" in report:
            print(f"background client {report['client']} failed: {report['error']}", file=sys.stderr)
    sent = sum(r["events"] for r in reports)
    seconds = max([r["seconds"] for r in reports] or [args.duration])
    latencies = result["latencies"]
    p50, p95 = B.percentile(latencies, 0.50), B.percentile(latencies, 0.95)
    ok = bool(latencies) and p95 < TARGET_P95_S and result["lost"] == 0
    machine = (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1e-9)
    print()
    print(f"alert latency, ingest request -> alert on a signed-in page's socket (seed {args.seed})")
    print(
        f"  background load      {sent / seconds:,.0f} events/s reached of {args.rate:,.0f} asked "
        f"({sent:,} events in {seconds:.1f} s, {sum(r['failed'] for r in reports)} failed batches, "
        f"{sum(r['late'] for r in reports)} sent late)"
    )
    print(
        f"  stack                uvicorn x{args.workers}, Celery worker x{args.concurrency}, "
        "PostgreSQL, Redis (broker + channel layer)"
    )
    print(
        f"  machine              {os.cpu_count()} CPUs; busy {idle:.0%} before the run (other processes), "
        f"{machine:.0%} during it"
    )
    print(
        f"  probes               {result['probes']} sent, {len(latencies)} alerts received, "
        f"{result['lost']} lost (no alert within {args.timeout:.0f} s)"
    )
    print(
        f"  latency p50 / p95    {_ms(p50)} / {_ms(p95)}   (max {_ms(max(latencies, default=float('nan')))})"
    )
    print(
        f"  of which ingest ack  p50 {_ms(B.percentile(result['acks'], 0.5))}, "
        f"then to the socket p50 {_ms(B.percentile(result['after_ack'], 0.5))} "
        f"p95 {_ms(B.percentile(result['after_ack'], 0.95))}"
    )
    print(
        f"  socket               {result['reconnects']} reconnects, {result['caught_up']} probe alerts "
        f"came by catch-up; {result['other_alerts']} alerts of the background traffic seen"
    )
    print(
        f"  detection            {backlog[2] / seconds:,.0f} events/s processed; at the end {backlog[0]} runs, "
        f"{backlog[1]:,} events waiting"
    )
    print(f"  target               p95 < {_ms(TARGET_P95_S)}, none lost: {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
