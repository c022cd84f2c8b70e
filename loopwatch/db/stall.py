"""A query on a frozen server fails in seconds instead of waiting for ever.

A PostgreSQL that is stopped or killed closes its sockets: the client reads an end of file and
psycopg raises at once. A server that is frozen (SIGSTOP, a hung host, a network that drops
packets without a reset) does not: the kernel still acknowledges the bytes (TCP keepalives and
tcp_user_timeout see a healthy peer), and psycopg waits on the socket with no limit. Each request
of the web process then held its thread until the server came back, minutes later.

A time limit on every query would cut legitimate slow ones (a large dashboard query, a lock
wait). Here, a wait with no byte from the server for `stall_s` asks whether the server is there
at all: a new connection to it, an SSLRequest, which the postmaster answers with one byte before
any authentication, in microseconds. An answer: the server is alive and merely slow, keep waiting
(and ask again after another `stall_s`). No answer within PROBE_TIMEOUT_S, or a refusal: the
connection is closed and the wait raises OperationalError, which the request turns into a 503.

The answer is shared by the threads of the process for PROBE_FRESH_S: eight requests stalled on
one frozen server cost one probe, not eight.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Generator
from time import monotonic
from typing import Any

import psycopg

from loopwatch.db.pool import Pool

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0  # the postmaster answers an SSLRequest in well under a millisecond
PROBE_FRESH_S = 1.0
SSL_REQUEST = struct.pack("!ii", 8, 80877103)  # length, then the SSLRequest code (protocol docs)

_verdicts: dict[tuple[str, int], tuple[float, bool]] = {}
_verdicts_lock = threading.Lock()


def server_answers(host: str, port: int) -> bool:
    """Does a PostgreSQL server listen at host:port and answer a new connection right now?"""
    with _verdicts_lock:  # one probe at a time per process: the others take its answer
        checked = _verdicts.get((host, port))
        if checked and monotonic() - checked[0] < PROBE_FRESH_S:
            return checked[1]
        alive = _probe(host, port)
        _verdicts[(host, port)] = (monotonic(), alive)
        return alive


def _probe(host: str, port: int) -> bool:
    if host.startswith("/"):  # a Unix socket folder, as libpq names it
        family, address = socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    else:
        family, address = socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port)
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(PROBE_TIMEOUT_S)
            probe.connect(address)
            probe.sendall(SSL_REQUEST)
            return len(probe.recv(1)) == 1  # 'S' or 'N'; nothing (an end of file) is no server
    except OSError:
        return False


class Connection(psycopg.Connection):
    """psycopg's connection whose waits give up on a server that stopped answering.

    `stall_s` (seconds, 0: never give up) is set on each connection by the pool's configure step.
    """

    stall_s: float = 0.0

    def wait(self, gen, interval=0.1, timeout=None):  # psycopg.Connection.wait, same signature
        if timeout is None and self.stall_s > 0:
            gen = self._watched(gen)
        return super().wait(gen, interval, timeout)

    def _watched(self, gen: Generator) -> Generator[Any, Any, Any]:
        """`gen`, passed through; psycopg's wait sends it Ready.NONE (0) each time `interval`
        passes with the socket not ready: those are counted, not the time a byte took."""
        try:
            state = next(gen)
        except StopIteration as done:
            return done.value
        quiet_since: float | None = None
        while True:
            ready = yield state
            if ready:
                quiet_since = None
            else:
                now = monotonic()
                if quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= self.stall_s:
                    self._give_up_unless_alive(gen, now - quiet_since)
                    quiet_since = monotonic()
            try:
                state = gen.send(ready)
            except StopIteration as done:
                return done.value

    def _give_up_unless_alive(self, gen: Generator, waited: float) -> None:
        info = self.info
        host, port = info.hostaddr or info.host, int(info.port)
        if server_answers(host, port):
            return
        logger.warning(
            "PostgreSQL at %s:%s: no answer for %.1f s and none to a new connection", host, port, waited
        )
        gen.close()
        self.pgconn.finish()  # closed: the pool drops it instead of handing it out again
        reason = f"the server at {host}:{port} stopped answering ({waited:.1f} s without a byte, none to a new connection)"
        pool = getattr(self, "_pool", None)  # psycopg_pool's: set while the connection is checked out
        if isinstance(pool, Pool):
            pool.server_gone(reason, stalled=True)
        raise psycopg.OperationalError(reason)
