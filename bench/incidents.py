"""What incidents cost the detection pass: the same runs processed with the incident upsert and
without it, passes interleaved, on the local PostgreSQL.

    .venv/bin/python bench/incidents.py                   # 20 rounds of 50 looping runs a pass
    .venv/bin/python bench/incidents.py --rounds 40 --runs 100

Each round ingests `--runs` new runs of `--calls` identical reads (each run escalates: correct,
handoff, terminate: 3 to 4 detections, one incident), then processes them in one pass
(`runs_process`), once with the incident upsert and once with it left out (the statement replaced by
None), alternately (the notification task the pass queues runs in a worker: left out); it prints the median pass time of each and the difference beside the ceiling:
incidents may add at most 10 % to a pass that stores detections. The database (its name must
contain `bench`) is created if missing and its runs are emptied.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `ingest` is the package, not bench/ingest.py beside this script

CEILING = 0.10  # the share of a pass incidents may add


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=50, help="runs per pass")
    parser.add_argument("--calls", type=int, default=12, help="identical reads per run")
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/loopwatch_incidents_bench"
    )
    args = parser.parse_args()
    if "bench" not in args.database_url.rsplit("/", 1)[-1]:
        print("--database-url: its name must contain 'bench' (its runs are emptied)", file=sys.stderr)
        return 2
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.pop("REDIS_URL", None)  # eager Celery, in-memory channel layer: the pass alone
    os.environ.setdefault("SECRET_KEY", "bench-" + "x" * 40)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")
    _create_database(args.database_url)

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from ingest.models import Incident, Run, Tenant
    from ingest.services import events_ingest, ingestion, pipeline, runs_process

    ingestion.detection_enqueue = lambda run_pks, **kwargs: None  # embedded, ingest would process them
    # The notification task is queued after the commit and runs in a worker, not in the pass (eager
    # here, it would run in it).
    pipeline.incidents_notify_enqueue = lambda incident_ids: None
    Run.objects.all().delete()
    tenant, _ = Tenant.objects.get_or_create(slug="bench-incidents")
    real_statement = pipeline.incidents_statement
    timings: dict[bool, list[float]] = {True: [], False: []}
    for n in range(args.rounds * 2):
        with_incidents = n % 2 == 0
        events = []
        tag = uuid.uuid4().hex[:8]
        for r in range(args.runs):
            run_id = f"{tag}-{r}"
            events.append({"type": "run_started", "run_id": run_id, "ts": _ts(0), "backend": "openai"})
            for i in range(1, args.calls + 1):
                events += [
                    {"type": "model_round", "run_id": run_id, "ts": _ts(i), "round": i},
                    {
                        "type": "tool_call",
                        "run_id": run_id,
                        "ts": _ts(i),
                        "round": i,
                        "call_id": f"c{i}",
                        "tool": "search_orders",
                        "kind": "read",
                        "args": {"customer": "42"},
                    },
                    {
                        "type": "tool_result",
                        "run_id": run_id,
                        "ts": _ts(i),
                        "call_id": f"c{i}",
                        "status": "ok",
                        "result": {"orders": []},
                    },
                ]
        pks = events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20).runs_touched
        pipeline.incidents_statement = real_statement if with_incidents else (lambda keys: None)
        started = time.perf_counter()
        runs_process(run_pks=sorted(pks))
        timings[with_incidents].append(time.perf_counter() - started)
    pipeline.incidents_statement = real_statement
    made = Incident.objects.filter(tenant=tenant).count()
    on, off = statistics.median(timings[True]), statistics.median(timings[False])
    share = (on - off) / off
    print(
        f"detection pass of {args.runs} looping runs ({args.calls} calls each), {args.rounds} passes each way"
    )
    print(f"  with incidents      median {on * 1000:8.1f} ms a pass   ({made} incidents made)")
    print(f"  without incidents   median {off * 1000:8.1f} ms a pass")
    print(
        f"  incidents add       {share * 100:+.1f} %   (ceiling {CEILING * 100:.0f} %: {'met' if share <= CEILING else 'NOT MET'})"
    )
    Run.objects.filter(tenant=tenant).delete()
    return 0 if share <= CEILING else 1


def _ts(second: int) -> str:
    return f"2026-11-29T10:{second // 60:02d}:{second % 60:02d}Z"


def _create_database(url: str) -> None:
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(base + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    sys.exit(main())
