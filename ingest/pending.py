"""Runs waiting for detection, gathered in Redis so that one task takes all that came meanwhile.

A task per ingest batch made every batch's runs a pass of their own: under load the tasks queued
up one behind the other, each paying a pass's dozen round trips and a state read and write per
run for a couple of events, and an alert waited behind all of them. Here a batch adds its runs to
a set and queues a task only when none is queued (a flag, set with the runs in one transaction).
A task, when it starts, clears the flag (the next batch queues another task, so the workers share
the work) and takes runs from the set, pass after pass, until the set is empty or it has worked
for TASK_BUDGET_S; then, if runs are left, it makes sure a task is queued. So at most one task
waits in the broker, and a run waits at most about one pass.

A task that dies after taking runs loses them from the set only: their cursors lag their events,
and detect_sweep (Celery beat, every minute) queues them again.
"""

from __future__ import annotations

import threading

from django.conf import settings

TAKE = 500  # runs a pass takes at most: a pass reads their cursors, events and runs in one go
TASK_BUDGET_S = 5.0  # a task stops taking after this long: its time limit stays far away
FLAG_TTL_S = 60  # a flag whose task never came (a lost message) lets a new one be queued after this

_client = None
_client_lock = threading.Lock()


def redis_client():
    """This process's Redis client (REDIS_URL), for every module that keeps state in Redis."""
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                import redis

                # redis-py's pool notices a fork and opens new connections in the child.
                _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10)
    return _client


def _keys() -> tuple[str, str]:
    # Per Celery queue: deployments (and test runs) that share a Redis keep their own runs.
    from loopwatch.celery import app

    queue = app.conf.task_default_queue
    return f"loopwatch:{queue}:detect:pending", f"loopwatch:{queue}:detect:queued"


def pending_add(run_pks: list[int]) -> bool:
    """Add runs to the set. True when the caller must queue a task: none was queued."""
    pending, queued = _keys()
    pipe = redis_client().pipeline(transaction=True)
    if run_pks:
        pipe.sadd(pending, *run_pks)
    pipe.set(queued, "1", nx=True, ex=FLAG_TTL_S)
    return bool(pipe.execute()[-1])


def pending_unqueue() -> None:
    """The task could not be queued: let the next batch try."""
    redis_client().delete(_keys()[1])


def pending_take(*, limit: int = TAKE, starting: bool = False) -> list[int]:
    """Take up to `limit` runs off the set. `starting`: the task has just started; the flag is
    cleared in the same transaction, so a batch stored after this queues a task of its own."""
    pending, queued = _keys()
    pipe = redis_client().pipeline(transaction=True)
    if starting:
        pipe.delete(queued)
    pipe.spop(pending, limit)
    return sorted(int(pk) for pk in pipe.execute()[-1] or ())


def pending_count() -> int:
    return int(redis_client().scard(_keys()[0]))
