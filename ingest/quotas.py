"""Rate limits and quotas per tenant and per API key: events a second and a day, guard checks a
second. Over one, the request is refused (429 with Retry-After, the limit named) and nothing of it
is counted against the others.

- A rate (`*_per_s`) is a token bucket holding LOOPWATCH_RATE_BURST_S seconds' worth. A request
  passes when the bucket holds what it costs, or is full: a batch larger than the bucket passes
  then and leaves it in debt, so a sender of big batches is held to the same average rate instead
  of never passing.
- A quota a day (`events_per_day`) is a counter per UTC day; a batch that does not fit in what is
  left is refused whole, until midnight UTC.
- The tenant's limits (its own, else the LOOPWATCH_TENANT_* defaults) and the key's (when set) are
  checked together: all of them must allow the request, and only then is it taken from all.

With REDIS_URL the buckets live in Redis, shared by every web process: one Lua script checks and
takes every limit of a request atomically, on Redis's clock (the web hosts' clocks do not matter).
Redis not answering within LOOPWATCH_ENQUEUE_TIMEOUT_MS, requests pass (fail open: a limiter must
not stop ingest that works), with a warning in the log and `loopwatch_rate_limit_fail_open_total`;
Redis is tried again after FAIL_OPEN_RETRY_S. Without REDIS_URL (the embedded mode, one process)
the buckets live in the process.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from django.conf import settings

from ingest import metrics

logger = logging.getLogger(__name__)

What = Literal["events", "checks"]

DAY_S = 86_400
FAIL_OPEN_RETRY_S = 1.0  # after a Redis failure, requests pass without asking it for this long
SETTING = {
    "events_per_s": "LOOPWATCH_TENANT_EVENTS_PER_S",
    "events_per_day": "LOOPWATCH_TENANT_EVENTS_PER_DAY",
    "checks_per_s": "LOOPWATCH_TENANT_CHECKS_PER_S",
}
FIELDS: dict[str, tuple[str, ...]] = {
    "events": ("events_per_s", "events_per_day"),
    "checks": ("checks_per_s",),
}


@dataclass(frozen=True)
class Limit:
    """One limit a request is held to: `name` is what a refusal says (`tenant.events_per_s`)."""

    name: str
    bucket: str  # the bucket's key (in Redis, or in the process)
    amount: int  # a rate (per second) or a quota (per UTC day)

    @property
    def daily(self) -> bool:
        return self.name.endswith("_per_day")

    def capacity(self) -> float:
        return DAY_S if self.daily else self.amount * settings.LOOPWATCH_RATE_BURST_S


class OverLimit(Exception):
    """The request is over `limit`; it may be sent again after `retry_after_s`."""

    def __init__(self, limit: Limit, retry_after_s: int, *, cost: int, what: What, owner: str) -> None:
        self.limit, self.retry_after_s, self.cost = limit, retry_after_s, cost
        unit = "events" if what == "events" else "guard checks"
        per = "a UTC day" if limit.daily else "a second"
        size = f"{cost} event{'s' if cost != 1 else ''}" if what == "events" else "this check"
        super().__init__(
            f"{limit.name}: {owner} may send {limit.amount} {unit} {per}; {size} went over it; "
            f"retry after {retry_after_s} s"
        )


def limits_of(key, what: What) -> list[Limit]:
    """The limits a request of `key` for `what` is held to (empty: none)."""
    tenant = key.tenant
    limits = []
    for field in FIELDS[what]:
        tenant_amount = getattr(tenant, field)
        if tenant_amount is None:
            tenant_amount = getattr(settings, SETTING[field])
        if tenant_amount:
            limits.append(Limit(f"tenant.{field}", f"t{tenant.pk}:{field}", tenant_amount))
        key_amount = getattr(key, field)
        if key_amount:
            limits.append(Limit(f"key.{field}", f"k{key.pk}:{field}", key_amount))
    return limits


def quota_take(*, key, what: What, cost: int = 1) -> None:
    """Count a request of `cost` events (or checks) against the key's and its tenant's limits, or
    raise OverLimit (and count nothing) when one of them does not allow it."""
    limits = limits_of(key, what)
    if not limits or cost <= 0:
        return
    if settings.REDIS_URL:
        refused = _redis.take(limits, cost)
    else:
        refused = _local.take(limits, cost, time.time())
    if refused is None:
        return
    limit, wait_s = refused
    owner = f"tenant {key.tenant.slug}" if limit.name.startswith("tenant.") else f"API key {key.prefix}…"
    metrics.rate_limited(limit=limit.name, tenant=key.tenant)
    logger.info("429 for tenant %s, key %s…: over %s", key.tenant.slug, key.prefix, limit.name)
    raise OverLimit(limit, max(1, math.ceil(wait_s)), cost=cost, what=what, owner=owner)


def _wait_s(limit: Limit, level: float, cost: int, now: float) -> float:
    """Seconds until `limit`, its bucket at `level`, lets `cost` through (0: now)."""
    if limit.daily:  # level: used today
        return 0.0 if level + cost <= limit.amount else DAY_S - now % DAY_S
    need = min(cost, limit.capacity())  # a full bucket lets any batch through
    return 0.0 if level >= need else (need - level) / limit.amount


class _LocalBuckets:
    """The embedded mode's buckets, in this process: {bucket: (level, since)}."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._levels: dict[str, tuple[float, float]] = {}

    def _level(self, limit: Limit, now: float) -> float:
        level, since = self._levels.get(limit.bucket, (None, now))
        if limit.daily:
            return level if level is not None and since // DAY_S == now // DAY_S else 0.0
        capacity = limit.capacity()
        if level is None:
            return capacity
        return min(capacity, level + (now - since) * limit.amount)

    def take(self, limits: list[Limit], cost: int, now: float) -> tuple[Limit, float] | None:
        with self._lock:
            levels = [self._level(limit, now) for limit in limits]
            waits = [_wait_s(limit, level, cost, now) for limit, level in zip(limits, levels, strict=True)]
            worst = max(range(len(limits)), key=waits.__getitem__)
            if waits[worst] > 0:
                return limits[worst], waits[worst]
            for limit, level in zip(limits, levels, strict=True):
                self._levels[limit.bucket] = (level + cost if limit.daily else level - cost, now)
            if len(self._levels) > 100_000:  # tenants and keys gone: forget them all, they refill
                self._levels.clear()
            return None

    def clear(self) -> None:
        with self._lock:
            self._levels.clear()


