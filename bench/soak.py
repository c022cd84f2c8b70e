"""A long run: ingest at a steady rate with detection workers on, until 10 M stored events or N minutes.

    .venv/bin/python bench/soak.py [--minutes 30] [--events 10000000] [--rate 2000]
        [--every-events 1000000] [--every-minutes 5] [--batch 200] [--clients 2] [--pool 100]
        [--workers 2] [--concurrency 2]
        [--database-url postgres://postgres@127.0.0.1:5432/loopwatch_soak_bench]
        [--redis-url redis://127.0.0.1:6379/14] [--port 8767] [--seed N]

1. Creates the bench database if missing, migrates it, empties its event and run tables (only in a
   database whose name holds "bench"), creates a tenant, an ingest key and an operator who signs in.
2. Starts the stack as in production: uvicorn (--workers), a Celery worker (--concurrency prefork
   processes) on a queue of its own, and Celery beat (the sweep, the overview's hourly rollup, the
   ledger's reconcilers).
3. Load: --clients processes post batches of --batch events of `manage.py simulate`'s scenario mix
   (ordinary runs, loops, repeats, budgets, writes that time out; --pool runs interleaved per
   client), generated as they go, paced to --rate events/s in all; each event's ts is the moment
   its batch is sent.
4. Every 2 s it samples the detection lag: the age of the oldest stored event that detection has
   not processed yet (0 when none waits). At each window's end (every --every-events stored events,
   or every --every-minutes, whichever comes first) it prints the window's ingest rate, the lag's
   p50 / p95 / max over its samples and the overview page's server time (the median of 3 signed-in
   GETs of /).
5. Stops at --events stored events or after --minutes, waits up to 120 s for detection to catch
   up, stops everything (also on error or Ctrl-C), flushes the Redis db and prints the verdicts:
   flat (the last window's ingest rate and overview time within 20 % of the first's), lag p95
   under 5 s in every window, and the rate reached beside the rate asked.

Exits 0 when every verdict holds, 1 otherwise, 2 on a setup error.
"""

from __future__ import annotations

import argparse
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
TENANT = "bench"
USERNAME = "soak-operator"
FLAT = 0.20  # the last window within 20 % of the first
LAG_P95_S = 5.0
SAMPLE_EVERY_S = 2.0
DRAIN_S = 120.0


from bench import harness as B  # noqa: E402 - the database, server and process helpers

# --- load -----------------------------------------------------------------------------------------


class SimStream:
    """`manage.py simulate`'s runs, `pool` interleaved, a finished run replaced by a new one, made
    as they are taken (a 30-minute soak's events would not fit in memory made ahead)."""

    def __init__(self, seed: int, pool: int, prefix: str) -> None:
        from demo.simulation.mix import run_generate

        self._generate = run_generate
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.made = 0
        self.active = [self._new() for _ in range(pool)]

    def _new(self):
        self.made += 1
        start = datetime.now(UTC)
        return iter(self._generate(self.rng, start, run_prefix=f"{self.prefix}-{self.made}").events)

    def take(self, n: int) -> list[dict]:
        out: list[dict] = []
        while len(out) < n:
            slot = self.rng.randrange(len(self.active))
            event = next(self.active[slot], None)
            if event is None:
                self.active[slot] = self._new()
                continue
            out.append(event)
        return out


def load_client(idx: int, cfg: dict, key: str, start_at, stop, accepted, failed) -> None:
    """Post batches on a fixed schedule until `stop`; count the events accepted and the batches
    that failed in the shared counters."""
    per_client = cfg["rate"] / cfg["clients"]
    batch = cfg["batch"]
    interval = batch / per_client
    stream = SimStream(cfg["seed"] * 7919 + idx, cfg["pool"], f"soak{cfg['seed']}-c{idx}")
    conn = http.client.HTTPConnection(HOST, cfg["port"], timeout=120)
    while start_at.value == 0.0 or time.time() < start_at.value:
        time.sleep(0.01)
    first = time.time()
    n = 0
    while not stop.value:
        delay = first + n * interval - time.time()
        if delay > 0:
            time.sleep(min(delay, 0.5))
            continue
        n += 1
        events = stream.take(batch)
        now = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        for event in events:
            event["ts"] = now
        try:
            status, body = B._post(conn, orjson.dumps(events), key)
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection(HOST, cfg["port"], timeout=120)
            status, body = 0, b""
        if status in (200, 207):
            with accepted.get_lock():
                accepted.value += orjson.loads(body)["accepted"]
        else:
            with failed.get_lock():
                failed.value += 1


