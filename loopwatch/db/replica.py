"""Reads of the dashboards from a streaming replica, when DATABASE_REPLICA_URL is set.

Only the pages people look at read there: a GET or HEAD to a view of the `dashboards` app, for
the models of `ingest` and `dashboards`. Everything else reads and writes the primary: ingest, the
API, the guard and the ledger (their reads decide what is written: a lagging copy would answer a
claim with a stale state), Celery tasks, the admin, sign-in and sessions (a session written at
sign-in must be found at the next request).

Read-your-writes. A replica lags the primary by its replay delay (milliseconds on a healthy local
replica, more under load or after a pause). A person who changes something on a page (a verdict,
a threshold, a queue decision: any POST to a dashboards view) is redirected to a page that would
not show it yet; so such a request sets a cookie that keeps that browser's reads on the primary
for LOOPWATCH_REPLICA_PIN_S. Other people see the change once the replica has replayed it. The
live alerts socket reads the primary. docs/scaling.md says more.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve

REPLICA = "replica"
PIN_COOKIE = "lw_primary_until"
REPLICA_APPS = frozenset({"ingest", "dashboards"})
SAFE_METHODS = frozenset({"GET", "HEAD"})

_reads_from_replica: ContextVar[bool] = ContextVar("loopwatch_reads_from_replica", default=False)


@contextmanager
def replica_reads() -> Iterator[None]:
    """Within it, reads of REPLICA_APPS' models go to the replica (when there is one)."""
    token = _reads_from_replica.set(True)
    try:
        yield
    finally:
        _reads_from_replica.reset(token)


class ReplicaRouter:
    """Reads to the replica inside replica_reads(); writes, migrations and the rest to the primary."""

    def db_for_read(self, model, **hints) -> str | None:
        if _reads_from_replica.get() and model._meta.app_label in REPLICA_APPS:
            return REPLICA
        return None

    def db_for_write(self, model, **hints) -> str:
        return "default"

    def allow_relation(self, obj1, obj2, **hints) -> bool:
        return True  # one database and its copy

    def allow_migrate(self, db: str, app_label: str, **hints) -> bool:
        return db == "default"


def _is_dashboard(request: HttpRequest) -> bool:
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return False
    return match.func.__module__.startswith("dashboards.")


class ReplicaReadsMiddleware:
    """The dashboards' GETs read from the replica, unless this browser wrote within the pin time;
    a dashboards' POST (or any other unsafe method) sets that pin."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not _is_dashboard(request):
            return self.get_response(request)
        if request.method not in SAFE_METHODS:
            response = self.get_response(request)
            pin_s = settings.LOOPWATCH_REPLICA_PIN_S
            response.set_cookie(
                PIN_COOKIE, str(int(time.time()) + pin_s), max_age=pin_s, httponly=True, samesite="Lax"
            )
            return response
        try:
            pinned = int(request.COOKIES.get(PIN_COOKIE, "0")) > time.time()
        except ValueError:
            pinned = False
        if pinned:
            return self.get_response(request)
        with replica_reads():
            return self.get_response(request)
