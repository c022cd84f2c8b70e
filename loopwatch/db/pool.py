"""psycopg_pool's pool, made to fail fast while the database is away and to recover at once.

What psycopg_pool does by itself, measured with the server stopped (issue 12): a request waits the
pool's whole timeout (it was 30 s) for a connection, then fails; a replacement connection is
tried again after 1, 2, 4, 8 … s, so after an outage of 20 / 45 / 100 s the first connection
came 8 / 16 / 20 s after the server was back; and a pooled connection that fails its check makes
the request sleep the same growing delays before it tries the next one, so the dead connections
left in the pool by a restart cost a request seconds. Here:

1. Reconnection attempts are never more than RECONNECT_DELAY_MAX_S apart, whatever the outage's
   length: the server back, the pool has a connection within that (plus the connection's time).
   An attempt to a stopped server is a refused connection (microseconds); to a frozen one it
   waits connect_timeout, in the pool's own thread, never in a request's.
2. The health check is done here, at checkout, not by psycopg_pool: a connection that fails it is
   closed and dropped and the next one is taken at once (the pool replaces it in the background).
3. While the last attempt to connect failed and none has succeeded since, a request waits at most
   DOWN_WAIT_S for a connection: a down database answers every request in well under a second,
   and the request threads (eight per process) are not all held for the pool's full timeout
   while more requests queue behind them. The requests already waiting when an attempt fails
   get their answer then, not at the end of their timeout.
4. Each connection gets `stall_s` (loopwatch.db.stall): a wait on a frozen server gives up, and
   tells the pool (`server_gone`), which also drops its idle connections: they would stall too.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

from psycopg_pool import ConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

RECONNECT_DELAY_MAX_S = 0.5
DOWN_WAIT_S = 0.5


class _CappedBackoff(AttemptWithBackoff):
    """psycopg_pool's exponential backoff (with its jitter and its reconnect_timeout), capped."""

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_DELAY_MAX_S)


class Pool(ConnectionPool):
    """A ConnectionPool with bounded reconnection, a check at checkout and a fast answer when the
    server is down. `verify(conn)` raises when a pooled connection cannot be used; `stall_s` goes
    to every connection (connection_class should be loopwatch.db.stall.Connection)."""

    def __init__(self, *args, verify: Callable | None = None, stall_s: float = 0.0, **kwargs) -> None:
        self._verify = verify
        self._stall_s = stall_s
        self._down_since: float | None = None  # the last connection attempt failed, at this time
        super().__init__(*args, **kwargs)

    @property
    def down_since(self) -> float | None:
        return self._down_since

    def getconn(self, timeout: float | None = None):
        timeout = self.timeout if timeout is None else timeout
        if self._down_since is not None:
            timeout = min(timeout, DOWN_WAIT_S)
        deadline = monotonic() + timeout
        while True:
            conn = super().getconn(max(0.0, deadline - monotonic()))
            if self._verify is None:
                return conn
            try:
                self._verify(conn)
            except Exception:
                conn.close()  # a closed connection returned is dropped, and replaced in the background
                self.putconn(conn)
                if monotonic() >= deadline:
                    raise PoolTimeout(f"no usable connection after {timeout:.2f} sec") from None
                continue
            return conn

    def server_gone(self, reason: str, *, stalled: bool = False) -> None:
        """The server did not answer: fail the requests waiting for a connection now; after a
        stall (a frozen server), close the idle connections and connect anew in the background."""
        with self._lock:
            if self._down_since is None:
                self._down_since = monotonic()
            waiting = list(self._waiting)
            self._waiting.clear()
        for client in waiting:
            client.fail(PoolTimeout(f"the database is unavailable: {reason}"))
        if stalled:
            self.drain()

    # psycopg_pool's internals (3.3): the reconnection attempts, the connection, the waiting queue.

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        super()._add_connection(attempt or _CappedBackoff(timeout=self.reconnect_timeout), growing)

    def _connect(self, timeout: float | None = None):
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            self.server_gone(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise
        self._down_since = None
        conn.stall_s = self._stall_s
        return conn
