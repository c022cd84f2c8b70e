"""The client never blocks the agent beyond what it promises: a real uvicorn frozen with SIGSTOP,
and a proxy that holds or loses answers. Each call must return within its deadline plus SLACK_S
(the bound is the behaviour under test, not a speed: the figures are in bench/).

Also: a claim that landed while its answer never came is given back (never an UNKNOWN for a
person when the tool never ran), and one whose answer was lost is asked again by the same attempt.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest

from ingest.models import Operation
from ingest.services import api_key_create
from loopwatch_client import CompletionFailed, Guard, LedgerClient, LedgerUnavailable, Tracer
from tests.client.conftest import Proxy
from tests.ingest.ledger_live import uvicorn_serving

pytestmark = [pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]
SLACK_S = 0.6


class Server:
    def __init__(self, url: str, pid: int) -> None:
        self.url = url
        self.pid = pid

    def freeze(self) -> None:
        os.killpg(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def uvicorn_server(django_db_setup, tmp_path_factory) -> Iterator[Server]:
    """A uvicorn of the module's own (one worker): the tests freeze it."""
    with uvicorn_serving(tmp_path_factory.mktemp("uvicorn") / "uvicorn.log", workers=1) as (url, proc):
        yield Server(url, proc.pid)


def _database_quiet(url: str, *, timeout: float = 30.0, still_s: float = 1.0) -> None:
    """Until the thawed server has done what the freeze held (requests its socket buffered, an
    ingest and its eager detection pass) before the test's flush TRUNCATEs the tables, which
    otherwise deadlocks with it ("couldn't be flushed", twice in CI): the server answers a request
    of ours, then no other session of the test database is in a transaction for `still_s`."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    with contextlib.suppress(OSError):
        urllib.request.urlopen(url + "/api/v1/runs", timeout=timeout).close()
    quiet_since = None
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                " AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')"
            )
            if cursor.fetchone()[0]:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= still_s:
                return
            time.sleep(0.05)


@pytest.fixture
def server(uvicorn_server) -> Iterator[Server]:
    """The module's uvicorn, thawed again after each test whatever happened, and done with what it
    was doing before the test's database is emptied."""
    try:
        yield uvicorn_server
    finally:
        uvicorn_server.thaw()
        _database_quiet(uvicorn_server.url)


@pytest.fixture
def key(tenant) -> str:
    return api_key_create(tenant=tenant, scopes=["ingest", "ledger"])[1]


def _until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_a_read_check_answers_within_the_guards_timeout_when_loopwatch_freezes(server, key):
    tracer = Tracer(server.url, key, flush_interval=0.05)
    guard = Guard(server.url, key, tracer=tracer, timeout=1.0)
    ran = []

    @guard.tool(kind="read")
    def search(customer: str) -> dict:
        ran.append(customer)
        return {"orders": []}

    try:
        with guard.run(agent="shop") as run:
            run.model_round(input_tokens=10, output_tokens=5)
            search("1")  # answered: the tracer is healthy, its buffer is worth flushing
            run.model_round(input_tokens=10, output_tokens=5)
            server.freeze()
            started = time.monotonic()
            search("2")
            elapsed = time.monotonic() - started
        assert ran == ["1", "2"] and guard.stats["unavailable"] == 1
        assert elapsed < 1.0 + SLACK_S, f"the check blocked {elapsed:.2f} s for a timeout of 1 s"
    finally:
        server.thaw()
        tracer.close(timeout=2)


def test_a_write_whose_completion_meets_a_frozen_loopwatch_returns_within_the_deadline(server, key):
    ledger = LedgerClient(server.url, key, timeout=1.0)
    returned_at = []

    def charge(args, *, idempotency_key):
        server.freeze()  # the effect is done; the ledger freezes before it hears of it
        returned_at.append(time.monotonic())
        return {"id": "ch_1"}

    with pytest.raises(CompletionFailed) as info:
        ledger.invoke_once("order-1:charge", charge, {"amount": 1}, tool="charge", lease_s=30)
    elapsed = time.monotonic() - returned_at[0]
    assert info.value.result == {"id": "ch_1"}
    assert elapsed < 1.0 + SLACK_S, f"the completion blocked {elapsed:.2f} s for a timeout of 1 s"
    # Back up: the completion that missed the deadline is delivered late, not lost.
    server.thaw()
    assert _until(lambda: Operation.objects.get(operation_key="order-1:charge").status == "SUCCEEDED")


