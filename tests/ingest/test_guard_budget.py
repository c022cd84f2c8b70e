"""The guard's check answers within its time budget, and says when it was cut short (issue 11, item 2:
20 checks on a run of 240 KB arguments made another tenant's request time out at 60 s)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from ingest.guard import GUARD_CHUNK, ProposedCall, call_check, config_cache_clear
from ingest.models import RunCursor
from ingest.services import api_key_create, runs_process
from tests.ingest.events import run_started, tool_call, tool_result
from tests.ingest.test_poison import corrupt, plant

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"


@pytest.fixture(autouse=True)
def fresh_config():
    config_cache_clear()


def long_run(run_id: str, calls: int, *, chars: int = 200 * 1024, news: bool = False) -> list[dict]:
    """A run of reads with huge arguments, each nudged at both ends, and the same result each time
    (so the perturbation detector compares each call's arguments with the previous one's: fuzzy
    matching's worst case); with news, a new result each time (a run that goes somewhere)."""
    rng = random.Random(run_id)
    body = " ".join(f"w{rng.randrange(5000)}" for _ in range(chars // 5))[:chars]
    events = [run_started(run_id)]
    for n in range(1, calls + 1):
        args = {"query": f"nudge {n} {body} nudge {n}"}
        events += [
            tool_call(run_id, f"c{n}", n=n, args=args),
            tool_result(run_id, f"c{n}", n=n, result={"hits": [f"doc{n}"] if news else []}),
        ]
    return events


def _check(tenant, run_id: str, budget_s: float):
    # At the time of the run's events (a check made now would run out its wall-clock budget).
    when = datetime(2026, 11, 29, 10, 1, tzinfo=UTC)
    call = ProposedCall(tool="search_orders", args={"customer": "42"}, kind="read", ts=when)
    return call_check(tenant=tenant, run_id=run_id, call=call, budget_s=budget_s)


@pytest.mark.django_db
def test_a_check_out_of_time_says_how_far_behind_it_answers(needs_postgres, tenant):
    plant(tenant, long_run("r1", 40, chars=100, news=True))  # 81 events
    answer = _check(tenant, "r1", budget_s=0.000001)
    assert answer.decision == "allow"
    cut = answer.as_dict()["cut_short"]
    assert cut["reason"] == "time_budget" and "time budget of 1e-06 s" in cut["detail"]
    cursor = RunCursor.objects.get(run__run_id="r1")
    # One pass of the guard's chunk, then the deadline: the rest is the pipeline's.
    assert cursor.position == GUARD_CHUNK and cut["events_behind"] == 81 - GUARD_CHUNK
    caught_up = _check(tenant, "r1", budget_s=30).as_dict()
    assert "cut_short" not in caught_up
    assert RunCursor.objects.get(run__run_id="r1").position == 81


@pytest.mark.django_db
def test_a_check_on_a_quarantined_run_says_detection_failed(tenant):
    (pk,) = plant(tenant, corrupt("bad"))
    runs_process(run_pks=[pk])
    cut = _check(tenant, "bad", budget_s=5).as_dict()["cut_short"]
    assert cut["reason"] == "detection_failed" and "KeyError" in cut["detail"] and cut["events_behind"] == 2


def _other_connection() -> psycopg.Connection:
    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"] or HOST,
        port=s["PORT"] or 5432,
        user=s["USER"],
        password=s["PASSWORD"],
        dbname=s["NAME"],
    )


@pytest.mark.django_db(transaction=True)
def test_a_check_waits_for_the_pass_another_task_is_making_of_its_run(needs_postgres, tenant):
    """A detection task holding the run is usually processing the very events the check needs: the
    check waits for its pass (here, a pass that ends after 0.5 s) and answers from what it stored."""
    (pk,) = plant(tenant, long_run("busy", 3, chars=100))
    with _other_connection() as other:
        other.execute("SELECT 1 FROM ingest_runcursor WHERE run_id = %s FOR UPDATE", [pk])
        timer = threading.Timer(0.5, other.rollback)  # the task's pass ends
        timer.start()
        started = time.monotonic()
        answer = _check(tenant, "busy", budget_s=30).as_dict()
        waited = time.monotonic() - started
        timer.join()
    assert "cut_short" not in answer
    assert RunCursor.objects.get(run_id=pk).position == 7
    assert 0.4 < waited < 10


@pytest.mark.django_db(transaction=True)
def test_a_check_waits_for_another_task_no_longer_than_its_budget(needs_postgres, tenant):
    (pk,) = plant(tenant, long_run("stuck", 3, chars=100))
    with _other_connection() as other:  # a task holding the run's cursor for longer than the budget
        other.execute("SELECT 1 FROM ingest_runcursor WHERE run_id = %s FOR UPDATE", [pk])
        started = time.monotonic()
        answer = _check(tenant, "stuck", budget_s=1.0).as_dict()
        waited = time.monotonic() - started
        other.rollback()
    assert answer["cut_short"]["reason"] == "time_budget" and answer["cut_short"]["events_behind"] == 7
    assert 0.9 < waited < 5, "the check either did not wait for the lock or waited past its budget"


# --- two tenants against a real server --------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(needs_postgres, transactional_db) -> Iterator[str]:
    """uvicorn with 2 workers on the test database (Celery eager), a guard budget of 0.5 s."""
    s = connection.settings_dict
    url = f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or HOST}:{s['PORT'] or 5432}/{s['NAME']}"
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": url, "LOOPWATCH_GUARD_BUDGET_MS": "500", "LOG_LEVEL": "WARNING"}
    env.pop("REDIS_URL", None)
    uvicorn = str(Path(sys.executable).parent / "uvicorn")
    args = ["loopwatch.asgi:application", "--host", HOST, "--port", str(port), "--workers", "2"]
    proc = subprocess.Popen(
        [uvicorn, *args, "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "uvicorn did not start"
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection(HOST, port, timeout=2)
                conn.request("GET", "/api/v1/runs")
                if conn.getresponse().status in (401, 403):
                    break
            time.sleep(0.2)
        time.sleep(1.0)  # the second worker boots too
        yield f"{HOST}:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def _post(address: str, path: str, body, key: str, timeout: float) -> tuple[int, dict, float]:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    started = time.monotonic()
    try:
        conn.request(
            "POST",
            path,
            json.dumps(body),
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}"), time.monotonic() - started
    finally:
        conn.close()


def test_checks_on_a_run_of_huge_values_do_not_starve_another_tenant(server, tenant, other_tenant):
    """Tenant A: a run of 40 calls with 200 KB arguments, not processed yet, and 20 checks on it at
    once. Tenant B meanwhile: checks and small batches of its own. B is served throughout; A's checks
    answer, those that could not catch up saying so."""
    plant(tenant, long_run("huge", 40))
    plant(other_tenant, [run_started("small"), tool_call("small", "c1"), tool_result("small", "c1")])
    _, key_a = api_key_create(tenant=tenant, scopes=["ingest"])
    _, key_b = api_key_create(tenant=other_tenant, scopes=["ingest"])
    check = {"tool": "search_kb", "kind": "read", "args": {"query": "nudge 41"}, "ts": "2026-11-29T10:01:00Z"}
    answers_a: list = []
    answers_b: list = []

    def tenant_a() -> None:
        answers_a.append(_post(server, "/api/v1/runs/huge/check", check, key_a, timeout=60))

    def tenant_b() -> None:
        for n in range(6):
            answers_b.append(
                _post(server, "/api/v1/runs/small/check", {"tool": "t", "args": {"n": n}}, key_b, 30)
            )
            batch = [tool_call("small", f"b{n}", n=n + 2), tool_result("small", f"b{n}", n=n + 2)]
            answers_b.append(_post(server, "/api/v1/events", batch, key_b, 30))

    threads = [threading.Thread(target=tenant_a) for _ in range(20)] + [threading.Thread(target=tenant_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers_b) == 12, "tenant B's requests did not all complete"
    assert all(status == 200 for status, _, _ in answers_b), answers_b
    assert len(answers_a) == 20 and all(status == 200 for status, _, _ in answers_a)
    cut = [body["cut_short"] for _, body, _ in answers_a if "cut_short" in body]
    assert cut and all(c["reason"] == "time_budget" and c["events_behind"] > 0 for c in cut)
