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

import contextlib
import http.client
import inspect
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

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
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
TOOL = "charge_card"
TOOL_TIMEOUT_S = 0.5  # the tool's own HTTP timeout; a "drop" fault answers after it
DROP_S = 1.5
MANY_PROCESSES = 8
MANY_POOL = 1000  # distinct keys to draw from
MANY_PER_PROCESS = 500  # keys each process invokes (plus MANY_REPEATS of its own again)
MANY_REPEATS = 50

pytestmark = [pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]


# --- the tool, as an agent runtime wraps it (also run in the client processes: stdlib only) ---------


class DownstreamUnavailable(Exception):
    """503 or connection refused: the downstream did not take the request, so there was no effect."""

    error_class = "transient"


class DownstreamRejected(Exception):
    """4xx: the downstream refused the arguments; running it again cannot help."""

    error_class = "invalid_argument"


def args_for(key: str) -> dict:
    """The arguments of the operation `key`: the same in every process."""
    return {"customer": f"cus-{key}", "amount_cents": 100 + sum(map(ord, key)) % 900, "currency": "EUR"}


def downstream_tool(base_url: str, timeout: float, calls: list | None = None):
    """charge(args, idempotency_key=...) -> the downstream's record; appends each key to `calls`."""

    def charge(args: dict, *, idempotency_key: str) -> dict:
        import json
        import urllib.error
        import urllib.request

        if calls is not None:
            calls.append(idempotency_key)
        request = urllib.request.Request(
            f"{base_url}/effects",
            data=json.dumps(args).encode(),
            method="POST",
            headers={"Idempotency-Key": idempotency_key, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                raise DownstreamUnavailable(f"503 from {base_url}") from exc
            raise DownstreamRejected(f"{exc.code} from {base_url}: {exc.read()[:200]!r}") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                raise DownstreamUnavailable(f"{base_url} refused the connection") from exc
            raise

    return charge


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
CHILD = "\n".join(
    [
        "from __future__ import annotations",
        *(
            inspect.getsource(x)
            for x in (DownstreamUnavailable, DownstreamRejected, args_for, downstream_tool)
        ),
        CHILD_MAIN,
    ]
)


# --- the downstream service -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Downstream:
    """A payment-like service on a real port, with injectable faults.

    POST /effects (Idempotency-Key): performs the effect once per key and answers its record; the
    same key again answers the first record with no second effect. GET /status/<key>: {"state":
    "done", ...record} or {"state": "not_found"}. Faults per key (`fault(key, mode, seconds)`):
    drop (effect, then answer after `seconds`: the client has timed out), hold (effect, then wait
    for `release`: the executor is killed meanwhile), black_hole (no effect, no answer for `seconds`), fail_before (503, no effect), reject (400,
    no effect), status_hold (the status check of the key waits for `release`). `reached[key]` is
    set when a hold is reached. stop()/start() take the whole service down and back on the same port.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()
        self.records: dict[str, dict] = {}
        self.status_asks: Counter[str] = Counter()
        self.faults: dict[str, tuple[str, float]] = {}
        self.reached: dict[str, threading.Event] = {}
        self.release = threading.Event()
        self.server: ThreadingHTTPServer | None = None

    def fault(self, key: str, mode: str | None, seconds: float = 0.0) -> None:
        with self.lock:
            if mode is None:
                self.faults.pop(key, None)
            else:
                self.faults[key] = (mode, seconds)
                self.reached.setdefault(key, threading.Event())

    def start(self) -> None:
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                key = self.headers.get("Idempotency-Key", "")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/effects" or not key:
                    return self._answer(400, {"error": "POST /effects with an Idempotency-Key"})
                with downstream.lock:
                    downstream.calls[key] += 1
                    mode, seconds = downstream.faults.get(key, ("", 0.0))
                if mode == "fail_before":
                    return self._answer(503, {"error": "unavailable"})
                if mode == "reject":
                    return self._answer(400, {"error": "card declined"})
                if mode == "black_hole":
                    time.sleep(seconds)
                    return self._answer(503, {"error": "lost"})
                with downstream.lock:
                    if key not in downstream.records:  # honour the idempotency key
                        downstream.effects[key] += 1
                        downstream.records[key] = {
                            "id": f"ch_{sum(downstream.effects.values()):06d}",
                            "key": key,
                            "amount_cents": json.loads(body).get("amount_cents"),
                        }
                    record = downstream.records[key]
                if mode == "hold":
                    downstream.reached[key].set()
                    downstream.release.wait(30)
                elif mode == "drop":
                    time.sleep(seconds)
                self._answer(200, record)

            def do_GET(self) -> None:
                if not self.path.startswith("/status/"):
                    return self._answer(404, {"error": "no such path"})
                key = unquote(self.path.removeprefix("/status/"))
                with downstream.lock:
                    downstream.status_asks[key] += 1
                    record = downstream.records.get(key)
                    mode, _ = downstream.faults.get(key, ("", 0.0))
                if mode == "status_hold":
                    downstream.reached[key].set()
                    downstream.release.wait(30)
                self._answer(200, {"state": "done", **record} if record else {"state": "not_found"})

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                with contextlib.suppress(OSError):  # the client may have given up (a "drop")
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            block_on_close = False

            def handle_error(self, request, client_address) -> None:
                pass

        self.release.clear()
        self.server = Server((HOST, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, name="downstream", daemon=True).start()

    def stop(self) -> None:
        """Down: the port is closed (connections are refused)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.release.set()


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    service = Downstream()
    service.start()
    yield service
    service.stop()


@pytest.fixture
def reconciler(downstream) -> Reconciler:
    return Reconciler.objects.create(
        tool=TOOL,
        url_template=f"{downstream.url}/status/{{operation_key}}",
        field="state",
        done_values=["done"],
        not_done_values=["not_found"],
        timeout_s=2.0,
    )


# --- the live loopwatch server --------------------------------------------------------------------


def _database_url() -> str:
    s = connection.settings_dict
    return (
        f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )


@pytest.fixture(scope="module")
def live_server_url(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """uvicorn (2 workers) on the test database, REDIS_URL unset (Celery eager), DEBUG on."""
    if connection.vendor != "postgresql":  # as the needs_postgres fixture, which is function-scoped
        message = "needs PostgreSQL (DATABASE_URL=postgres://...)"
        if IN_CI:
            pytest.fail(f"{message}: CI must run on the real servers")
        pytest.skip(message)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": _database_url(), "DEBUG": "true", "LOG_LEVEL": "WARNING"}
    env.pop("REDIS_URL", None)
    log_path = tmp_path_factory.mktemp("uvicorn") / "uvicorn.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "uvicorn"),
                "loopwatch.asgi:application",
                "--host",
                HOST,
                "--port",
                str(port),
                "--workers",
                "2",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"uvicorn exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"uvicorn did not answer:\n{log_path.read_text()[-3000:]}"
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            with contextlib.suppress(OSError):
                conn.request("GET", "/api/v1/operations/ping")
                if conn.getresponse().status in (401, 403):  # up: it asks for a key
                    break
            conn.close()
            time.sleep(0.2)
        conn.close()
        time.sleep(1.0)  # the second worker boots too
        yield f"http://{HOST}:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # a worker the supervisor left behind


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


def collect(procs: list[subprocess.Popen], timeout: float = 120) -> list[dict]:
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out))
    for report in reports:
        assert not report["django_loaded"], "loopwatch_client must not import Django"
    return reports


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
