"""Concurrent batches for the same runs, from real concurrent processes, on PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count, Max

from ingest.models import Event, Run, RunCursor

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 4
BATCHES = 25
RUNS = ("shared-1", "shared-2", "shared-3")

pytestmark = [pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]

# Each process sends every run's events in a different order and with overlapping event_ids:
# process p sends ids e{b}-{k} for all b, so every event is delivered PROCESSES times.
CHILD = """
import os, random, sys
import django
django.setup()
from ingest.services import events_ingest, tenant_get_or_create
tenant = tenant_get_or_create(slug="acme")
p = int(sys.argv[1])
rng = random.Random(p)
runs = list({runs!r})
accepted = 0
for b in range({batches}):
    rng.shuffle(runs)
    batch = []
    for run in runs:
        for k in range(4):
            batch.append({{"type": "model_round", "run_id": run, "ts": "2026-11-29T10:00:00Z",
                          "round": b * 4 + k + 1, "input_tokens": 10, "output_tokens": 1,
                          "cost_usd": 0.001, "event_id": f"e{{b}}-{{k}}"}})
    result = events_ingest(tenant=tenant, events=batch, max_event_bytes=1 << 20)
    accepted += result.count("accepted")
print(accepted)
"""


def _database_url() -> str:
    s = connection.settings_dict
    return (
        f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )


def test_concurrent_batches_store_each_event_once_without_deadlock(needs_postgres, tenant):
    env = {**os.environ, "DATABASE_URL": _database_url(), "CELERY_QUEUE": "test-discard"}
    env.pop("REDIS_URL", None)  # eager: the children's detection runs in the child, after each commit
    script = CHILD.format(runs=RUNS, batches=BATCHES)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(p)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(PROCESSES)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    expected = BATCHES * 4
    assert sum(int(out) for out, _ in outputs) == expected * len(RUNS)
    for run in Run.objects.filter(run_id__in=RUNS):
        figures = Event.objects.filter(run=run).aggregate(
            n=Count("pk"), top=Max("seq"), ids=Count("event_id", distinct=True)
        )
        # once each, numbered 1..n without a gap, and the figures counted once
        assert figures == {"n": expected, "top": expected, "ids": expected}
        assert run.events_count == expected and run.input_tokens == 10 * expected
        assert run.cost_usd == pytest.approx(0.001 * expected)
        assert run.rounds == expected
        assert run.cursor.position == expected and run.cursor.processed == expected


# Batches of many runs, as an OpenTelemetry collector sends them: each process sends batches over
# overlapping random halves of the same runs, in its own order, created by whichever batch comes
# first.
WIDE_RUNS = 300
WIDE_BATCHES = 8
WIDE_CHILD = """
import random, sys
import django
django.setup()
from ingest.services import events_ingest, tenant_get_or_create
tenant = tenant_get_or_create(slug="acme")
p = int(sys.argv[1])
rng = random.Random(p)
runs = [f"wide-{{n:03d}}" for n in range({runs})]
accepted = 0
for b in range({batches}):
    batch = []
    for run in rng.sample(runs, len(runs) // 2):
        batch.append({{"type": "tool_call", "run_id": run, "ts": "2026-11-29T10:00:00Z", "round": 1,
                      "call_id": f"c{{p}}-{{b}}", "tool": "t", "args": {{}}, "event_id": f"p{{p}}-b{{b}}"}})
        batch.append({{"type": "model_round", "run_id": run, "ts": "2026-11-29T10:00:01Z", "round": b + 1,
                      "input_tokens": 7, "output_tokens": 1, "cost_usd": 0.25}})
    result = events_ingest(tenant=tenant, events=batch, max_event_bytes=1 << 20)
    accepted += result.count("accepted")
print(accepted)
"""


def test_concurrent_wide_batches_number_every_run_without_deadlock(needs_postgres, tenant):
    env = {**os.environ, "DATABASE_URL": _database_url(), "CELERY_QUEUE": "test-discard"}
    env.pop("REDIS_URL", None)  # eager: the children's detection runs in the child, after each commit
    script = WIDE_CHILD.format(runs=WIDE_RUNS, batches=WIDE_BATCHES)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(p)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(PROCESSES)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    sent = PROCESSES * WIDE_BATCHES * (WIDE_RUNS // 2) * 2
    assert sum(int(out) for out, _ in outputs) == sent
    runs = Run.objects.filter(tenant=tenant, run_id__startswith="wide-")
    assert runs.count() == WIDE_RUNS  # each run created once, whichever batch came first
    stored = 0
    for run in runs:
        figures = Event.objects.filter(run=run).aggregate(n=Count("pk"), top=Max("seq"))
        n = figures["n"]
        # numbered 1..n without a gap or a repeat (the unique (run, seq) index), figures counted once
        assert n and figures["top"] == n and run.events_count == n, run.run_id
        assert run.tool_calls == n // 2 and run.input_tokens == 7 * (n // 2)
        assert run.cost_usd == pytest.approx(0.25 * (n // 2))
        assert run.started_at is not None and run.last_event_at is not None
        assert RunCursor.objects.filter(run=run).exists()
        stored += n
    assert stored == sent
