"""How many alert sockets each user has open, across every web process.

Each socket holds a claim: with Redis, a member of a sorted set per user whose score is the time the
claim runs out (so a process that died without releasing its sockets stops counting after
CLAIM_TTL_S); embedded, a dict in the one process. A socket renews its claim while it lives.
"""

from __future__ import annotations

import threading

from django.conf import settings

from ingest.pending import redis_client

# A live socket renews its claim every ACCESS_CHECK_S (30 s, dashboards/alerts/consumers.py): three
# misses, and the claim is taken for a socket of a process that is gone.
CLAIM_TTL_S = 90.0

# Drop the claims that ran out, then claim when there is room (or when this socket holds one already).
_CLAIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

_local: dict[int, dict[str, float]] = {}  # embedded: user id -> {channel: claim runs out at}
_local_lock = threading.Lock()


def _key(user_id: int) -> str:
    # Per database: deployments (and test runs) sharing a Redis count their own users.
    return f"loopwatch:{settings.DATABASES['default']['NAME']}:alert-sockets:{user_id}"


def alert_socket_claim(*, user_id: int, channel: str, now: float) -> bool:
    """Claim a place for this socket; False when the user has LOOPWATCH_ALERT_SOCKETS_PER_USER."""
    limit = settings.LOOPWATCH_ALERT_SOCKETS_PER_USER
    until = now + CLAIM_TTL_S
    if settings.REDIS_URL:
        claimed = redis_client().eval(
            _CLAIM, 1, _key(user_id), now, until, channel, limit, int(CLAIM_TTL_S) + 1
        )
        return bool(claimed)
    with _local_lock:
        claims = _local.setdefault(user_id, {})
        for name in [name for name, ends in claims.items() if ends <= now]:
            del claims[name]
        if channel not in claims and len(claims) >= limit:
            return False
        claims[channel] = until
        return True


def alert_socket_renew(*, user_id: int, channel: str, now: float) -> None:
    until = now + CLAIM_TTL_S
    if settings.REDIS_URL:
        redis_client().zadd(_key(user_id), {channel: until}, xx=True)
        return
    with _local_lock:
        claims = _local.get(user_id, {})
        if channel in claims:
            claims[channel] = until


def alert_socket_release(*, user_id: int, channel: str) -> None:
    if settings.REDIS_URL:
        redis_client().zrem(_key(user_id), channel)
        return
    with _local_lock:
        claims = _local.get(user_id, {})
        claims.pop(channel, None)
        if not claims:
            _local.pop(user_id, None)


def alert_sockets_open(*, user_id: int) -> int:
    """Claims held now, expired ones included until the next claim drops them."""
    if settings.REDIS_URL:
        return int(redis_client().zcard(_key(user_id)))
    with _local_lock:
        return len(_local.get(user_id, {}))
