"""OTLP ingest benchmark: spans/s through POST /v1/traces, beside REST events/s for the same events.

    .venv/bin/python bench/otlp.py [--traces 2000] [--batch 512] [--clients 2] [--workers 2]
        [--shuffle] [--database-url postgres://postgres@127.0.0.1:5432/lw_otlp_bench]
        [--redis-url redis://127.0.0.1:6379/15] [--port 8771]

1. Creates the bench database if missing, migrates it, empties the event and run tables (only in
   a database whose name holds "bench"), creates a tenant and an ingest key (bench/ingest.py's
   setup, imported).
2. Makes agent traces with the real opentelemetry-sdk (GenAI conventions: an invoke_agent span,
   then 3-8 rounds of a chat span and 1-3 execute_tool spans with arguments and results), and
   encodes them as the OTLP exporter does, --batch spans per export (the BatchSpanProcessor's
   default is 512), before the clock starts. --shuffle sends the exports in a random order (a
   collector's parallel exporters: a trace's root span often before its model and tool spans).
3. Starts uvicorn (--workers), DEBUG off, REDIS_URL set (detection is queued, nothing consumes it),
   warms its workers up with a few small exports (then empties the tables again). OTLP: --clients processes POST the exports (protobuf) over keep-alive connections; every answer
   must be 200 without rejected spans.
4. REST: the events the OTLP phase stored, read back and given new run ids, POSTed to
   /api/v1/events in batches of the same number of events per request as the OTLP exports made.
5. Prints spans/s and events/s for both, with the server's CPU per event, and what became of the
   spans: sent, stored (with events), waiting (parked for a run), ignored, counted from the
   answers' X-Loopwatch-Spans headers and checked against the database (every trace a finished
   run, its rounds and tool calls as many as its spans).
6. With --detect, then runs detection over the OTLP runs in this process's stead (manage.py shell,
   as the pending task does: runs_process, TAKE runs a pass) and prints its events/s and how many
   model rounds were out of start-time order before it (numbered as they arrived) and after it
   (0: the pass renumbered them).

Exits 1 when a request failed or a span or figure is missing, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path

import orjson
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import harness as rest  # noqa: E402 - database, server and CPU helpers

HOST = rest.HOST
TENANT = "bench"
TOOLS = ("search_orders", "get_order", "query_db", "http_get", "update_ticket")


# --- traces ---------------------------------------------------------------------------------------


def make_exports(seed: int, traces: int, batch: int) -> tuple[list[bytes], int, dict[str, int]]:
    """(export bodies, spans in all, spans per role): agent traces from the SDK, encoded as the
    exporter does."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    rng = random.Random(seed)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    clock = time.time_ns() - 10**12

    def tick() -> int:
        nonlocal clock
        clock += rng.randrange(1, 50) * 10**6
        return clock

    for number in range(traces):
        root = tracer.start_span(
            "invoke_agent shop",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": f"agent-{number % 4}",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o",
            },
            start_time=tick(),
        )
        context = trace.set_span_in_context(root)
        for _ in range(rng.randrange(3, 9)):
            chat = tracer.start_span(
                "chat gpt-4o",
                context=context,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": rng.randrange(500, 5000),
                    "gen_ai.usage.output_tokens": rng.randrange(10, 300),
                },
                start_time=tick(),
            )
            chat.end(end_time=tick())
            for _ in range(rng.randrange(1, 4)):
                tool = rng.choice(TOOLS)
                span = tracer.start_span(
                    f"execute_tool {tool}",
                    context=context,
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": tool,
                        "gen_ai.tool.call.id": f"call_{rng.getrandbits(48):012x}",
                        "gen_ai.tool.call.arguments": orjson.dumps(
                            {"customer": str(rng.randrange(10_000)), "status": rng.choice(["open", "closed"])}
                        ).decode(),
                        "gen_ai.tool.call.result": orjson.dumps(
                            {"items": [rng.randrange(1000) for _ in range(rng.randrange(0, 6))], "page": 1}
                        ).decode(),
                    },
                    start_time=tick(),
                )
                span.end(end_time=tick())
        root.end(end_time=tick())
    spans = list(memory.get_finished_spans())
    bodies = [encode_spans(spans[i : i + batch]).SerializeToString() for i in range(0, len(spans), batch)]
    roles = {"chat": 0, "execute_tool": 0, "invoke_agent": 0}
    for span in spans:
        roles[span.attributes["gen_ai.operation.name"]] += 1
    return bodies, len(spans), roles


