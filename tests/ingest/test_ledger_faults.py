"""Fault injection: the ledger against dropped answers, races, dead executors and a downstream
that goes away, with a live server, real client processes and real PostgreSQL.

The server is uvicorn serving loopwatch.asgi for the test database (one per module). The
downstream is a real HTTP service in a thread of the test process: it performs "effects" (counted
per idempotency key), honours the key like Stripe does, answers a status endpoint for the
Reconciler, and takes injected faults. Two counters tell the two safeguards apart: `calls` (the
requests that reached it: the ledger alone must keep that at one per key) and `effects` (what
it did: its own idempotency would keep that at one anyway).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection
from django.utils import timezone

from ingest.ledger import leases_expire, reconcile_due
from ingest.models import Operation, OperationTransition, Reconciler
from ingest.services import api_key_create
from loopwatch_client import (
    LedgerClient,
    LedgerError,
    OperationFailed,
    OutcomeUnknown,
    PayloadConflict,
    StillRunning,
)
from tests.ingest.ledger_live import (
    ROOT,
    Downstream,
    DownstreamRejected,
    DownstreamUnavailable,
    args_for,
    child_source,
    collect,
    downstream_tool,
    uvicorn_serving,
)

TOOL = "charge_card"
TOOL_TIMEOUT_S = 0.5  # the tool's own HTTP timeout; a "drop" fault answers after it
DROP_S = 1.5
MANY_PROCESSES = 8
MANY_POOL = 1000  # distinct keys to draw from
MANY_PER_PROCESS = 500  # keys each process invokes (plus MANY_REPEATS of its own again)
MANY_REPEATS = 50

pytestmark = [pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]


CHILD_MAIN = """
import json, sys, time
from loopwatch_client import LedgerClient, LoopwatchError

cfg = json.loads(sys.argv[1])
client = LedgerClient(cfg["ledger"], cfg["api_key"])
executed = []
charge = downstream_tool(cfg["downstream"], cfg["tool_timeout"], executed)
time.sleep(max(0.0, cfg["start_at"] - time.time()))
out = []
for key in cfg["keys"]:
    decisions = []
    try:
        result = client.invoke_once(
            key, charge, args_for(key), tool=cfg["tool"], lease_s=cfg["lease_s"], wait_timeout=60,
            on_decision=lambda claim: decisions.append(claim.decision),
        )
        out.append({"key": key, "result": result, "decisions": decisions})
    except LoopwatchError as exc:
        out.append({"key": key, "raised": type(exc).__name__, "message": str(exc), "decisions": decisions})
print(json.dumps({"invocations": out, "executed": executed, "worker_id": client.worker_id,
                  "django_loaded": "django" in sys.modules}))
"""

CHILD = child_source(CHILD_MAIN)


# --- the downstream service and the live server ---------------------------------------------------


@pytest.fixture
def downstream(settings) -> Iterator[Downstream]:
    settings.LOOPWATCH_RECONCILER_ALLOWED_HOSTS = ["127.0.0.1"]  # the reconciler asks it on loopback
    service = Downstream()
    service.start()
    yield service
    service.stop()


@pytest.fixture
def reconciler(tenant, downstream) -> Reconciler:
    """No grace: a "not done" is acted on at once (test_ledger_attempts.py and test_reconcilers.py
    show the grace), and the downstream's record is kept whole (keep_fields)."""
    return Reconciler.objects.create(
        tenant=tenant,
        tool=TOOL,
        keep_fields=["id", "key", "amount_cents"],
        grace_s=0,
        url_template=f"{downstream.url}/status/{{operation_key}}",
        field="state",
        done_values=["done"],
        not_done_values=["not_found"],
        timeout_s=2.0,
    )