def test_tracer_close_returns_within_its_timeout_when_loopwatch_freezes(server, key):
    tracer = Tracer(server.url, key, flush_interval=0.05, timeout=5.0)
    run = tracer.start_run("r1")
    assert tracer.flush(timeout=10)
    server.freeze()
    for n in range(20):
        run.model_round(n + 1, input_tokens=1, output_tokens=1)
    time.sleep(0.2)  # the sender is stuck in a request now
    started = time.monotonic()
    tracer.close(timeout=2)
    elapsed = time.monotonic() - started
    assert elapsed < 2 + SLACK_S, f"close(timeout=2) took {elapsed:.2f} s"


def test_a_claim_that_landed_but_timed_out_is_given_back_not_left_for_a_person(server, key):
    proxy = Proxy(server.url)
    try:
        ledger = LedgerClient(proxy.url, key, timeout=0.5)
        ran = []
        proxy.hold_answers, proxy.hold_s = 1, 2.0  # the claim lands; its answer comes too late
        started = time.monotonic()
        with pytest.raises(LedgerUnavailable):
            ledger.invoke_once("order-2:charge", lambda a, **k: ran.append(1), {"amount": 2}, tool="charge")
        assert time.monotonic() - started < 0.5 + SLACK_S
        assert ran == []
        # The client gives the claim back as soon as the ledger hears it again.
        assert _until(
            lambda: Operation.objects.get(operation_key="order-2:charge").status == "RETRYABLE_FAILED"
        )
        op = Operation.objects.get(operation_key="order-2:charge")
        assert not op.needs_person and "released" in op.history.last().note
        assert ledger.invoke_once(
            "order-2:charge", lambda a, **k: {"ran": 1}, {"amount": 2}, tool="charge"
        ) == {"ran": 1}
    finally:
        proxy.stop()


def test_a_guarded_write_whose_check_timed_out_is_given_back(server, key):
    proxy = Proxy(server.url)
    tracer = Tracer(server.url, key, flush_interval=0.05)
    try:
        guard = Guard(
            proxy.url, key, tracer=tracer, ledger=LedgerClient(proxy.url, key, timeout=1.0), timeout=0.5
        )
        ran = []

        @guard.tool(kind="write", key="order-{order}:refund")
        def refund(order: str) -> dict:
            ran.append(order)
            return {"refund": order}

        with pytest.raises(LedgerUnavailable), guard.run("r-write", agent="shop"):
            proxy.hold_answers, proxy.hold_s = 1, 2.0
            refund("3")
        assert ran == []
        assert _until(
            lambda: Operation.objects.get(operation_key="order-3:refund").status == "RETRYABLE_FAILED"
        )
        assert not Operation.objects.get(operation_key="order-3:refund").needs_person
    finally:
        tracer.close(timeout=2)
        proxy.stop()


def test_a_claim_whose_answer_was_lost_is_asked_again_by_the_same_attempt(server, key):
    proxy = Proxy(server.url)
    try:
        ledger = LedgerClient(proxy.url, key, timeout=5.0)
        proxy.lose_answers = 1  # the claim lands, the connection closes before its answer
        decisions = []
        result = ledger.invoke_once(
            "order-4:charge",
            lambda a, **k: {"id": "ch_4"},
            {"amount": 4},
            tool="charge",
            on_decision=lambda claim: decisions.append(claim.decision),
        )
        assert result == {"id": "ch_4"} and decisions == ["execute"]
        op = Operation.objects.get(operation_key="order-4:charge")
        assert (op.status, op.attempts, op.history.count()) == ("SUCCEEDED", 1, 2)
        assert proxy.posts("/operations/claim") == 2
    finally:
        proxy.stop()