# --- clients ---------------------------------------------------------------------------------------


def post(port: int, path: str, content_type: str, key: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        conn.request(
            "POST", path, body=body, headers={"Authorization": f"Bearer {key}", "Content-Type": content_type}
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# --- the phases --------------------------------------------------------------------------------------


def client(port: int, path: str, content_type: str, key: str, bodies: list[bytes], barrier, out_q) -> None:
    failures = 0
    latencies = []
    counts: dict[str, int] = {}
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    barrier.wait()
    start = time.perf_counter()
    for body in bodies:
        sent = time.perf_counter()
        conn.request(
            "POST", path, body=body, headers={"Authorization": f"Bearer {key}", "Content-Type": content_type}
        )
        response = conn.getresponse()
        answer = response.read()
        latencies.append(time.perf_counter() - sent)
        for item in (response.getheader("X-Loopwatch-Spans") or "").split():
            name, _, value = item.partition("=")
            counts[name] = counts.get(name, 0) + int(value)
        if response.status != 200 or (path == "/v1/traces" and answer):
            failures += 1
            if failures == 1:
                print(f"{path}: {response.status} {answer[:300]!r}", file=sys.stderr)
        # A new connection per request spreads the requests over the uvicorn workers.
        conn.close()
        conn = http.client.HTTPConnection(HOST, port, timeout=120)
    out_q.put((time.perf_counter() - start, start, failures, latencies, counts))


def phase(
    port: int, path: str, content_type: str, key: str, bodies: list[bytes], clients: int, pids: list[int]
):
    """Wall time (first start to last end), failures, latencies, server CPU seconds, the summed
    X-Loopwatch-Spans counts."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(clients + 1)
    out_q = ctx.Queue()
    procs = [
        ctx.Process(target=client, args=(port, path, content_type, key, bodies[i::clients], barrier, out_q))
        for i in range(clients)
    ]
    for proc in procs:
        proc.start()
    cpu0 = sum(rest._proc_cpu(pid) for pid in pids)
    barrier.wait()
    results = [out_q.get(timeout=1800) for _ in procs]
    cpu = sum(rest._proc_cpu(pid) for pid in pids) - cpu0
    for proc in procs:
        proc.join()
    first = min(r[1] for r in results)
    wall = max(r[1] + r[0] for r in results) - first
    latencies = sorted(x for r in results for x in r[3])
    counts: dict[str, int] = {}
    for r in results:
        for name, value in r[4].items():
            counts[name] = counts.get(name, 0) + value
    return wall, sum(r[2] for r in results), latencies, cpu, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--traces", type=int, default=2000, help="agent traces (~25 spans each)")
    parser.add_argument("--batch", type=int, default=512, help="spans per export")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/lw_otlp_bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--port", type=int, default=8771)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shuffle", action="store_true", help="send the exports in a random order")
    parser.add_argument("--detect", action="store_true", help="then run detection over the OTLP runs")
    args = parser.parse_args(argv)
    if "bench" not in args.database_url.rsplit("/", 1)[-1]:
        parser.error("--database-url: the database is emptied; its name must contain 'bench'")
    args.app = "loopwatch.asgi:application"  # what bench/ingest.py's Server serves

    env = rest.server_env(args)
    server = None
    try:
        if not rest.port_free(args.port):
            raise rest.SetupError(f"port {args.port} is in use")
        rest.ensure_database(args.database_url)
        rest.manage(env, "migrate", "--noinput", "-v", "0")
        rest.reset_tables(args.database_url)
        key = rest.manage(env, "create_api_key", TENANT, "--scopes", "ingest,read", "--name", "bench").strip()
        t0 = time.perf_counter()
        bodies, spans, roles = make_exports(args.seed, args.traces, args.batch)
        if args.shuffle:
            random.Random(args.seed).shuffle(bodies)
        print(
            f"{spans} spans in {len(bodies)} exports of up to {args.batch} "
            f"({sum(map(len, bodies)) / spans:.0f} bytes a span), made in {time.perf_counter() - t0:.1f} s"
        )
        busy = rest.background_load()
        server = rest.Server(args, env, key)
        server.wait_ready()
        pids = server.worker_pids()
        # Warm every worker up (database pool, broker connection, the publisher thread) before the
        # clock: the phase that runs first would otherwise pay for it in its tail latency.
        warm, _, _ = make_exports(args.seed + 1, 4 * args.workers, 64)
        for body in warm:
            status, answer = post(args.port, "/v1/traces", "application/x-protobuf", key, body)
            if status != 200 or answer:
                raise rest.SetupError(f"warm-up export: {status} {answer[:300]!r}")
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute("TRUNCATE ingest_event, ingest_run, ingest_parkedspan RESTART IDENTITY CASCADE")

        wall, failed, latencies, cpu, counts = phase(
            args.port, "/v1/traces", "application/x-protobuf", key, bodies, args.clients, pids
        )
        with psycopg.connect(args.database_url) as conn:
            stored = conn.execute("SELECT count(*) FROM ingest_event").fetchone()[0]
            rows = conn.execute("SELECT body::text FROM ingest_event ORDER BY run_id, seq").fetchall()
            found = stored_spans(conn)
        otlp = (wall, failed, latencies, cpu, stored)

        # The same events through REST, under new run ids, as many per request as an export made.
        per_request = max(1, round(stored / len(bodies)))
        events = []
        for (text,) in rows:
            event = orjson.loads(text)
            event["run_id"] = "rest-" + event["run_id"]
            events.append(event)
        batches = [orjson.dumps(events[i : i + per_request]) for i in range(0, len(events), per_request)]
        wall_r, failed_r, latencies_r, cpu_r, _ = phase(
            args.port, "/api/v1/events", "application/json", key, batches, args.clients, pids
        )
        with psycopg.connect(args.database_url) as conn:
            stored_r = conn.execute("SELECT count(*) FROM ingest_event").fetchone()[0] - stored
    except rest.SetupError as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.stop()
        rest.redis_purge(args.redis_url)
    detected = detect(env) if args.detect else None

    def p(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000

    print(
        f"machine busy before the start: {busy:.0%}; {args.clients} clients, uvicorn --workers {args.workers}"
        f"{', exports shuffled' if args.shuffle else ''}"
    )
    missing = spans_report(spans, roles, args.traces, counts, found)
    if detected is not None:
        print(detected)
        missing += not detected.endswith("after 0")
    print("| path | requests | spans/s | events/s | p50 / p99 ms | server CPU µs/event |")
    print("|---|---|---|---|---|---|")
    wall, failed, latencies, cpu, stored = otlp
    print(
        f"| OTLP protobuf, {args.batch} spans/export | {len(bodies)} | {spans / wall:,.0f} | {stored / wall:,.0f} "
        f"| {p(latencies, 0.5):.0f} / {p(latencies, 0.99):.0f} | {cpu / stored * 1e6:.0f} |"
    )
    print(
        f"| REST JSON, {per_request} events/batch | {len(batches)} | — | {stored_r / wall_r:,.0f} "
        f"| {p(latencies_r, 0.5):.0f} / {p(latencies_r, 0.99):.0f} | {cpu_r / max(stored_r, 1) * 1e6:.0f} |"
    )
    if stored_r != stored:
        print(f"REST stored {stored_r} events, OTLP {stored}", file=sys.stderr)
        failed_r += 1
    return 1 if failed or failed_r or missing else 0


# Run by manage.py shell (Django set up on the bench database): detection over the OTLP runs, as
# the pending task runs it (TAKE runs a pass), and how many model rounds are out of start order.
DETECT = """
import time
from django.db import connection
from ingest import services
from ingest.models import Run
from ingest.pending import TAKE

OUT_OF_ORDER = (
    "SELECT count(*) FROM (SELECT (e.body->>'round')::int AS number, rank() OVER (PARTITION BY "
    "e.run_id ORDER BY e.body->>'otel_start', e.ts, e.seq) AS by_start FROM ingest_event AS e "
    "JOIN ingest_run AS r ON r.id = e.run_id WHERE e.type = 'model_round' "
    "AND r.run_id NOT LIKE 'rest-%%') AS x WHERE number <> by_start"
)


def out_of_order():
    with connection.cursor() as cursor:
        cursor.execute(OUT_OF_ORDER, [])
        return cursor.fetchone()[0]


before = out_of_order()
pks = list(Run.objects.exclude(run_id__startswith="rest-").values_list("pk", flat=True))
started = time.perf_counter()
events = sum(services.runs_process(run_pks=pks[i : i + TAKE]) for i in range(0, len(pks), TAKE))
took = time.perf_counter() - started
print(
    f"detection: {events} events of {len(pks)} runs in {took:.1f} s ({events / took:,.0f} events/s); "
    f"model rounds out of start order: before {before}, after {out_of_order()}"
)
"""


def detect(env: dict[str, str]) -> str:
    return rest.manage(env, "shell", "--no-imports", "-c", DETECT).strip()


def stored_spans(conn) -> dict[str, int]:
    """What the database holds of the OTLP phase: spans with events (from the event ids,
    otel:<trace>:<span>:<what>), spans parked for a run, runs, finished runs, rounds, tool calls."""
    spans = conn.execute(
        "SELECT count(DISTINCT split_part(event_id, ':', 3)) FROM ingest_event "
        "WHERE event_id LIKE 'otel:%:%:%'"
    ).fetchone()[0]
    waiting = conn.execute("SELECT count(*) FROM ingest_parkedspan").fetchone()[0]
    runs, finished, rounds, calls = conn.execute(
        "SELECT count(*), count(finished_at), coalesce(sum(rounds), 0), coalesce(sum(tool_calls), 0) "
        "FROM ingest_run"
    ).fetchone()
    return {
        "spans": spans,
        "waiting": waiting,
        "runs": runs,
        "finished": finished,
        "rounds": rounds,
        "calls": calls,
    }


def spans_report(sent: int, roles: dict[str, int], traces: int, counts: dict[str, int], found: dict) -> int:
    """Print spans sent / stored / waiting / ignored (answers and database); the number missing."""
    print(
        f"spans sent {sent}: stored {found['spans']}, waiting {found['waiting']} (database); answers said "
        f"accepted {counts.get('accepted', 0)}, duplicate {counts.get('duplicate', 0)}, "
        f"waiting {counts.get('waiting', 0)}, ignored {counts.get('ignored', 0)}, "
        f"rejected {counts.get('rejected', 0)}"
    )
    print(
        f"runs {found['runs']} of {traces} traces, {found['finished']} finished; rounds {found['rounds']} "
        f"of {roles['chat']} chat spans; tool calls {found['calls']} of {roles['execute_tool']} tool spans"
    )
    expected = {
        "spans": sent,
        "runs": traces,
        "finished": traces,
        "rounds": roles["chat"],
        "calls": roles["execute_tool"],
    }
    short = {name: (found[name], value) for name, value in expected.items() if found[name] != value}
    if short:
        print(f"MISSING (found, expected): {short}", file=sys.stderr)
    return len(short)


if __name__ == "__main__":
    sys.exit(main())