@pytest.fixture(scope="module")
def live_server_url(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """uvicorn (2 workers) on the test database (one per module)."""
    with uvicorn_serving(tmp_path_factory.mktemp("uvicorn") / "uvicorn.log") as (url, _):
        yield url


@pytest.fixture
def api_key(needs_postgres, live_server_url, tenant) -> str:
    _, raw = api_key_create(tenant=tenant, scopes=["ledger"])
    return raw


@pytest.fixture
def client(live_server_url, api_key) -> LedgerClient:
    return LedgerClient(live_server_url, api_key, worker_id="test-process")


@pytest.fixture
def spawn_clients(live_server_url, api_key, downstream) -> Iterator:
    """spawn_clients(jobs): one client process per job ({"keys": [...], "lease_s", "start_at"});
    whatever is still running at the end of the test is killed."""
    procs: list[subprocess.Popen] = []
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}

    def spawn(jobs: list[dict]) -> list[subprocess.Popen]:
        started = []
        for job in jobs:
            cfg = {
                "ledger": live_server_url,
                "api_key": api_key,
                "downstream": downstream.url,
                "tool": TOOL,
                "tool_timeout": 10.0,
                "lease_s": 30,
                "start_at": 0,
                **job,
            }
            started.append(
                subprocess.Popen(
                    [sys.executable, "-c", CHILD, json.dumps(cfg)],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        procs.extend(started)
        return started

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def history(key: str) -> list[tuple[str, str, str]]:
    return [
        (t.from_status, t.to_status, t.actor)
        for t in OperationTransition.objects.filter(operation__operation_key=key).order_by("pk")
    ]


def _invoke(client, downstream, key, decisions, *, tool_timeout=TOOL_TIMEOUT_S, args=None, **kwargs) -> Any:
    return client.invoke_once(
        key,
        downstream_tool(downstream.url, tool_timeout),
        args or args_for(key),
        tool=TOOL,
        on_decision=lambda claim: decisions.append(claim.decision),
        **kwargs,
    )


def invoke(client: LedgerClient, downstream: Downstream, key: str, **kwargs: Any) -> tuple[Any, list[str]]:
    """invoke_once with the downstream tool: (its result, the ledger's decisions)."""
    decisions: list[str] = []
    return _invoke(client, downstream, key, decisions, **kwargs), decisions


def raises_in(client, downstream, key, exc_type, **kwargs: Any) -> tuple[Any, list[str]]:
    """invoke_once, which must raise exc_type: (the exception, the ledger's decisions)."""
    decisions: list[str] = []
    with pytest.raises(exc_type) as info:
        _invoke(client, downstream, key, decisions, **kwargs)
    return info.value, decisions


# --- 1. the tool completes, its answer is dropped ---------------------------------------------------


def test_a_dropped_answer_is_unknown_then_reconciled_to_succeeded_then_reused(client, downstream, reconciler):
    key = "order-1:charge:v1"
    downstream.fault(key, "drop", DROP_S)
    exc, decisions = raises_in(client, downstream, key, OutcomeUnknown)
    assert decisions == ["execute"] and isinstance(exc.__cause__, TimeoutError)
    assert downstream.effects[key] == 1  # it happened; the client could not know
    op = Operation.objects.get(operation_key=key)
    assert op.status == "UNKNOWN" and op.next_reconcile_at is not None

    # A repeat (a retry by the agent) is told to reconcile; the tool is not called again.
    _, decisions = raises_in(client, downstream, key, OutcomeUnknown)
    assert decisions == ["reconcile"]
    assert downstream.calls[key] == 1

    assert reconcile_due() == 1
    op.refresh_from_db()
    assert op.status == "SUCCEEDED" and op.reconcile_attempts == 1
    assert op.last_reconcile["verdict"] == "done"
    assert history(key) == [
        ("", "RUNNING", "worker"),
        ("RUNNING", "UNKNOWN", "worker"),
        ("UNKNOWN", "SUCCEEDED", "reconciler"),
    ]
    evidence = op.history.get(to_status="SUCCEEDED").evidence
    assert evidence["value"] == "done" and evidence["url"].endswith(f"/status/{quote(key, safe='')}")

    result, decisions = invoke(client, downstream, key)
    assert decisions == ["reuse"]
    # The reconciler's answer is the stored result (the tool's own answer was never reported).
    assert result["state"] == "done" and result["id"] == downstream.records[key]["id"]
    assert (downstream.calls[key], downstream.effects[key]) == (1, 1)
    assert client.get(key)["status"] == "SUCCEEDED"


# --- 2. concurrent executors ----------------------------------------------------------------------


def test_two_executors_at_once_one_executes_the_other_waits_then_reuses(spawn_clients, downstream):
    key = "order-2:charge:v1"
    downstream.fault(key, "hold")  # the executor is still running when the other claims
    start_at = time.time() + 2.0
    procs = spawn_clients([{"keys": [key], "start_at": start_at}] * 2)
    assert downstream.reached[key].wait(30)
    time.sleep(2.0)  # the other one claims meanwhile (from the same start time): wait, wait, ...
    downstream.release.set()
    reports = collect(procs)
    runs = sorted((r["invocations"][0] for r in reports), key=lambda i: i["decisions"][0])
    executor, waiter = runs
    assert executor["decisions"] == ["execute"]
    assert waiter["decisions"][0] == "wait" and waiter["decisions"][-1] == "reuse"
    assert set(waiter["decisions"][:-1]) == {"wait"}
    assert executor["result"] == waiter["result"] == downstream.records[key]
    assert sorted(len(r["executed"]) for r in reports) == [0, 1]  # the tool ran in one process only
    assert (downstream.calls[key], downstream.effects[key]) == (1, 1)
    assert reports[0]["worker_id"] != reports[1]["worker_id"]
    op = Operation.objects.get(operation_key=key)
    assert (op.status, op.attempts) == ("SUCCEEDED", 1)
    assert history(key) == [("", "RUNNING", "worker"), ("RUNNING", "SUCCEEDED", "worker")]


def test_eight_processes_with_duplicates_make_one_effect_per_key(spawn_clients, downstream):
    rng = random.Random(20261129)
    pool = [f"order-{n:05d}:charge:v1" for n in range(MANY_POOL)]
    start_at = time.time() + 1.5
    jobs = []
    for _ in range(MANY_PROCESSES):
        keys = rng.sample(pool, MANY_PER_PROCESS)  # duplicates across the processes
        keys += rng.sample(keys, MANY_REPEATS)  # and within one: the same keys again, later
        rng.shuffle(keys)
        jobs.append({"keys": keys, "start_at": start_at})
    distinct = {k for job in jobs for k in job["keys"]}
    reports = collect(spawn_clients(jobs))

    invocations = [i for r in reports for i in r["invocations"]]
    assert len(invocations) == MANY_PROCESSES * (MANY_PER_PROCESS + MANY_REPEATS)
    raised = [i for i in invocations if "raised" in i]
    assert not raised, raised[:5]
    # One effect per key, and the ledger alone kept the tool from being called twice.
    assert sum(downstream.effects.values()) == len(distinct) == len(downstream.effects)
    assert set(downstream.calls.values()) == {1}
    assert sum(len(r["executed"]) for r in reports) == len(distinct)
    # Every invocation of a key got that key's one result.
    assert all(i["result"] == downstream.records[i["key"]] for i in invocations)
    decisions = Counter(d for i in invocations for d in i["decisions"])
    assert decisions["execute"] == len(distinct)
    assert decisions["reuse"] == len(invocations) - len(distinct)
    ops = Operation.objects.filter(operation_key__in=distinct)
    assert ops.count() == len(distinct)
    assert set(ops.values_list("status", "attempts")) == {("SUCCEEDED", 1)}
    assert OperationTransition.objects.filter(operation__in=ops).count() == 2 * len(distinct)


# --- 3. the executor dies after the effect -----------------------------------------------------------


def test_an_executor_killed_after_the_effect_is_unknown_then_reconciled(
    spawn_clients, client, downstream, reconciler
):
    key = "order-3:charge:v1"
    downstream.fault(key, "hold")
    (proc,) = spawn_clients([{"keys": [key], "lease_s": 3}])  # a short lease
    assert downstream.reached[key].wait(30), "the executor never reached the downstream"
    os.kill(proc.pid, signal.SIGKILL)  # the effect happened, the completion never will
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    op = Operation.objects.get(operation_key=key)
    assert op.status == "RUNNING" and op.lease_owner != client.worker_id

    # Within the lease the others wait; then it expires.
    claim = client.claim(operation_key=key, tool=TOOL, args=args_for(key))
    assert claim.decision == "wait" and 0 < claim.retry_after <= 3
    assert leases_expire() == 0
    time.sleep(max(0.0, (op.lease_expires_at - timezone.now()).total_seconds()) + 0.1)
    assert leases_expire() == 1
    op.refresh_from_db()
    assert op.status == "UNKNOWN"
    assert "expired" in op.history.get(to_status="UNKNOWN").note

    _, decisions = raises_in(client, downstream, key, OutcomeUnknown)
    assert decisions == ["reconcile"] and downstream.calls[key] == 1

    assert reconcile_due() == 1
    op.refresh_from_db()
    assert op.status == "SUCCEEDED"
    assert history(key) == [
        ("", "RUNNING", "worker"),
        ("RUNNING", "UNKNOWN", "system"),
        ("UNKNOWN", "SUCCEEDED", "reconciler"),
    ]
    result, decisions = invoke(client, downstream, key)
    assert decisions == ["reuse"] and result["id"] == downstream.records[key]["id"]
    assert (downstream.calls[key], downstream.effects[key]) == (1, 1)


# --- 4. the same key, other arguments ---------------------------------------------------------------


def test_the_same_key_with_other_arguments_is_a_payload_conflict_and_not_executed(client, downstream):
    key = "order-4:charge:v1"
    first, _ = invoke(client, downstream, key)
    other = {**args_for(key), "amount_cents": 99999}
    exc, decisions = raises_in(client, downstream, key, PayloadConflict, args=other)
    assert decisions == [] and exc.status == 422 and exc.error == "payload_conflict"
    assert exc.body["stored_fingerprint"] in exc.detail and exc.body["fingerprint"] in exc.detail
    assert (downstream.calls[key], downstream.effects[key]) == (1, 1)
    op = Operation.objects.get(operation_key=key)
    assert op.status == "SUCCEEDED" and len(history(key)) == 2
    # The original arguments still get the first result.
    assert invoke(client, downstream, key) == (first, ["reuse"])

    # Also while the first claim still holds its lease.
    held = "order-4b:charge:v1"
    assert client.claim(operation_key=held, tool=TOOL, args=args_for(held)).decision == "execute"
    with pytest.raises(PayloadConflict):
        client.claim(operation_key=held, tool=TOOL, args=other, worker_id="other")
    assert downstream.calls[held] == 0


# --- 5. the reconciler's downstream is down -----------------------------------------------------------


def _make_unknown(client, downstream, key) -> Operation:
    downstream.fault(key, "drop", DROP_S)
    raises_in(client, downstream, key, OutcomeUnknown)
    op = Operation.objects.get(operation_key=key)
    assert op.status == "UNKNOWN"
    return op


def _due_now(op: Operation) -> None:
    """Skip the backoff."""
    Operation.objects.filter(pk=op.pk).update(next_reconcile_at=timezone.now())


def test_a_downstream_down_leaves_it_unknown_with_backoff_and_back_up_resolves_it(
    client, downstream, reconciler
):
    key = "order-5:charge:v1"
    op = _make_unknown(client, downstream, key)
    downstream.stop()

    before = timezone.now()
    assert reconcile_due() == 1
    op.refresh_from_db()
    assert op.status == "UNKNOWN" and op.reconcile_attempts == 1 and not op.needs_person
    assert op.next_reconcile_at > before + timedelta(seconds=5)  # 15 s ± 50 %
    assert op.last_reconcile["verdict"] == "unknown" and "refused" in op.last_reconcile["error"].lower()
    assert reconcile_due() == 0  # not due again yet
    _, decisions = raises_in(client, downstream, key, OutcomeUnknown)
    assert decisions == ["reconcile"]

    downstream.start()
    _due_now(op)
    assert reconcile_due() == 1
    op.refresh_from_db()
    assert op.status == "SUCCEEDED" and op.reconcile_attempts == 2
    assert history(key)[-1] == ("UNKNOWN", "SUCCEEDED", "reconciler")
    result, decisions = invoke(client, downstream, key)
    assert decisions == ["reuse"] and result["id"] == downstream.records[key]["id"]
    assert (downstream.calls[key], downstream.effects[key], downstream.status_asks[key]) == (1, 1, 1)


def test_no_answer_after_max_attempts_needs_a_person(client, downstream, reconciler):
    reconciler.max_attempts = 2
    reconciler.save()
    key = "order-6:charge:v1"
    op = _make_unknown(client, downstream, key)
    downstream.stop()

    assert reconcile_due() == 1
    op.refresh_from_db()
    assert (op.reconcile_attempts, op.needs_person) == (1, False)
    _due_now(op)
    assert reconcile_due() == 1
    op.refresh_from_db()
    assert (op.status, op.reconcile_attempts, op.needs_person) == ("UNKNOWN", 2, True)

    downstream.start()  # back, but a person decides now: the reconciler does not ask again
    _due_now(op)
    assert reconcile_due() == 0
    op.refresh_from_db()
    assert (op.status, op.reconcile_attempts) == ("UNKNOWN", 2)
    assert downstream.status_asks[key] == 0
    _, decisions = raises_in(client, downstream, key, OutcomeUnknown)
    assert decisions == ["reconcile"] and downstream.calls[key] == 1


# --- invoke_once, the other paths ----------------------------------------------------------------------


def test_invoke_once_a_definitive_failure_is_not_run_again(client, downstream):
    key = "order-7:charge:v1"
    downstream.fault(key, "reject")
    raises_in(client, downstream, key, DownstreamRejected)
    op = Operation.objects.get(operation_key=key)
    assert (op.status, op.error_class) == ("FAILED", "invalid_argument")
    assert op.error["type"] == "DownstreamRejected"

    exc, decisions = raises_in(client, downstream, key, OperationFailed)
    assert decisions == ["failed"] and exc.error_class == "invalid_argument"
    assert downstream.calls[key] == 1 and downstream.effects[key] == 0


def test_invoke_once_a_failure_without_side_effect_runs_again_once(client, downstream):
    key = "order-8:charge:v1"
    downstream.fault(key, "fail_before")
    raises_in(client, downstream, key, DownstreamUnavailable, no_side_effect_on=(DownstreamUnavailable,))
    assert Operation.objects.get(operation_key=key).status == "RETRYABLE_FAILED"

    downstream.fault(key, None)
    result, decisions = invoke(client, downstream, key)
    assert decisions == ["execute"] and result == downstream.records[key]
    op = Operation.objects.get(operation_key=key)
    assert (op.status, op.attempts) == ("SUCCEEDED", 2)
    assert invoke(client, downstream, key) == (result, ["reuse"])
    assert (downstream.calls[key], downstream.effects[key]) == (2, 1)  # the first call did nothing


def test_invoke_once_an_unclassified_error_is_unknown_not_retried(client, downstream):
    key = "order-9:charge:v1"

    def broken(args, *, idempotency_key):
        raise RuntimeError("the SDK crashed after sending")

    with pytest.raises(RuntimeError):
        client.invoke_once(key, broken, args_for(key), tool=TOOL)
    op = Operation.objects.get(operation_key=key)
    assert (op.status, op.error_class) == ("UNKNOWN", "other")
    _, decisions = raises_in(client, downstream, key, OutcomeUnknown)
    assert decisions == ["reconcile"] and downstream.calls[key] == 0


def test_invoke_once_a_live_lease_of_another_worker_is_still_running(client, downstream):
    key = "order-10:charge:v1"
    claim = client.claim(operation_key=key, tool=TOOL, args=args_for(key), lease_s=30, worker_id="holder")
    assert claim.decision == "execute"
    started = time.monotonic()
    exc, decisions = raises_in(client, downstream, key, StillRunning, wait_timeout=1.0, max_poll_s=0.2)
    assert 1.0 <= time.monotonic() - started < 5
    assert len(decisions) >= 3 and set(decisions) == {"wait"} and 25 < exc.retry_after <= 30
    assert downstream.calls[key] == 0

    client.complete(key, outcome="succeeded", result={"id": "by-holder"}, worker_id="holder")
    assert invoke(client, downstream, key) == ({"id": "by-holder"}, ["reuse"])


def test_the_downstream_said_not_done_so_it_runs_again(client, downstream, reconciler):
    key = "order-11:charge:v1"
    downstream.fault(key, "black_hole", DROP_S)  # times out, and never happened
    raises_in(client, downstream, key, OutcomeUnknown)
    assert reconcile_due() == 1
    op = Operation.objects.get(operation_key=key)
    assert op.status == "RETRYABLE_FAILED" and op.last_reconcile["value"] == "not_found"
    downstream.fault(key, None)
    result, decisions = invoke(client, downstream, key)
    assert decisions == ["execute"] and result == downstream.records[key]
    assert (downstream.calls[key], downstream.effects[key]) == (2, 1)
    assert [h[1] for h in history(key)] == ["RUNNING", "UNKNOWN", "RETRYABLE_FAILED", "RUNNING", "SUCCEEDED"]


def test_client_refusals_carry_the_server_detail(live_server_url, tenant, client):
    _, raw = api_key_create(tenant=tenant, scopes=["ingest"])
    with pytest.raises(LedgerError) as info:
        LedgerClient(live_server_url, raw).claim(operation_key="k", tool=TOOL, args={})
    assert info.value.status == 403 and "ledger" in info.value.detail
    with pytest.raises(LedgerError) as info:
        client.get("no-such-key")
    assert info.value.status == 404 and info.value.error == "not_found"
    client.claim(operation_key="k", tool=TOOL, args={})
    with pytest.raises(LedgerError) as info:
        client.complete("k", outcome="succeeded", worker_id="intruder")
    assert info.value.status == 409 and info.value.error == "not_lease_holder"


# --- regressions: two bugs these found in ingest/ledger.py, fixed -----------------------------------------


def test_a_late_completion_in_a_second_unknown_episode_is_taken(client, downstream, reconciler):
    key = "order-12:charge:v1"
    downstream.fault(key, "black_hole", DROP_S)  # UNKNOWN, then the downstream says it never happened
    raises_in(client, downstream, key, OutcomeUnknown)
    assert reconcile_due() == 1
    assert Operation.objects.get(operation_key=key).status == "RETRYABLE_FAILED"

    claim = client.claim(operation_key=key, tool=TOOL, args=args_for(key), lease_s=1, worker_id="second")
    assert claim.decision == "execute"
    time.sleep(1.2)  # the second executor is slow: its lease expires
    assert leases_expire() == 1
    # ... then it finishes: as in the first episode, the holder's late completion resolves the UNKNOWN.
    state = client.complete(key, outcome="succeeded", result={"id": "late"}, worker_id="second")
    assert state["status"] == "SUCCEEDED"


def test_a_status_check_in_progress_does_not_hold_up_claims_of_other_operations(
    live_server_url, api_key, client, downstream, reconciler
):
    reconciler.timeout_s = 10
    reconciler.save()
    slow, other = "order-14:charge:v1", "order-15:charge:v1"
    _make_unknown(client, downstream, slow)
    _make_unknown(client, downstream, other)
    Operation.objects.filter(operation_key=slow).update(
        next_reconcile_at=timezone.now() - timedelta(minutes=1)
    )
    downstream.fault(slow, "status_hold")  # the status service is slow about this one

    def reconcile() -> None:
        try:
            reconcile_due()
        finally:
            connection.close()

    thread = threading.Thread(target=reconcile)
    thread.start()
    try:
        assert downstream.reached[slow].wait(10)
        impatient = LedgerClient(live_server_url, api_key, worker_id="impatient", timeout=2)
        claim = impatient.claim(operation_key=other, tool=TOOL, args=args_for(other))
    finally:
        downstream.release.set()
        thread.join(30)
    assert claim.decision == "reconcile"
