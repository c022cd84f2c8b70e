"""What writing a batch's runs costs PostgreSQL, three ways, on a table of many runs.

    .venv/bin/python bench/run_writes.py [--runs 200000] [--window 2000] [--batch-runs 1000]
        [--iterations 40] [--seed 5] [--database-url postgres://postgres@127.0.0.1:5432/loopwatch_bench]

A batch over 1,000 runs costs more than one over 20 because each run it touches is a row
PostgreSQL locks and writes (docs/performance.md, 2026-12-03). This bench prices the designs of
that write on copies of the runs table, without HTTP or events, in one connection:

1. `lock + merge` — what ingest does: the lock statement (ingest.services.postgres._take_sql) then
   the merge UPDATE of the batch's figures (_merge_sql), one event per run;
2. `count on the run row` — one UPDATE of the counter that numbers a run's events
   (events_count), on the same wide rows, after locking them in pk order in the same statement;
   the other figures would be written by the detection pass;
3. `narrow counter table` — the same on a table of (run id, count) alone.

Each iteration takes --batch-runs runs among the newest --window (the runs still sending: a
deployment's active agents have recent ids), runs the three in turn (the order alternating) and
commits each; it prints the median, p10 and p90 of each, commit included. The copies carry the
runs table's indexes and checks but not the foreign keys of the eight tables that reference a
run, whose checks add ~10 % to an UPDATE of the real table (a perf profile, 2026-12-02): ways 1
and 2 cost a little more there. The database must be named *bench* (its runs and events are
emptied first); the copies are dropped at the end.
"""

from __future__ import annotations

import argparse
import operator
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import SetupError, ensure_database, manage, reset_tables, server_env

WIDE = "bench_run_wide"
NARROW = "bench_run_counter"
WAYS = ("lock + merge", "count on the run row", "narrow counter table")


def _setup(cursor, runs: int) -> None:
    """The two copies, filled with `runs` runs copied from one real run (ids 1 .. runs)."""
    from ingest.models import Run
    from ingest.services import tenant_get_or_create

    tenant = tenant_get_or_create(slug="bench-writes")
    template = Run.objects.create(tenant=tenant, run_id="template", backend="openai", model="gpt-x")
    columns = [f.column for f in Run._meta.concrete_fields if f.column != "id"]
    values = ", ".join("'r' || g.i" if c == "run_id" else f"t.{c}" for c in columns)
    cursor.execute(f"DROP TABLE IF EXISTS {WIDE}, {NARROW}")
    # The runs table's fillfactor too (migration 0013): room on each page for HOT updates.
    cursor.execute(f"CREATE TABLE {WIDE} (LIKE {Run._meta.db_table} INCLUDING ALL) WITH (fillfactor = 40)")
    cursor.execute(f"ALTER TABLE {WIDE} ALTER COLUMN id DROP IDENTITY IF EXISTS")
    cursor.execute(
        f"INSERT INTO {WIDE} (id, {', '.join(columns)}) SELECT g.i, {values} "
        f"FROM generate_series(1, %s) AS g(i) CROSS JOIN {Run._meta.db_table} AS t WHERE t.id = %s",
        [runs, template.pk],
    )
    cursor.execute(
        f"CREATE TABLE {NARROW} (id bigint PRIMARY KEY, events_count integer NOT NULL) WITH (fillfactor = 50)"
    )
    cursor.execute(f"INSERT INTO {NARROW} SELECT g.i, 0 FROM generate_series(1, %s) AS g(i)", [runs])


def _count_sql(table: str) -> str:
    return (
        f"WITH locked AS (SELECT id FROM {table} WHERE id = ANY(%s::bigint[]) ORDER BY id FOR NO KEY UPDATE) "
        f"UPDATE {table} AS t SET events_count = t.events_count + v.k "
        "FROM unnest(%s::bigint[], %s::integer[]) AS v(id, k) "
        "WHERE t.id = v.id AND t.id IN (SELECT id FROM locked) RETURNING t.id, t.events_count"
    )


