"""The Celery app. Broker and eager mode come from settings (REDIS_URL)."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")

# A batch of events is thousands of dicts and lists that live until the answer and then die by
# reference counting; so are a detection pass's events and rows. At the default threshold (a
# young collection every 700 allocations) the collector scanned them ~20 times a batch, some
# twice: 6 % of ingest's CPU, ~1.1 us an event. A young collection every 50,000 allocations lets a
# batch come and go unscanned; cyclic garbage (a request's few cycles) waits that long, a few MB
# at most. Set in the web processes (loopwatch.asgi) and Celery's worker processes (below).
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