# --- measures ------------------------------------------------------------------------------------

LAG_SQL = """
SELECT coalesce(extract(epoch FROM now() - min(e.ts)), 0), count(*)
FROM ingest_run r
JOIN ingest_runcursor c ON c.run_id = r.id
JOIN ingest_event e ON e.run_id = r.id AND e.seq = c.position + 1
WHERE r.events_count > c.position
"""


def lag_sample(conn: psycopg.Connection) -> tuple[float, int]:
    """(age in seconds of the oldest event detection has not processed, runs waiting)."""
    age, waiting = conn.execute(LAG_SQL).fetchone()
    return max(0.0, float(age)), int(waiting)


def overview_time(port: int, cookie: str, repeat: int = 3) -> float:
    """The median time of GET / (the overview, its default range) for a signed-in operator."""
    times = []
    for _ in range(repeat):
        conn = http.client.HTTPConnection(HOST, port, timeout=120)
        t0 = time.perf_counter()
        conn.request("GET", "/", headers={"Cookie": cookie})
        response = conn.getresponse()
        response.read()
        times.append(time.perf_counter() - t0)
        conn.close()
        if response.status != 200:
            raise B.SetupError(f"the overview answered {response.status}")
    return sorted(times)[len(times) // 2]


class Process:
    """A Celery process in a session of its own; stop() ends that process group (and only it)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int) -> None:
        self.log_path = Path(f"/tmp/loopwatch-soak-{name}-{port}.log")
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "loopwatch", *argv],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        B.stop_group(self.proc, timeout=20)
        self.log.close()


def _operator(env: dict[str, str], password: str) -> None:
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


def _window_line(n: int, window: dict) -> str:
    lags = window["lags"]
    return (
        f"{n:>3}  {window['elapsed'] / 60:6.1f} min  {window['stored']:>11,}  "
        f"{window['rate']:>8,.0f}/s  {B.percentile(lags, 0.5):6.2f} s  {B.percentile(lags, 0.95):6.2f} s  "
        f"{max(lags or [float('nan')]):6.2f} s  {window['overview'] * 1000:8.0f} ms  {window['busy']:4.0%}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=30, help="stop after this long (default 30)")
    parser.add_argument("--events", type=int, default=10_000_000, help="or at this many stored events")
    parser.add_argument("--rate", type=float, default=2000, help="events/s asked, in all (default 2000)")
    parser.add_argument("--every-events", type=int, default=1_000_000, help="a window per this many events")
    parser.add_argument("--every-minutes", type=float, default=5, help="or per this many minutes")
    parser.add_argument("--batch", type=int, default=200, help="events per request")
    parser.add_argument("--clients", type=int, default=2, help="load client processes")
    parser.add_argument("--pool", type=int, default=100, help="runs interleaved per client")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--concurrency", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_soak_bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--port", type=int, default=8767)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument(
        "--shared-postgres",
        action="store_true",
        help="use --database-url as it is; by default the run starts a PostgreSQL cluster of its own, "
        "configured as in production (autovacuum on, fsync on), and removes it at the end",
    )
    args = parser.parse_args(argv)
    args.app = "loopwatch.asgi:application"  # for bench/ingest.py's Server
    for name in ("minutes", "events", "rate", "every_events", "every_minutes", "batch", "clients", "pool"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be more than 0")
    if "bench" not in urlsplit(args.database_url).path:
        parser.error("--database-url: its name must contain 'bench' (its tables are emptied)")
    if urlsplit(args.redis_url).path in ("", "/", "/0"):
        parser.error("--redis-url: name a Redis db of its own (like /14); it is flushed at the end")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, B.interrupted)

    cluster = None
    if not args.shared_postgres:
        # A long run measures what the database becomes under it: a shared server tuned for tests
        # (this project's machines run theirs with autovacuum off) bloats the runs and cursors
        # tables with dead rows, and its planner keeps statistics from before the run.
        try:
            cluster = _private_postgres()
        except B.SetupError as exc:
            print(f"SETUP ERROR: {exc}", file=sys.stderr)
            return 2
        args.database_url = cluster.url("loopwatch_soak_bench")
    try:
        return _soak(args)
    finally:
        if cluster is not None:
            cluster.remove()


def _private_postgres():
    from tests.faults.servers import PrivatePostgres, pg_bin  # the fault suite's private cluster

    bindir = pg_bin()
    if bindir is None:
        raise B.SetupError(
            "PostgreSQL's server binaries (initdb, pg_ctl) are not installed; or --shared-postgres"
        )
    cluster = PrivatePostgres(bindir)
    cluster.init()
    cluster.start(fsync="on", shared_buffers="256MB", max_connections="100")
    with cluster.connect(autocommit=True) as conn:
        settings = dict(
            conn.execute("SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'fsync')")
        )
    print(f"private PostgreSQL on port {cluster.port}: {settings}", flush=True)
    return cluster


def _soak(args) -> int:
    env = B.server_env(args)
    env["CELERY_QUEUE"] = f"soak-{os.getpid()}"
    env["ALLOWED_HOSTS"] = HOST
    server = worker = beat = None
    clients: list = []
    windows: list[dict] = []
    drained_after: float | None = None
    try:
        if not B.port_free(args.port):
            raise B.SetupError(f"port {args.port} is in use")
        B.ensure_database(args.database_url)
        B.manage(env, "migrate", "--noinput", "-v", "0")
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute("TRUNCATE ingest_event, ingest_run, ingest_detection RESTART IDENTITY CASCADE")
        key = B.manage(env, "create_api_key", TENANT, "--scopes", "ingest,read", "--name", "soak").strip()
        password = secrets.token_urlsafe(12)
        _operator(env, password)
        B.redis_purge(args.redis_url)
        idle = B.background_load(2.0)
        server = B.Server(args, env, key)
        queue = env["CELERY_QUEUE"]
        worker = Process(
            "worker",
            [
                *("worker", "-c", str(args.concurrency), "-Q", queue, "-n", f"{queue}@%h", "-l", "WARNING"),
                *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            ],
            env,
            args.port,
        )
        beat = Process(
            "beat", ["beat", "-l", "WARNING", "-s", f"/tmp/loopwatch-soak-beat-{args.port}"], env, args.port
        )
        server.wait_ready()
        cookie = B.sign_in(args.port, USERNAME, password)
        overview_time(args.port, cookie, repeat=1)  # warm: connections, templates

        cfg = {k: getattr(args, k) for k in ("rate", "clients", "batch", "pool", "seed", "port")}
        ctx = mp.get_context("fork")
        start_at, stop = ctx.Value("d", 0.0), ctx.Value("b", False)
        accepted, failed = ctx.Value("q", 0), ctx.Value("q", 0)
        clients = [
            ctx.Process(target=load_client, args=(i, cfg, key, start_at, stop, accepted, failed), daemon=True)
            for i in range(args.clients)
        ]
        for proc in clients:
            proc.start()
        print(
            f"soak: {args.rate:,.0f} events/s asked from {args.clients} clients (batches of {args.batch}), "
            f"uvicorn x{args.workers}, Celery worker x{args.concurrency} + beat, until {args.events:,} events "
            f"or {args.minutes:g} min; a window every {args.every_events:,} events or {args.every_minutes:g} min "
            f"(seed {args.seed})",
            flush=True,
        )
        print(
            "  #   elapsed       stored      ingest   lag p50  lag p95  lag max  overview  busy", flush=True
        )
        start_at.value = time.time() + 1.0
        time.sleep(1.0)
        began = time.monotonic()
        db = psycopg.connect(args.database_url, autocommit=True)
        window = {"t0": began, "stored0": 0, "lags": [], "busy0": B.system_busy()}
        next_sample = began
        while True:
            dead = [i for i, proc in enumerate(clients) if proc.exitcode not in (None, 0)]
            if dead:  # a client that raised sends nothing: the run would measure an idle stack
                raise B.SetupError(f"load client {dead[0]} exited ({clients[dead[0]].exitcode}); see above")
            now = time.monotonic()
            stored = accepted.value
            finished = stored >= args.events or now - began >= args.minutes * 60
            window_done = (
                stored - window["stored0"] >= args.every_events
                or now - window["t0"] >= args.every_minutes * 60
                or finished
            )
            if now >= next_sample:
                window["lags"].append(lag_sample(db)[0])
                next_sample = now + SAMPLE_EVERY_S
            if window_done:
                busy = B.system_busy()
                window.update(
                    began=window["t0"] - began,
                    elapsed=now - began,
                    stored=stored,
                    rate=(stored - window["stored0"]) / max(now - window["t0"], 1e-9),
                    overview=overview_time(args.port, cookie),
                    busy=(busy[0] - window["busy0"][0]) / max(busy[1] - window["busy0"][1], 1e-9),
                )
                windows.append(window)
                print(_window_line(len(windows), window), flush=True)
                if finished:
                    break
                # From the moment `stored` was read: the overview's requests took time of this window.
                window = {"t0": now, "stored0": stored, "lags": [], "busy0": busy}
            time.sleep(0.2)
        stop.value = True
        for proc in clients:
            proc.join(timeout=130)
        drain_began = time.monotonic()
        while time.monotonic() - drain_began < DRAIN_S:
            if lag_sample(db)[1] == 0:
                drained_after = time.monotonic() - drain_began
                break
            time.sleep(1.0)
        db.close()
    except B.SetupError as exc:
        print(f"SETUP ERROR: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"INTERRUPTED ({exc or 'Ctrl-C'}): stopping", file=sys.stderr)
        return 130
    finally:
        for proc in clients:
            if proc.is_alive():
                proc.terminate()  # one of ours, by its own handle
        for part in (server, worker, beat):
            if part is not None:
                part.stop()
        with contextlib.suppress(Exception):
            B.redis_purge(args.redis_url)

    return verdicts(args, windows, idle, failed.value, drained_after)


def verdicts(args, windows: list[dict], idle: float, failed: int, drained_after: float | None) -> int:
    first, end = windows[0], windows[-1]
    elapsed = end["elapsed"]
    # The run's end cuts its last window short: compare the last whole one (at least half as long).
    whole = [w for w in windows if w["elapsed"] - w.get("began", 0.0) >= 0.5 * first["elapsed"]]
    last = whole[-1] if whole else end
    reached = end["stored"] / max(elapsed, 1e-9)
    lag_p95 = max(B.percentile(w["lags"], 0.95) for w in windows if w["lags"])
    rate_flat = abs(last["rate"] - first["rate"]) <= FLAT * first["rate"]
    overview_flat = last["overview"] <= (1 + FLAT) * first["overview"]
    lag_ok = lag_p95 < LAG_P95_S
    rate_ok = reached >= 0.95 * args.rate
    line = "-" * 86
    print(line)
    print(
        f"machine          : {os.cpu_count()} cores; {idle:.0%} busy before the run (other processes), "
        f"loadavg {os.getloadavg()[0]:.1f} at the end"
    )
    print(
        f"stored           : {end['stored']:,} events in {elapsed / 60:.1f} min = {reached:,.0f} events/s "
        f"of {args.rate:,.0f} asked ({failed} batches failed)"
    )
    drain = f"{drained_after:.0f} s" if drained_after is not None else f"not within {DRAIN_S:.0f} s"
    print(f"detection        : caught up {drain} after the load stopped")
    print(
        f"ingest rate flat : first window {first['rate']:,.0f}/s, last {last['rate']:,.0f}/s "
        f"({'flat' if rate_flat else 'NOT flat'}: the ceiling is {FLAT:.0%} apart)"
    )
    print(
        f"overview flat    : first window {first['overview'] * 1000:.0f} ms, last {last['overview'] * 1000:.0f} ms "
        f"({'flat' if overview_flat else 'NOT flat'}: the ceiling is +{FLAT:.0%})"
    )
    print(
        f"detection lag    : p95 {lag_p95:.2f} s in the worst window "
        f"({'meets' if lag_ok else 'ABOVE'} the ceiling of {LAG_P95_S:.0f} s)"
    )
    print(
        f"rate asked       : {'reached' if rate_ok else 'NOT reached'} (lag ceiling applies at {args.rate:,.0f} events/s)"
    )
    print(line)
    return 0 if rate_flat and overview_flat and lag_ok and rate_ok else 1


if __name__ == "__main__":
    sys.exit(main())
