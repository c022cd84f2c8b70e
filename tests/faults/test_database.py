"""The database pool and its connections (loopwatch.db) against a private PostgreSQL that is
stopped, restarted and frozen: a request never waits long for a dead server, and gets a connection
within a second of its return, whatever the outage's length."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg_pool import PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from loopwatch.db.base import connection_check
from loopwatch.db.pool import DOWN_WAIT_S, RECONNECT_DELAY_MAX_S, Pool, _CappedBackoff
from loopwatch.db.stall import PROBE_TIMEOUT_S, Connection
from tests.faults.servers import PrivatePostgres

pytestmark = pytest.mark.faults

SLACK_S = 1.0  # a loaded 2-core machine


@pytest.fixture
def make_pool(private_postgres: PrivatePostgres) -> Iterator:
    pools: list[Pool] = []

    def make(*, size: int = 1, timeout: float = 3.0, stall_s: float = 0.0) -> Pool:
        pool = Pool(
            kwargs={
                "host": "127.0.0.1",
                "port": private_postgres.port,
                "user": "postgres",
                "dbname": "postgres",
                "connect_timeout": 2,
                "autocommit": True,
            },
            min_size=size,
            max_size=size,
            timeout=timeout,
            verify=connection_check,
            stall_s=stall_s,
            connection_class=Connection,
            open=True,
        )
        pool.wait(timeout=30)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close(timeout=5)


def _connected_within(pool: Pool, seconds: float) -> float:
    """Ask for a connection until one comes; how long that took."""
    started = time.monotonic()
    while True:
        try:
            with pool.connection(timeout=0.2) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            return time.monotonic() - started
        except psycopg.OperationalError:
            assert time.monotonic() - started < seconds, (
                f"no connection {seconds} s after the server came back"
            )
            time.sleep(0.02)


def test_reconnection_attempts_are_never_more_than_the_cap_apart():
    ours, theirs = _CappedBackoff(timeout=300), AttemptWithBackoff(timeout=300)
    delays = []
    for n in range(12):
        ours.update_delay(float(n))
        theirs.update_delay(float(n))
        delays.append((ours.delay, theirs.delay))
    assert max(d for d, _ in delays) <= RECONNECT_DELAY_MAX_S
    assert max(d for _, d in delays) > 60  # psycopg_pool's own: what an outage of minutes cost


def test_after_an_outage_the_pool_connects_within_a_second_of_the_server(make_pool, private_postgres):
    pool = make_pool()
    private_postgres.stop("fast")
    # Requests keep coming during the outage (every 0.2 s), as they do: the pool learns the server is
    # gone and tries to reconnect. psycopg_pool alone tries 1, 2, 4, 8 s apart: after 8 s down, its
    # next try would come at 15 s.
    until = time.monotonic() + 8
    while time.monotonic() < until:
        with pytest.raises(psycopg.OperationalError), pool.connection(timeout=0.2) as conn:
            conn.execute("SELECT 1")
        time.sleep(0.2)
    private_postgres.start()
    back = _connected_within(pool, 10)
    assert back < RECONNECT_DELAY_MAX_S + SLACK_S


def test_a_down_server_answers_a_request_in_well_under_the_pool_timeout(make_pool, private_postgres):
    pool = make_pool(timeout=3.0)
    private_postgres.stop("fast")
    with pytest.raises(psycopg.OperationalError):
        with pool.connection() as conn:  # the pooled connection is dead: dropped, none to replace it
            conn.execute("SELECT 1")
    assert pool.down_since is not None or _wait_down(pool)
    started = time.monotonic()
    with pytest.raises(PoolTimeout):
        pool.getconn()
    assert time.monotonic() - started < DOWN_WAIT_S + SLACK_S


def _wait_down(pool: Pool) -> bool:
    deadline = time.monotonic() + 5
    while pool.down_since is None:
        assert time.monotonic() < deadline, "the pool never noticed the server was down"
        time.sleep(0.02)
    return True


def test_connections_left_dead_by_a_restart_are_dropped_without_a_pause(make_pool, private_postgres):
    pool = make_pool(size=4)
    held = [pool.getconn() for _ in range(4)]
    for conn in held:
        pool.putconn(conn)
    private_postgres.stop("fast")  # every pooled connection gets the server's goodbye
    private_postgres.start()
    started = time.monotonic()
    with pool.connection() as conn:  # psycopg_pool's check loop slept 1, then 2 s between dead ones
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert time.monotonic() - started < RECONNECT_DELAY_MAX_S + SLACK_S


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        started = time.monotonic()
        try:
            outcome["value"] = fn()
        except Exception as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_query_on_a_frozen_server_gives_up_and_the_pool_answers_fast(make_pool, private_postgres):
    stall_s = 1.0
    pool = make_pool(size=2, stall_s=stall_s)
    conn = pool.getconn()
    private_postgres.freeze()
    try:
        thread, outcome = _in_thread(lambda: conn.execute("SELECT 1").fetchone())
        thread.join(stall_s + PROBE_TIMEOUT_S + 5)
        assert not thread.is_alive(), "the query waited on the frozen server"
        assert isinstance(outcome.get("error"), psycopg.OperationalError), outcome
        assert "stopped answering" in str(outcome["error"])
        assert outcome["seconds"] < stall_s + PROBE_TIMEOUT_S + SLACK_S
        assert conn.closed
        pool.putconn(conn)
        # The pool knows: the next request is answered at once, not after a stall of its own.
        started = time.monotonic()
        with pytest.raises(PoolTimeout):
            pool.getconn()
        assert time.monotonic() - started < DOWN_WAIT_S + SLACK_S
    finally:
        private_postgres.thaw()
    assert _connected_within(pool, 5) < RECONNECT_DELAY_MAX_S + 2 + SLACK_S  # + a connect under way


def test_a_slow_query_on_a_live_server_is_not_cut(make_pool):
    pool = make_pool(stall_s=0.5)
    with pool.connection() as conn:
        started = time.monotonic()
        assert conn.execute("SELECT pg_sleep(2), 1").fetchone()[1] == 1  # four stalls, each probe answered
        assert time.monotonic() - started >= 2
