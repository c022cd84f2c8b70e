"""The pool's health check (loopwatch.db): no round trip for a connection the server left alone,
a fresh connection for one the server hung up on — on the real PostgreSQL."""

from __future__ import annotations

import copy
import select
import time

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from loopwatch.db.base import DatabaseWrapper, connection_check

pytestmark = pytest.mark.django_db(transaction=True)


def _dsn() -> str:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if isinstance(v, str | int)})


def _terminate(pid: int) -> None:
    """pg_terminate_backend, then wait until the backend has gone (its goodbye is on the wire)."""
    with psycopg.connect(_dsn(), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
        deadline = time.monotonic() + 10
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline, f"backend {pid} still there after 10 s"
            time.sleep(0.01)


def _wait_readable(conn: psycopg.Connection) -> None:
    # The server's goodbye (a FATAL message, then end of file) reaches the idle socket.
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    assert poller.poll(5000), "the terminated backend's socket never became readable"


def test_a_connection_the_server_left_alone_passes_and_stays_idle(needs_postgres):
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute("SELECT 1")
        connection_check(conn)
        connection_check(conn)
        # No query was sent: the server still counts one statement on this backend.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_a_connection_the_server_hung_up_on_fails_the_check(needs_postgres):
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        _terminate(conn.info.backend_pid)
        _wait_readable(conn)
        with pytest.raises(psycopg.OperationalError):
            connection_check(conn)


def test_the_pool_replaces_a_terminated_connection_instead_of_handing_it_out(needs_postgres):
    pool = ConnectionPool(_dsn(), min_size=1, max_size=1, check=connection_check, open=True, timeout=10)
    try:
        with pool.connection() as conn:
            first = conn.info.backend_pid
            held = conn
        _terminate(first)
        _wait_readable(held)
        started = time.monotonic()
        with pool.connection() as conn:
            assert conn.info.backend_pid != first
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert time.monotonic() - started < 5
    finally:
        pool.close()


def test_a_request_after_its_pooled_backend_was_terminated_gets_a_working_connection(needs_postgres):
    # The backend Django uses, with a pool of its own of one connection (another alias, another
    # pool): the connection the next request takes is certainly the terminated one.
    settings_dict = copy.deepcopy(connection.settings_dict)
    settings_dict["OPTIONS"]["pool"] = {"min_size": 1, "max_size": 1, "timeout": 10}
    wrapper = DatabaseWrapper(settings_dict, alias="pool_check")
    try:
        wrapper.ensure_connection()
        held = wrapper.connection
        pid = held.info.backend_pid
        wrapper.close()  # back to the pool, as at the end of a request
        _terminate(pid)
        _wait_readable(held)
        with wrapper.cursor() as cursor:  # the next request takes the pool's one connection
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] != pid
    finally:
        wrapper.close()
        wrapper.close_pool()


def test_a_connection_closed_here_fails_the_check_without_touching_the_socket(needs_postgres):
    conn = psycopg.connect(_dsn(), autocommit=True)
    conn.close()
    with pytest.raises(psycopg.OperationalError, match="closed"):
        connection_check(conn)
