"""The per-run cursor with two real Celery worker processes and duplicate task deliveries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection

from ingest.models import Run, RunCursor, ToolCall
from ingest.services import events_ingest
from ingest.tasks import detect_run
from loopwatch.celery import app
from tests.ingest.events import model_round, run_started, tool_call, tool_result

ROOT = Path(__file__).resolve().parents[2]
RUNS = 6
BATCHES_PER_RUN = 30
CALL_IDS = ("a", "b", "c")  # reused again and again: only in-order processing pairs them right

pytestmark = [pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]


def _database_url() -> str:
    s = connection.settings_dict
    return (
        f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )


@pytest.fixture
def workers(needs_postgres, needs_redis, tmp_path):
    queue = f"test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DATABASE_URL": _database_url(), "CELERY_QUEUE": queue, "LOG_LEVEL": "INFO"}
    procs, logs = [], []
    for i in range(2):
        log = tmp_path / f"worker{i}.log"
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "loopwatch",
            "worker",
            "-Q",
            queue,
            "-c",
            "1",
            "-P",
            "prefork",
            "-n",
            f"w{i}-{queue}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
        ]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT))
        logs.append(log)
    # Both consuming before the first task: a worker still starting (a cold machine: CI's first
    # import) would leave all the tasks to the other, and the test would not see two at work.
    deadline = time.monotonic() + 60
    while not all(" ready." in log.read_text() for log in logs):
        if time.monotonic() > deadline or any(proc.poll() is not None for proc in procs):
            for proc in procs:
                proc.kill()
            pytest.fail(f"workers not ready in 60 s: {[log.read_text()[-2000:] for log in logs]}")
        time.sleep(0.2)
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    app.conf.task_always_eager = False
    try:
        yield logs
    finally:
        app.conf.task_default_queue = previous
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)


def _batch(run: str, b: int) -> list[dict]:
    events = [run_started(run)] if b == 0 else []
    events.append(model_round(run, n=b + 1))
    for k, call_id in enumerate(CALL_IDS):
        marker = f"{run}/{b}/{k}"
        events.append(tool_call(run, call_id, n=b + 1, args={"marker": marker}))
        events.append(tool_result(run, call_id, n=b + 1, result={"marker": marker}))
    return events


def test_two_workers_process_each_run_once_and_in_order(workers, tenant):
    for b in range(BATCHES_PER_RUN):
        for r in range(RUNS):
            events_ingest(tenant=tenant, events=_batch(f"run-{r}", b), max_event_bytes=1 << 20)
        if b % 5 == 0:  # duplicate deliveries: the same task again, several times
            for pk in Run.objects.values_list("pk", flat=True):
                for _ in range(3):
                    detect_run.delay(pk)
    runs = list(Run.objects.filter(tenant=tenant))
    assert len(runs) == RUNS
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        behind = [
            c
            for c in RunCursor.objects.filter(run__in=runs).select_related("run")
            if c.position < c.run.events_count
        ]
        if not behind:
            break
        time.sleep(0.5)
    logs = [log.read_text() for log in workers]
    assert not behind, f"cursors behind after 90 s; worker logs:\n{logs[0][-3000:]}\n{logs[1][-3000:]}"
    for cursor in RunCursor.objects.filter(run__in=runs).select_related("run"):
        # processed counts every event handled in every pass: equal to the events means once each
        assert cursor.processed == cursor.run.events_count == 1 + BATCHES_PER_RUN * (1 + 2 * len(CALL_IDS))
    calls = ToolCall.objects.filter(run__in=runs)
    assert calls.count() == RUNS * BATCHES_PER_RUN * len(CALL_IDS)
    assert all(c.result == {"marker": c.args["marker"]} for c in calls)
    for log in logs:
        assert "ingest.detect_run" in log and "succeeded" in log, "both workers must have taken tasks"
    assert "Traceback" not in "".join(logs)
