"""An attempt, not a process, owns a claim: threads sharing a client or a guard, processes, slow
tools whose leases must be renewed, and a holder frozen past its lease while the reconciler asks.

Live: uvicorn (2 workers) on the test database, client threads and processes, a real downstream
(tests/ingest/ledger_live.py) whose `calls` count what reached it: the ledger alone must keep
that at one per key. A "beat" thread runs leases_expire() and reconcile_due() several times a
second, as Celery beat would at a shorter period.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection

from ingest.ledger import leases_expire, reconcile_due
from ingest.models import Operation, OperationTransition, Reconciler
from ingest.services import api_key_create
from loopwatch_client import Guard, LedgerClient, Tracer
from tests.ingest.ledger_live import (
    ROOT,
    Downstream,
    args_for,
    child_source,
    collect,
    downstream_tool,
    uvicorn_serving,
)

TOOL = "charge_card"
TRIES = 20

pytestmark = [pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]

CHILD_MAIN = """
import json, sys, threading, time
from loopwatch_client import LedgerClient, LoopwatchError, OutcomeUnknown

cfg = json.loads(sys.argv[1])
client = LedgerClient(cfg["ledger"], cfg["api_key"])
executed = []
charge = downstream_tool(cfg["downstream"], 30.0, executed, after_s=cfg["after_s"])
out = []
lock = threading.Lock()


def invoke(keys):
    for key in keys:
        decisions = []
        give_up = time.monotonic() + cfg["retry_unknown_s"]
        while True:
            try:
                result = client.invoke_once(
                    key, charge, args_for(key), tool=cfg["tool"], lease_s=cfg["lease_s"], wait_timeout=60,
                    on_decision=lambda claim: decisions.append(claim.decision),
                )
                entry = {"key": key, "result": result, "decisions": decisions}
            except OutcomeUnknown as exc:
                if time.monotonic() < give_up:  # an agent that tries again a little later
                    time.sleep(0.3)
                    continue
                entry = {"key": key, "raised": type(exc).__name__, "message": str(exc), "decisions": decisions}
            except LoopwatchError as exc:
                entry = {"key": key, "raised": type(exc).__name__, "message": str(exc), "decisions": decisions}
            break
        with lock:
            out.append(entry)


time.sleep(max(0.0, cfg["start_at"] - time.time()))
threads = [threading.Thread(target=invoke, args=(keys,)) for keys in cfg["threads"]]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"invocations": out, "executed": executed, "worker_id": client.worker_id,
                  "django_loaded": "django" in sys.modules}))
"""
CHILD = child_source(CHILD_MAIN)


@pytest.fixture(scope="module")
def live_server_url(django_db_setup, tmp_path_factory) -> Iterator[str]:
    with uvicorn_serving(tmp_path_factory.mktemp("uvicorn") / "uvicorn.log") as (url, _):
        yield url


@pytest.fixture
def downstream(settings) -> Iterator[Downstream]:
    settings.LOOPWATCH_RECONCILER_ALLOWED_HOSTS = ["127.0.0.1"]  # the reconciler asks it on loopback
    service = Downstream()
    service.start()
    yield service
    service.stop()


@pytest.fixture
def api_key(needs_postgres, live_server_url, tenant) -> str:
    _, raw = api_key_create(tenant=tenant, scopes=["ingest", "ledger"])
    return raw


@pytest.fixture
def reconciler(tenant, downstream) -> Reconciler:
    return Reconciler.objects.create(
        tenant=tenant,
        tool=TOOL,
        url_template=f"{downstream.url}/status/{{operation_key}}",
        field="state",
        done_values=["done"],
        not_done_values=["not_found"],
        keep_fields=["id"],
        timeout_s=2.0,
        grace_s=4.0,
    )


@pytest.fixture
def beat() -> Iterator[None]:
    """leases_expire() and reconcile_due() every 0.2 s in a thread, until the test ends."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.wait(0.2):
                leases_expire()
                reconcile_due()
        except BaseException as exc:  # reported when the test ends
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, name="beat", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(30)
    assert not failures, failures


