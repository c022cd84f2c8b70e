"""Django's PostgreSQL backend with a pool health check that costs no round trip, and timestamps
Python cannot hold read as the nearest it can.

Django's pool asks the server (an empty query) every time a request takes a connection: on the
ledger's claim and the guard's check that was a second round trip beside the one the request
needs, a third of its server time. A pooled connection the server has hung up on (a restart, an
idle timeout, pg_terminate_backend) gets a message or an end of file on its socket first, so the
check here looks at the socket without waiting: nothing to read, the connection is as it was when
the pool took it back; something to read, the server said something while it sat idle, and only
then is it asked. A failed check makes the pool drop the connection and hand out another one.

The pool itself (loopwatch.db.pool) answers fast while the server is down and reconnects within a
second once it is back; its connections (loopwatch.db.stall) give up on a server that froze.

PostgreSQL keeps instants from 4713 BC; Python's datetime from year 1 to 9999. Before ingest checked
the year of a `ts` (docs/limits.md), 0001-01-01T00:00:00+01:00 was stored as 1 BC, and psycopg
raised on every read of that row: the run's page, the runs list, its detection. Such a value is
read as the first (or last) instant Python has.
"""

from __future__ import annotations

import functools
import select
from datetime import datetime

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from django.db.backends.postgresql.psycopg_any import BaseTzLoader
from psycopg.adapt import AdaptersMap

from loopwatch.db.pool import Pool
from loopwatch.db.stall import Connection


def connection_check(conn) -> None:
    """The pool's check at checkout: raise when the connection cannot be used; quiet otherwise."""
    from psycopg_pool import ConnectionPool

    if conn.closed or conn.broken:
        raise base.Database.OperationalError("the connection is closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


class _BoundedTzLoader(BaseTzLoader):
    """Django's timestamptz loader (text format, as Django reads), with an instant before year 1 or
    after 9999 read as datetime.min or datetime.max instead of raising."""

    def load(self, data):
        try:
            return super().load(data)
        except base.Database.DataError:
            text = bytes(data)
            early = text.endswith(b" BC") or text.startswith(b"-")
            return (datetime.min if early else datetime.max).replace(tzinfo=self.timezone)


@functools.cache
def _bounded_adapters(template, timezone):
    """Django's adapters for a connection with _BoundedTzLoader for timestamptz."""
    adapters = AdaptersMap(template)
    loader = type("BoundedTzLoader", (_BoundedTzLoader,), {"timezone": timezone})
    adapters.register_loader("timestamptz", loader)
    return adapters


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self):
        params = super().get_connection_params()
        if params.get("context") is not None:
            params["context"] = _bounded_adapters(params["context"], self.timezone)
        return params

    @property
    def pool(self):
        # Django's DatabaseWrapper.pool, with loopwatch.db.pool's Pool, connection_check and the
        # stall-watching connection class: Django passes check= itself, so the pool options in
        # DATABASES cannot carry another one.
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        if self.alias not in self._connection_pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's: it sets the mode it wants later
            pool = Pool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,
                verify=connection_check if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
                connection_class=Connection,
                **({} if pool_options is True else pool_options),
            )
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]
