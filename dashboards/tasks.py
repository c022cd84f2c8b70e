"""Celery tasks of the dashboards: interfaces that call a service."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.utils import timezone

from dashboards.overview.rollup import rollup_pass


@shared_task(name="dashboards.overview_rollup", soft_time_limit=240, time_limit=300)
def overview_rollup(now: str | None = None) -> int:
    """Roll the overview's closed hours that need it. Harmless twice or concurrently: an hour is
    rebuilt under its marker's lock. `now`: ISO time of the pass (beat sends none: the clock's)."""
    return rollup_pass(now=datetime.fromisoformat(now) if now else timezone.now())


@shared_task(name="dashboards.overview_rollup_purge", soft_time_limit=240, time_limit=300)
def overview_rollup_purge(now: str | None = None) -> int:
    """Delete the rollup hours older than LOOPWATCH_ROLLUP_RETENTION_DAYS. Harmless twice."""
    from dashboards.overview.rollup import rollups_purge

    return rollups_purge(now=datetime.fromisoformat(now) if now else timezone.now())