# KEYS: the buckets. ARGV: cost, then per bucket: daily (1/0), amount, capacity.
# A rate bucket is a hash {level, ms}; a daily one a counter per day (its key ends with the day).
# Returns {0} when taken, else {index (1-based) of the limit with the longest wait, wait in ms}.
_TAKE_LUA = """
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local day = math.floor(t[1] / 86400)
local cost = tonumber(ARGV[1])
local levels, worst, worst_wait = {}, 0, 0
for i, key in ipairs(KEYS) do
  local daily = ARGV[3 * i - 1] == '1'
  local amount = tonumber(ARGV[3 * i])
  local capacity = tonumber(ARGV[3 * i + 1])
  local wait = 0
  if daily then
    local used = tonumber(redis.call('GET', key .. ':' .. day) or '0')
    levels[i] = used
    if used + cost > amount then wait = 86400000 - now_ms % 86400000 end
  else
    local state = redis.call('HMGET', key, 'level', 'ms')
    local level = capacity
    if state[1] then
      level = math.min(capacity, tonumber(state[1]) + (now_ms - tonumber(state[2])) * amount / 1000)
    end
    levels[i] = level
    local need = math.min(cost, capacity)
    if level < need then wait = math.ceil((need - level) * 1000 / amount) end
  end
  if wait > worst_wait then worst, worst_wait = i, wait end
end
if worst > 0 then return {worst, worst_wait} end
for i, key in ipairs(KEYS) do
  local amount = tonumber(ARGV[3 * i])
  if ARGV[3 * i - 1] == '1' then
    redis.call('INCRBY', key .. ':' .. day, cost)
    redis.call('EXPIRE', key .. ':' .. day, 2 * 86400)
  else
    local level = levels[i] - cost
    local capacity = tonumber(ARGV[3 * i + 1])
    redis.call('HSET', key, 'level', level, 'ms', now_ms)
    -- gone when it would be full again: a missing bucket is a full one
    redis.call('PEXPIRE', key, math.ceil((capacity - level) * 1000 / amount) + 1000)
  end
end
return {0, 0}
"""


class _RedisBuckets:
    """The buckets in Redis (REDIS_URL), shared by every process; fail open while it is away."""

    def __init__(self) -> None:
        self._script: Any = None  # redis-py's Script, registered on first use
        self._skip_until = 0.0
        self._down = False
        self._lock = threading.Lock()

    def _prefix(self) -> str:
        return f"loopwatch:{settings.CELERY_TASK_DEFAULT_QUEUE}:quota:"

    def take(self, limits: list[Limit], cost: int) -> tuple[Limit, float] | None:
        from redis import RedisError

        from ingest.pending import redis_client

        if self._down and time.monotonic() < self._skip_until:
            metrics.rate_limit_fail_open()
            return None
        args: list = [cost]
        for limit in limits:
            args += [1 if limit.daily else 0, limit.amount, limit.capacity()]
        try:
            client = redis_client(fast=True)
            if self._script is None:
                self._script = client.register_script(_TAKE_LUA)
            index, wait_ms = self._script(
                keys=[self._prefix() + limit.bucket for limit in limits], args=args, client=client
            )
        except RedisError as exc:
            self._failed(exc)
            return None
        if self._down:
            with self._lock:
                self._down = False
            logger.warning("rate limits: Redis answers again; limits are enforced")
        if not index:
            return None
        return limits[int(index) - 1], int(wait_ms) / 1000

    def _failed(self, exc: BaseException) -> None:
        metrics.rate_limit_fail_open()
        with self._lock:
            first = not self._down
            self._down = True
            self._skip_until = time.monotonic() + FAIL_OPEN_RETRY_S
        if first:
            logger.warning(
                "rate limits: Redis did not answer (%s); requests pass unlimited until it does", exc
            )

    def forget(self) -> None:
        """A new script object and a fresh state on next use (a test that moved REDIS_URL)."""
        self._script = None
        self._down = False


_local = _LocalBuckets()
_redis = _RedisBuckets()


def quotas_forget() -> None:
    """Every bucket full again in this process, and Redis asked again at once (tests)."""
    _local.clear()
    _redis.forget()
