"""Django's PostgreSQL backend with a pool health check that costs no round trip.

Django's pool asks the server (an empty query) every time a request takes a connection: on the
ledger's claim and the guard's check that was a second round trip beside the one the request
needs, a third of its server time. A pooled connection the server has hung up on (a restart, an
idle timeout, pg_terminate_backend) gets a message or an end of file on its socket first, so the
check here looks at the socket without waiting: nothing to read, the connection is as it was when
the pool took it back; something to read, the server said something while it sat idle, and only
then is it asked. A failed check makes the pool drop the connection and hand out another one.

The pool itself (loopwatch.db.pool) answers fast while the server is down and reconnects within a
second once it is back; its connections (loopwatch.db.stall) give up on a server that froze.
"""

from __future__ import annotations

import select

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base

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


class DatabaseWrapper(base.DatabaseWrapper):
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
