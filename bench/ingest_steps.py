"""Where a batch's time goes, step by step, in one process (no HTTP, no other client).

    .venv/bin/python bench/ingest_steps.py [--runs-per-batch 20,1000] [--batches 45] [--seed 7]
        [--database-url postgres://postgres@127.0.0.1:5432/loopwatch_bench]
        [--redis-url redis://127.0.0.1:6379/15] [--detect]

bench/ingest.py measures the whole stack and its ratio to COPY; its figures move with everything
else the machine does. This one calls the service a REST batch calls (ingest.services.events_ingest)
with bench/ingest.py's events, in one thread, and times each step of storing a batch on PostgreSQL:
taking the runs (create the new ones, lock and number all in one statement), the COPY of the events,
the commit, queueing detection (the UPDATE of what run_started / run_finished describe, for the few
runs whose batch holds one, is in the whole batch's time only). Per shape (runs per batch of 1,000 events), on
emptied tables: 5 batches to warm up, then --batches - 5 measured; prints ms per batch for each
step, the whole batch, and the WAL it wrote. With --detect, each batch's runs then go through a
detection pass in the same thread (ingest.services.runs_process, as the detect_runs task runs it
for a batch's runs), timed apart: what a worker spends on a batch of each shape.

The database must be named *bench* (it is emptied); it is migrated first.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import SetupError, ensure_database, manage, redis_purge, reset_tables, server_env
from bench.ingest import TENANT, client_stream

STEPS = ("_runs_take", "_events_copy", "detection_enqueue")
WARM_UP = 5


def measure(runs_per_batch: int, batches: int, seed: int, database_url: str, detect: bool) -> None:
    from django.db import connection

    from ingest.services import events_ingest, ingestion, runs_process, tenant_get_or_create

    reset_tables(database_url)
    tenant = tenant_get_or_create(slug=TENANT)
    stream = [event for _, event in client_stream(seed, 0, 1000 * batches, runs_per_batch, "steps")]
    chunks = [stream[i : i + 1000] for i in range(0, len(stream), 1000)]
    spent: dict[str, float] = collections.defaultdict(float)

    def timed(name: str, step):
        @functools.wraps(step)
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started

        return run

    originals = {name: getattr(ingestion, name) for name in STEPS}
    connection.ensure_connection()
    raw = connection.connection
    commit = raw.commit
    try:
        for name, step in originals.items():
            setattr(ingestion, name, timed(name, step))
        raw.commit = timed("commit", commit)
        for chunk in chunks[:WARM_UP]:
            result = events_ingest(tenant=tenant, events=chunk, max_event_bytes=1 << 20)
            if detect:
                runs_process(run_pks=sorted(result.runs_touched))
        spent.clear()
        detected, detecting = 0, 0.0
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_lsn()")
            (lsn,) = cursor.fetchone()
        started = time.perf_counter()
        for chunk in chunks[WARM_UP:]:
            result = events_ingest(tenant=tenant, events=chunk, max_event_bytes=1 << 20)
            if result.count("accepted") != len(chunk):
                raise SetupError(f"a batch was not stored whole: {result.verdicts[:3]}")
            if detect:
                detect_started, commits = time.perf_counter(), spent["commit"]
                detected += runs_process(run_pks=sorted(result.runs_touched))
                detecting += time.perf_counter() - detect_started
                spent["commit"] = commits  # the pass's commits are its own
        wall = time.perf_counter() - started - detecting
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [lsn])
            (wal,) = cursor.fetchone()
    finally:
        for name, step in originals.items():
            setattr(ingestion, name, step)
        raw.commit = commit
    n = len(chunks) - WARM_UP
    print(f"{runs_per_batch} runs per batch: {n} batches of 1,000 events")
    print(f"  {wall / n * 1000:7.2f} ms  a batch, in all ({n * 1000 / wall:,.0f} events/s in one thread)")
    for name in (*STEPS, "commit"):
        print(f"  {spent[name] / n * 1000:7.2f} ms  {name.strip('_')}")
    print(f"  {float(wal) / n / 1024:7.0f} KiB of WAL a batch (the detection passes' too, if any)")
    if detect:
        print(
            f"  {detecting / n * 1000:7.2f} ms  detection pass of the batch's runs "
            f"({detected / detecting:,.0f} events/s in one thread; {detected:,} events)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs-per-batch", default="20,1000")
    parser.add_argument("--batches", type=int, default=45, help="batches per shape, 5 of them to warm up")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15", help="flushed at the end")
    parser.add_argument("--detect", action="store_true", help="also time a detection pass per batch")
    args = parser.parse_args(argv)
    if urlsplit(args.redis_url).path.strip("/") in ("", "0"):
        parser.error("--redis-url: name a Redis db of its own (like /15); it is flushed at the end")
    if "bench" not in urlsplit(args.database_url).path:
        parser.error("--database-url: the database is emptied; its name must contain 'bench'")
    if args.batches <= WARM_UP:
        parser.error(f"--batches must be more than {WARM_UP}")
    try:
        shapes = [int(part) for part in args.runs_per_batch.split(",")]
    except ValueError:
        parser.error("--runs-per-batch: whole numbers separated by commas, like 20,1000")
    try:
        ensure_database(args.database_url)
        env = server_env(args)
        manage(env, "migrate", "--no-input")
        os.environ.update(env)
        import django

        django.setup()
        for runs_per_batch in shapes:
            measure(runs_per_batch, args.batches, args.seed, args.database_url, args.detect)
    except SetupError as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 2
    finally:
        redis_purge(args.redis_url)  # the detection tasks the batches queued: no worker takes them
    return 0


if __name__ == "__main__":
    sys.exit(main())
