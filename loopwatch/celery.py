"""The Celery app. Broker and eager mode come from settings (REDIS_URL)."""

from __future__ import annotations

import logging
import os

from celery import Celery, bootsteps
from celery.signals import worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")

# A detection pass's events and rows (like an ingest batch) are thousands of dicts and lists that
# live until its end and then die by reference counting. At the default threshold (a young
# collection every 700 allocations) the collector scanned them again and again (on ingest's
# traffic, ~20 times a batch: 1.1 us an event). A young collection every 50,000 allocations lets a
# pass's objects come and go unscanned; cyclic garbage waits that long, a few MB at most. Only in
# Celery's worker processes: in the web processes the rarer, longer collections put pauses of up
# to ~100 ms into the guard's tail (bench/guard.py: p99 at 300/s from 8 to 11-20 ms); they take
# a smaller one (loopwatch.asgi.WEB_GC_THRESHOLD).
GC_THRESHOLD = (50_000, 20, 20)

app = Celery("loopwatch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger(__name__)


class SweepTimer(bootsteps.StartStopStep):
    """Every LOOPWATCH_SWEEP_EVERY_S, the worker sends detect_sweep, if no worker has in that time.

    Beat sends it too, but beat is one process that may be down: with this, any worker finds the
    runs whose enqueue was lost. Runs on the worker's own timer, in its main process: it only asks
    Redis for the claim (ingest.pending.sweep_claim, a key with the interval as its lifetime, so one
    worker of all wins each time) and sends the message; the sweep runs in a pool process.
    """

    requires = ("celery.worker.components:Timer",)

    def __init__(self, worker, **kwargs) -> None:
        super().__init__(worker, **kwargs)
        self.tref = None

    def start(self, worker) -> None:
        from django.conf import settings

        every = float(settings.LOOPWATCH_SWEEP_EVERY_S)
        self.tref = worker.timer.call_repeatedly(every, self.tick, (every,), priority=10)

    def stop(self, worker) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def tick(self, every: float) -> None:
        from ingest.events import TASK_DETECT_SWEEP
        from ingest.pending import sweep_claim

        try:
            if sweep_claim(ttl_s=every * 0.9):  # a little short: the next tick's claim must not find it
                app.send_task(TASK_DETECT_SWEEP)
        except Exception as exc:  # Redis away: the next tick tries again
            logger.warning("detect_sweep not sent: %s: %s", type(exc).__name__, exc)


app.steps["worker"].add(SweepTimer)


@worker_process_init.connect
def _collect_less(**kwargs) -> None:
    """GC_THRESHOLD in each worker process; what it loaded before forking stays out of full passes."""
    import gc

    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