def measure(args) -> dict[str, list[float]]:
    from django.db import connection

    from ingest.services.ingestion import _RunBatch
    from ingest.services.postgres import MERGED_FIGURES, _merge_sql, _take_sql, json_array

    with connection.cursor() as cursor:
        _setup(cursor, args.runs)
    raw = connection.connection
    raw.commit()
    raw.autocommit = True
    raw.execute(f"VACUUM ANALYZE {WIDE}")
    raw.execute(f"VACUUM ANALYZE {NARROW}")
    raw.autocommit = False
    table = connection.ops.quote_name("ingest_run")
    lock = _take_sql()[2].replace(table, WIDE)
    merge = _merge_sql().replace(table, WIDE)
    count_wide, count_narrow = _count_sql(WIDE), _count_sql(NARROW)
    rng = random.Random(args.seed)
    now = datetime.now(UTC)
    spent: dict[str, list[float]] = {way: [] for way in WAYS}

    def lock_and_merge(ids: list[int]) -> None:
        rows = raw.execute(lock, [json_array(ids)]).fetchall()
        runs = []
        for _run_id, pk, events_count, cost_usd, backend, model, _tenant in rows:
            run = _RunBatch(pk, events_count + 1, cost_usd, backend, model)
            run.started_at = run.last_event_at = now
            run.rounds = run.tool_calls = 1
            runs.append(run)
        params = [json_array([run.pk for run in runs])]
        params += [json_array(list(map(operator.attrgetter(name), runs))) for name in MERGED_FIGURES]
        raw.execute(merge, [*params, "[]"])

    def count(sql: str, ids: list[int]) -> None:
        pks = json_array(ids)  # the lock's and the update's
        raw.execute(sql, [pks, pks, json_array([1] * len(ids))]).fetchall()

    ways = {
        WAYS[0]: lock_and_merge,
        WAYS[1]: lambda ids: count(count_wide, ids),
        WAYS[2]: lambda ids: count(count_narrow, ids),
    }
    newest = range(args.runs - args.window + 1, args.runs + 1)
    for iteration in range(args.iterations):
        ids = sorted(rng.sample(newest, args.batch_runs))
        for way in WAYS if iteration % 2 == 0 else WAYS[::-1]:
            started = time.perf_counter()
            ways[way](ids)
            raw.commit()
            spent[way].append(time.perf_counter() - started)
    raw.execute(f"DROP TABLE {WIDE}, {NARROW}")
    raw.commit()
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200_000, help="runs in each copy of the table")
    parser.add_argument(
        "--window", type=int, default=2_000, help="a batch's runs are among the newest this many"
    )
    parser.add_argument("--batch-runs", type=int, default=1_000, help="runs a batch touches")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_bench")
    args = parser.parse_args(argv)
    if "bench" not in urlsplit(args.database_url).path:
        parser.error("--database-url: its runs are emptied; its name must contain 'bench'")
    if not 0 < args.batch_runs <= args.window <= args.runs:
        parser.error("need 0 < --batch-runs <= --window <= --runs")
    try:
        ensure_database(args.database_url)
        env = server_env(SimpleNamespace(database_url=args.database_url, redis_url=""))
        manage(env, "migrate", "--no-input")
        reset_tables(args.database_url)
        os.environ.update(env)
        import django

        django.setup()
        spent = measure(args)
    except SetupError as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 2
    print(
        f"{args.batch_runs:,} runs a batch among the newest {args.window:,} of {args.runs:,}, "
        f"{args.iterations} iterations, ms a batch with its commit:"
    )
    for way, times in spent.items():
        times.sort()
        p10, p90 = times[len(times) // 10], times[len(times) * 9 // 10]
        print(
            f"  {way:<22} median {statistics.median(times) * 1000:6.2f}   "
            f"p10 {p10 * 1000:6.2f}   p90 {p90 * 1000:6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
