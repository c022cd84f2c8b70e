"""The overview of a tenant with many distinct backend/model pairs: HTML size and server time.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/loopwatch_x .venv/bin/python bench/overview_facets.py \
        [--pairs 2000] [--runs-per-pair 2] [--repeat 5] [--concurrent 8]

One hostile (or merely busy) tenant sends runs over --pairs distinct (backend, model) pairs, each with
a loop intervention, over the last day. The script:

1. migrates the database named by DATABASE_URL, replaces the tenant `bench-facets` (and its runs,
   detections and user) with fresh data: --runs-per-pair runs per pair, one detection each;
2. renders `/` (the default range, the last day) with Django's test client in this process, signed in
   as the tenant's viewer: one warm-up, then --repeat requests; prints the median and slowest time
   and the HTML size, against the ceilings (CEILING_MS, CEILING_BYTES);
3. with --concurrent N, serves N requests at once from N threads and prints how many were answered
   and how long the last took (a web process must keep answering its health check meanwhile);
4. deletes the tenant again (--keep leaves it).

Exits 0 (the figures are for reading), 2 on a setup error.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TENANT = "bench-facets"
USERNAME = "bench-facets-viewer"
CEILING_MS = 1000.0  # a page render; the issue saw ~8 s for 2,000 pairs
CEILING_BYTES = 2_000_000  # the issue saw 38 MB for 2,000 pairs


def setup_django() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("DATABASE_URL must name a PostgreSQL database", file=sys.stderr)
        raise SystemExit(2)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("SECRET_KEY", "bench-overview-facets-not-a-secret-0123456789abcdef")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def generate(pairs: int, runs_per_pair: int) -> None:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from dashboards.models import Membership
    from ingest.models import Detection, Run, Tenant

    Tenant.objects.filter(slug=TENANT).delete()
    get_user_model().objects.filter(username=USERNAME).delete()
    tenant = Tenant.objects.create(slug=TENANT, name=TENANT)
    user = get_user_model().objects.create_user(USERNAME, password="bench")
    Membership.objects.create(user=user, tenant=tenant, role="viewer")
    now = timezone.now()
    runs = []
    for p in range(pairs):
        backend, model = f"backend-{p % 400}", f"model-{p}"
        for r in range(runs_per_pair):
            runs.append(
                Run(
                    tenant=tenant,
                    run_id=f"facets-{p}-{r}",
                    backend=backend,
                    model=model,
                    task_type=f"task-{p % 50}",
                    agent=f"agent-{p % 30}",
                    status="succeeded" if r % 2 else "failed",
                    started_at=now - timedelta(minutes=(p * 7 + r) % 1400 + 1),
                    rounds=3 + p % 20,
                    tool_calls=5 + p % 40,
                    cost_usd=0.01 * (1 + p % 9),
                    loop_flagged=True,
                )
            )
    Run.objects.bulk_create(runs, batch_size=2000)
    kinds = ("exact_repeat", "oscillation", "no_progress", "repeated_error")
    detections = [
        Detection(
            tenant=tenant,
            run=run,
            seq=3,
            kind=kinds[i % len(kinds)],
            action="correct" if i % 3 else "handoff",
            backend=run.backend,
            model=run.model,
            task_type=run.task_type,
            agent=run.agent,
            ts=run.started_at + timedelta(seconds=30),
        )
        for i, run in enumerate(Run.objects.filter(tenant=tenant).order_by("pk"))
    ]
    Detection.objects.bulk_create(detections, batch_size=2000)


def _signed_in_client():
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username=USERNAME))  # django-axes wants no password
    return client


def measure(repeat: int) -> tuple[list[float], int]:
    from django.core.cache import cache

    client = _signed_in_client()
    cache.clear()
    response = client.get("/")  # warm-up (and the filter options cached, as on a live server)
    assert response.status_code == 200, response.status_code
    times = []
    size = 0
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get("/")
        times.append((time.perf_counter() - started) * 1000)
        size = len(response.content)
    return times, size


def concurrent(n: int) -> tuple[int, float]:
    from django.db import connection

    answered: list[int] = []

    def one() -> None:
        client = _signed_in_client()
        if client.get("/").status_code == 200:
            answered.append(1)
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(answered), (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--runs-per-pair", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    setup_django()
    started = time.perf_counter()
    generate(args.pairs, args.runs_per_pair)
    print(
        f"generated {args.pairs} backend/model pairs, {args.pairs * args.runs_per_pair} runs and "
        f"detections in {time.perf_counter() - started:.1f} s"
    )
    try:
        times, size = measure(args.repeat)
        print(
            f"overview, last day: median {statistics.median(times):.0f} ms, slowest {max(times):.0f} ms "
            f"(ceiling {CEILING_MS:.0f} ms); HTML {size / 1e6:.2f} MB (ceiling {CEILING_BYTES / 1e6:.1f} MB)"
        )
        if args.concurrent:
            answered, elapsed = concurrent(args.concurrent)
            print(f"{args.concurrent} at once: {answered} answered in {elapsed:.0f} ms")
    finally:
        if not args.keep:
            from django.contrib.auth import get_user_model

            from ingest.models import Tenant

            Tenant.objects.filter(slug=TENANT).delete()
            get_user_model().objects.filter(username=USERNAME).delete()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
