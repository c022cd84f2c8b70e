"""Celery's broker transport: kombu's Redis transport with one reconnect race closed.

When a worker loses Redis, Celery (5.7) first collects the broker connection, which drops the
transport's link to its parameters (`transport.client = None`), then closes the connection. A
channel the collection left open (its close failed on the dead socket before it was marked closed)
is closed then, and closing it puts its unacknowledged messages back in their queue: that needs a
new connection pool, built from `transport.client`, and kombu's `_connparams` read `None.hostname`.
The AttributeError is not a connection error: Celery called it unrecoverable and the worker shut
down (tests/faults: "redis down, back empty", about one run in six).

Here a channel keeps the parameters it was opened with and builds from them when its transport has
let go of its own: the messages go back to a Redis that answers, and a Redis still away fails with
redis' ConnectionError, which Celery's teardown expects, ignores, and then reconnects.
"""

from __future__ import annotations

from kombu.transport import redis


class Channel(redis.Channel):
    def __init__(self, connection, *args, **kwargs) -> None:
        # Before the parent's __init__: it connects (and so reads the parameters) already.
        self._conninfo = connection.client
        super().__init__(connection, *args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> dict:
        transport = self.connection
        if transport.client is not None:
            return super()._connparams(asynchronous=asynchronous)
        transport.client = self._conninfo  # for the parent's read only: let go again after it
        try:
            return super()._connparams(asynchronous=asynchronous)
        finally:
            transport.client = None


class Transport(redis.Transport):
    Channel = Channel
