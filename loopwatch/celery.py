"""The Celery app. Broker and eager mode come from settings (REDIS_URL)."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")

# A detection pass's events and rows (like an ingest batch) are thousands of dicts and lists that
# live until its end and then die by reference counting. At the default threshold (a young
# collection every 700 allocations) the collector scanned them again and again (on ingest's
# traffic, ~20 times a batch: 1.1 us an event). A young collection every 50,000 allocations lets a
# pass's objects come and go unscanned; cyclic garbage waits that long, a few MB at most. Only in
# Celery's worker processes: in the web processes the rarer, longer collections put pauses of up
# to ~100 ms into the guard's tail (bench/guard.py: p99 at 300/s from 8 to 11-20 ms).
GC_THRESHOLD = (50_000, 20, 20)

app = Celery("loopwatch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def _collect_less(**kwargs) -> None:
    """GC_THRESHOLD in each worker process; what it loaded before forking stays out of full passes."""
    import gc

    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