@pytest.fixture
def spawn(live_server_url, api_key, downstream) -> Iterator:
    """spawn(jobs): one client process per job ({"threads": [[keys], ...], "lease_s", ...})."""
    procs: list[subprocess.Popen] = []
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}

    def start(jobs: list[dict]) -> list[subprocess.Popen]:
        started = []
        for job in jobs:
            cfg = {
                "ledger": live_server_url,
                "api_key": api_key,
                "downstream": downstream.url,
                "tool": TOOL,
                "lease_s": 30,
                "after_s": 0.0,
                "retry_unknown_s": 0.0,
                "start_at": 0,
                **job,
            }
            proc = subprocess.Popen(
                [sys.executable, "-c", CHILD, json.dumps(cfg)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            started.append(proc)
        procs.extend(started)
        return started

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.communicate()


def _both(target, *args) -> list:
    """target(*args) in two threads released together; their results (or exceptions)."""
    barrier = threading.Barrier(2)
    results: list = [None, None]

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target(*args)
        except Exception as exc:  # compared by the caller
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def _history(key: str) -> list[tuple[str, str, str]]:
    return [
        (t.from_status, t.to_status, t.actor)
        for t in OperationTransition.objects.filter(operation__operation_key=key).order_by("pk")
    ]


# --- threads ----------------------------------------------------------------------------------------


def test_two_threads_sharing_a_client_run_a_write_once_every_time(live_server_url, api_key, downstream):
    client = LedgerClient(live_server_url, api_key)
    charge = downstream_tool(downstream.url, 10.0)
    downstream.fault("*", "slow", 0.2)  # the first holds its lease while the second claims
    for n in range(TRIES):
        key = f"order-shared-{n}:charge"
        first, second = _both(functools.partial(client.invoke_once, key, charge, args_for(key), tool=TOOL))
        assert isinstance(first, dict) and first == second, (n, first, second)
        assert downstream.calls[key] == 1, n
    assert set(Operation.objects.values_list("status", "attempts")) == {("SUCCEEDED", 1)}


def test_two_threads_each_in_its_own_guard_run_refund_once_every_time(live_server_url, api_key, downstream):
    tracer = Tracer(live_server_url, api_key, flush_interval=0.05)
    guard = Guard(live_server_url, api_key, tracer=tracer)
    downstream.fault("*", "slow", 0.2)
    charge = downstream_tool(downstream.url, 10.0)

    @guard.tool(kind="write", key="order-{order}:refund")
    def refund(order: str, amount: int, idempotency_key: str | None = None) -> dict:
        return charge({"order": order, "amount": amount}, idempotency_key=idempotency_key)

    def agent(order: str) -> dict:
        with guard.run(agent="shop", backend="openai", model="gpt-4o") as run:
            run.model_round(input_tokens=10, output_tokens=5)
            return refund(order, 10)

    try:
        for n in range(TRIES):
            first, second = _both(agent, f"g{n}")
            assert isinstance(first, dict) and first == second, (n, first, second)
            assert downstream.calls[f"order-g{n}:refund"] == 1, n
    finally:
        tracer.close()


def test_four_processes_of_two_threads_on_the_same_keys_make_one_call_per_key(spawn, downstream):
    keys = [f"order-p{n}:charge" for n in range(12)]
    downstream.fault("*", "slow", 0.05)
    start_at = time.time() + 1.5
    jobs = [
        {"threads": [keys[i:] + keys[:i], keys[::-1]], "start_at": start_at}  # every key, in two orders
        for i in range(0, 12, 3)
    ]
    reports = collect(spawn(jobs))
    invocations = [i for r in reports for i in r["invocations"]]
    assert len(invocations) == 4 * 2 * len(keys)
    assert not [i for i in invocations if "raised" in i]
    assert {k: downstream.calls[k] for k in keys} == dict.fromkeys(keys, 1)
    assert all(i["result"] == downstream.records[i["key"]] for i in invocations)
    assert set(Operation.objects.values_list("status", "attempts")) == {("SUCCEEDED", 1)}


# --- leases: renewed while the tool runs, and a holder that may still be running ------------------------


def test_a_tool_much_longer_than_its_lease_runs_once_with_a_reconciler_watching(
    spawn, downstream, reconciler, beat
):
    """The issue's scenario, a tenth of the time: lease 1 s, a tool of 5 s with its effect at
    2.5 s, a reconciler and the beat at work, 4 processes on the same keys."""
    keys = [f"order-slow-{n}:charge" for n in range(4)]
    downstream.fault("*", "slow", 2.5)
    start_at = time.time() + 1.5
    jobs = [
        {"threads": [keys[i:] + keys[:i]], "lease_s": 1, "after_s": 2.5, "start_at": start_at}
        for i in range(4)
    ]
    reports = collect(spawn(jobs), timeout=180)
    invocations = [i for r in reports for i in r["invocations"]]
    assert not [i for i in invocations if "raised" in i]
    assert {k: downstream.calls[k] for k in keys} == dict.fromkeys(keys, 1)
    for key in keys:  # the lease never ran out: renewed while the tool ran
        assert _history(key) == [("", "RUNNING", "worker"), ("RUNNING", "SUCCEEDED", "worker")]


def test_not_done_while_a_frozen_holder_may_still_run_is_no_licence_to_run_again(
    spawn, downstream, reconciler, beat
):
    """The holder is frozen (SIGSTOP) before its effect lands; its lease runs out. The downstream
    truthfully says "not done" meanwhile: nobody runs it again within the lease plus the grace,
    then the reconciler finds the effect. Agents retrying all along get the one result."""
    key = "order-frozen:charge"
    downstream.fault(key, "slow", 2.0)  # the effect 2 s after the request reached it
    (holder,) = spawn([{"threads": [[key]], "lease_s": 1}])
    assert downstream.reached[key].wait(30)
    os.kill(holder.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    others = spawn([{"threads": [[key]], "lease_s": 1, "retry_unknown_s": 15}] * 3)
    while downstream.status_asks[key] < 1:  # the lease ran out and the reconciler asked
        assert time.monotonic() - frozen_at < 20, "the reconciler never asked"
        time.sleep(0.1)
    time.sleep(max(0.0, 6.5 - (time.monotonic() - frozen_at)))  # past the lease and the grace
    os.kill(holder.pid, signal.SIGCONT)
    reports = collect([holder, *others], timeout=120)
    invocations = [i for r in reports for i in r["invocations"]]
    assert not [i for i in invocations if "raised" in i], invocations
    assert downstream.calls[key] == 1 and downstream.effects[key] == 1
    assert {i["result"]["id"] for i in invocations} == {downstream.records[key]["id"]}
    op = Operation.objects.get(operation_key=key)
    assert (op.status, op.attempts) == ("SUCCEEDED", 1)
    statuses = [to for _, to, _ in _history(key)]
    assert "RETRYABLE_FAILED" not in statuses and statuses[:2] == ["RUNNING", "UNKNOWN"]
    # "Not done" was asked first and not acted on; what settled it is either the reconciler asking
    # again after the grace, or the thawed holder's own completion when it got there first (a busy
    # machine can delay the reconciler's second question past the thaw).
    settled_by = _history(key)[-1][2]
    assert settled_by in ("reconciler", "worker")
    if settled_by == "reconciler":
        assert downstream.status_asks[key] >= 2
