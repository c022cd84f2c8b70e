"""`manage.py demo_beat`: Celery beat's periodic jobs for the embedded mode, which has no beat.

`python3 dev.py up` runs it beside the server, so that the demo shows what a deployment with
`celery beat` does: UNKNOWN writes reconciled (ledger_reconcile), leases expired, runs whose
enqueue was lost swept up, the overview's hourly rollup kept current, OTLP spans that waited
too long dropped. Each job of CELERY_BEAT_SCHEDULE runs in this process (`Task.apply`), at its
interval, the first time one interval after the start, as beat does.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

TICK_S = 0.5  # how often the loop looks whether a job is due


def _interval_s(name: str, schedule: Any) -> float:
    if isinstance(schedule, int | float) and schedule > 0:
        return float(schedule)
    if isinstance(schedule, timedelta) and schedule.total_seconds() > 0:
        return schedule.total_seconds()
    raise CommandError(f"CELERY_BEAT_SCHEDULE[{name!r}]: demo_beat runs intervals only, got {schedule!r}")


class Command(BaseCommand):
    help = "Run Celery beat's periodic jobs (CELERY_BEAT_SCHEDULE) in this process: the embedded mode has no beat."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run every job once now, then exit")

    def handle(self, *args: Any, once: bool, **options: Any) -> None:
        from loopwatch.celery import app

        app.loader.import_default_modules()  # the apps' tasks modules, as a worker loads them
        jobs = {name: entry for name, entry in settings.CELERY_BEAT_SCHEDULE.items()}
        intervals = {name: _interval_s(name, entry["schedule"]) for name, entry in jobs.items()}
        for name, entry in jobs.items():
            if entry["task"] not in app.tasks:
                raise CommandError(f"CELERY_BEAT_SCHEDULE[{name!r}]: no task named {entry['task']!r}")
        if once:
            for name in jobs:
                self._run(app, name, jobs[name])
            return
        started = time.monotonic()
        due = {name: started + interval for name, interval in intervals.items()}
        try:
            while True:
                now = time.monotonic()
                for name in sorted(due, key=due.__getitem__):
                    if due[name] <= now:
                        self._run(app, name, jobs[name])
                        due[name] = max(due[name] + intervals[name], time.monotonic())
                time.sleep(max(0.0, min(TICK_S, min(due.values()) - time.monotonic())))
        except KeyboardInterrupt:
            pass

    def _run(self, app: Any, name: str, entry: dict[str, Any]) -> None:
        result = app.tasks[entry["task"]].apply(
            args=entry.get("args", ()), kwargs=entry.get("kwargs", {}), throw=False
        )
        if result.failed():
            # A job that failed (the database busy, say) is tried again at its next interval.
            self.stderr.write(f"demo_beat: {name} failed: {type(result.result).__name__}: {result.result}")
