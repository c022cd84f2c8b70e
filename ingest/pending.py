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
and detect_sweep queues them again. The workers themselves send detect_sweep every
LOOPWATCH_SWEEP_EVERY_S (loopwatch.celery's SweepTimer; `sweep_claim` lets one worker of all do it
each time), and beat does too: losing beat delays nothing.

The request path (pending_add, after the batch's commit) talks to Redis with a short timeout and no
retries (LOOPWATCH_ENQUEUE_TIMEOUT_MS): a frozen Redis must not hold ingest. Runs whose enqueue did
not get an answer are kept by the process and added again once Redis answers (ingest.services'
requeue); that addition sets the flag whatever it holds and queues a task, so a flag left set by a
command that timed out (it may have run after all) cannot hold detection back.
"""

from __future__ import annotations

import threading

from django.conf import settings

TAKE = 500  # runs a pass takes at most: a pass reads their cursors, events and runs in one go
TASK_BUDGET_S = 5.0  # a task stops taking after this long: its time limit stays far away
FLAG_TTL_S = 60  # a flag whose task never came (a lost message) lets a new one be queued after this

_clients: dict[bool, object] = {}
_client_lock = threading.Lock()


def enqueue_timeout_s() -> float:
    return settings.LOOPWATCH_ENQUEUE_TIMEOUT_MS / 1000


def redis_client(*, fast: bool = False):
    """This process's Redis client (REDIS_URL), for every module that keeps state in Redis. `fast`: the request path's, whose every command answers or fails within
    enqueue_timeout_s (redis-py would otherwise retry three times, with backoff)."""
    client = _clients.get(fast)
    if client is None:
        with _client_lock:
            client = _clients.get(fast)
            if client is None:
                import redis
                from redis.backoff import NoBackoff
                from redis.retry import Retry

                # redis-py's pool notices a fork and opens new connections in the child.
                if fast:
                    timeout = enqueue_timeout_s()
                    client = redis.Redis.from_url(
                        settings.REDIS_URL,
                        socket_timeout=timeout,
                        socket_connect_timeout=timeout,
                        retry=Retry(NoBackoff(), 0),
                    )
                else:
                    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10)
                _clients[fast] = client
    return client


def pending_clients_forget() -> None:
    """New clients on next use (a test that moved REDIS_URL)."""
    _clients.clear()


def _keys() -> tuple[str, str]:
    # Per Celery queue: deployments (and test runs) that share a Redis keep their own runs.
    from loopwatch.celery import app

    queue = app.conf.task_default_queue
    return f"loopwatch:{queue}:detect:pending", f"loopwatch:{queue}:detect:queued"


def pending_add(run_pks: list[int], *, force: bool = False) -> bool:
    """Add runs to the set. True when the caller must queue a task: none was queued, or `force`
    (the flag is then set whatever it held). Raises redis.RedisError after enqueue_timeout_s."""
    pending, queued = _keys()
    pipe = redis_client(fast=True).pipeline(transaction=True)
    if run_pks:
        pipe.sadd(pending, *run_pks)
    pipe.set(queued, "1", nx=not force, ex=FLAG_TTL_S)
    return bool(pipe.execute()[-1])


def sweep_claim(*, ttl_s: float) -> bool:
    """True for one caller of all (across processes and hosts) per `ttl_s`: the one that sweeps."""
    from loopwatch.celery import app

    key = f"loopwatch:{app.conf.task_default_queue}:detect:sweep"
    return bool(redis_client(fast=True).set(key, "1", nx=True, px=max(1, int(ttl_s * 1000))))


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
