"""What a rate limit costs a request: ingest.quotas.quota_take, one process, against the real Redis.

    REDIS_URL=redis://127.0.0.1:6379/13 .venv/bin/python bench/quotas.py [--calls 5000]

Takes a batch of 100 events from a tenant's and a key's limits (events a second and a day: four
buckets, one Lua script, one round trip) --calls times, with limits too high to refuse anything,
beside a plain Redis PING (the round trip alone), then the same with the buckets in the process (the embedded mode), and with no limit set (the
cost every request pays when none is configured). Prints p50/p99/max per call beside the ceiling
it should stay under: 1 ms at p99 (a REST batch of 100 events takes several ms to store).
Touches only keys under loopwatch:bench-quotas:quota:* of that Redis database, and removes them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")
os.environ["CELERY_QUEUE"] = "bench-quotas"
os.environ.setdefault("SECRET_KEY", "bench-quotas-" + "x" * 40)

CEILING_MS = 1.0


def measure(calls: int, take) -> list[float]:
    timings = []
    for _ in range(calls):
        started = time.perf_counter()
        take()
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def report(name: str, timings: list[float]) -> bool:
    timings.sort()
    p50 = statistics.median(timings)
    p99 = timings[int(len(timings) * 0.99) - 1]
    within = p99 < CEILING_MS
    print(
        f"{name:<34} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  max {timings[-1]:7.3f} ms  "
        f"(ceiling p99 < {CEILING_MS} ms: {'ok' if within else 'OVER'})"
    )
    return within


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    if not os.environ.get("REDIS_URL"):
        print("set REDIS_URL=redis://host:port/db (a database of its own)", file=sys.stderr)
        return 2
    import django

    django.setup()
    from django.conf import settings

    from ingest.models import ApiKey, Tenant
    from ingest.pending import redis_client
    from ingest.quotas import quota_take, quotas_forget

    big = 10**9
    tenant = Tenant(pk=1, slug="bench", events_per_s=big, events_per_day=big)
    key = ApiKey(pk=1, tenant=tenant, prefix="bench", events_per_s=big, events_per_day=big)
    bare_tenant = Tenant(pk=2, slug="bare", events_per_s=0, events_per_day=0)
    bare = ApiKey(pk=2, tenant=bare_tenant, prefix="bare")

    def take(k=key):
        return lambda: quota_take(key=k, what="events", cost=100)

    ok = True
    print(f"quota_take of 100 events, {args.calls} calls, one process; load average {os.getloadavg()[0]:.2f}")
    measure(200, take())  # connections and the script loaded
    ok &= report("Redis, tenant + key (4 buckets)", measure(args.calls, take()))
    report("baseline: one Redis PING", measure(args.calls, redis_client(fast=True).ping))
    redis_url, settings.REDIS_URL = settings.REDIS_URL, ""
    quotas_forget()
    ok &= report("in the process (embedded)", measure(args.calls, take()))
    ok &= report("no limit set", measure(args.calls, take(bare)))
    settings.REDIS_URL = redis_url
    client = redis_client()
    for name in client.scan_iter("loopwatch:bench-quotas:quota:*"):
        client.delete(name)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
