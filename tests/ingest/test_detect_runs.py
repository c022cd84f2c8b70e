"""The detection task processes all the runs a batch touched together (runs_process)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ingest.models import (
    Backend,
    Detection,
    ModelPrice,
    ModelRound,
    Operation,
    OperationTransition,
    PendingResult,
    Run,
    RunCursor,
    ToolCall,
)
from ingest.services import events_ingest, run_process
from ingest.tasks import detect_runs
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result

ROOT = Path(__file__).resolve().parents[2]


def _ingest(tenant, events: list[dict]) -> list[int]:
    # Called outside the API, the batch's detection task is not run (no commit in a test): the
    # test runs it itself.
    return events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20).runs_touched


def _write(run: str, call_id: str, n: int, key: str) -> dict:
    return tool_call(run, call_id, n=n, tool="place_order", kind="write", args={"sku": n}, operation_key=key)


def _batches() -> list[list[dict]]:
    """Four runs interleaved in five batches: a loop, writes (one key executed again in another
    run, one timing out), results before their calls, unpriced rounds, a budget run out."""
    runs = ("loop", "writer", "early", "budget")
    batches: list[list[dict]] = [[run_started(r) for r in runs]]
    batches[0][3]["budgets"] = {"max_tool_calls": 4}
    for b in range(1, 5):
        batch: list[dict] = []
        for r in runs:
            batch.append(model_round(r, n=b) if b % 2 else model_round(r, n=b, cost_usd=0.01))
        batch += [
            tool_call("loop", f"l{b}", n=b, args={"customer": "42"}),
            tool_result("loop", f"l{b}", n=b, result={"orders": []}),
            # The result of the previous batch's call first, then this batch's call.
            tool_result("early", f"e{b - 1}", n=b, result={"page": b - 1}),
            tool_call("early", f"e{b}", n=b, args={"page": b}),
            tool_call("budget", f"b{b}", n=b, tool="poll_job", kind="poll", args={"job": b}),
            tool_result("budget", f"b{b}", n=b, result={"status": "RUNNING", "n": b}),
        ]
        if b == 1:
            batch += [_write("writer", "w1", 1, "order-1"), tool_result("writer", "w1", status="timeout")]
            batch += [_write("early", "x1", 1, "order-2")]
        elif b == 2:
            batch += [_write("writer", "w2", 2, "order-1"), tool_result("early", "x1", result={"id": 2})]
            batch += [_write("loop", "x2", 2, "order-2")]
        elif b == 3:
            batch += [
                tool_result("writer", "w2", result={"id": 1}),
                tool_result("loop", "x2", status="timeout"),
            ]
        else:
            batch += [run_finished("writer")]
        batches.append(batch)
    return batches


def _recorded(tenant) -> dict:
    """What processing stored for a tenant's runs, keyed by run_id (not by pk)."""
    out: dict = {}
    for run in Run.objects.filter(tenant=tenant).order_by("run_id"):
        cursor = RunCursor.objects.get(run=run)
        out[run.run_id] = {
            "figures": [
                getattr(run, name)
                for name in (
                    *("loop_flagged", "first_loop_at", "first_loop_seq", "cost_after_loop_usd", "max_action"),
                    *("detections_count", "terminated_by", "budget_type", "last_progress_step", "status"),
                )
            ],
            "cursor": (cursor.position, cursor.processed, cursor.engine_state),
            "rounds": list(run.model_rounds.order_by("seq").values_list("seq", "cost_usd", "cost_computed")),
            "calls": list(
                run.calls.order_by("seq").values_list(
                    "seq", "call_id", "args", "result_seq", "result_status", "result"
                )
            ),
            "pending": list(run.pending_results.order_by("seq").values_list("seq", "call_id")),
            "detections": list(
                run.detections.order_by("seq", "kind").values_list(
                    "seq", "kind", "action", "signature", "count", "hint"
                )
            ),
        }
    out["operations"] = [
        (op.operation_key, op.status, op.executions, op.attempts, op.run.run_id, op.call_id)
        for op in Operation.objects.filter(tenant=tenant).order_by("operation_key")
    ]
    out["transitions"] = list(
        OperationTransition.objects.filter(operation__tenant=tenant)
        .order_by("pk")
        .values_list("operation__operation_key", "from_status", "to_status", "actor", "note")
    )
    return out


@pytest.mark.django_db
def test_a_task_of_several_runs_records_what_one_pass_per_run_records(tenant, other_tenant):
    backend = Backend.objects.create(name="openai", markup=1.1)
    ModelPrice.objects.create(backend=backend, model="gpt-4o", input_usd_per_mtok=2.5, output_usd_per_mtok=10)
    for batch in _batches():
        detect_runs(_ingest(tenant, batch))
        for pk in _ingest(other_tenant, batch):
            run_process(run_pk=pk)
    together, one_by_one = _recorded(tenant), _recorded(other_tenant)
    assert together == one_by_one
    # and the trace did exercise what it is meant to
    assert {"exact_repeat", "duplicate_side_effect", "budget"} <= set(
        Detection.objects.filter(tenant=tenant).values_list("kind", flat=True)
    )
    # A second execution of a key that is UNKNOWN or SUCCEEDED is flagged; its result does not
    # settle the operation (the first execution's account stands).
    assert together["operations"] == [
        ("order-1", "UNKNOWN", 2, 1, "writer", "w2"),
        ("order-2", "SUCCEEDED", 2, 1, "early", "x2"),
    ]
    assert ModelRound.objects.filter(run__tenant=tenant, cost_computed=True).count() == 8


@pytest.mark.django_db
def test_results_before_their_calls_join_the_calls_of_their_own_run(tenant):
    # Two runs, the same call_ids: each result waits for the call of its own run.
    detect_runs(
        _ingest(
            tenant,
            [
                run_started("a"),
                run_started("b"),
                tool_result("a", "c1", result={"from": "a1"}),
                tool_result("b", "c1", result={"from": "b1"}),
                tool_result("b", "c2", result={"from": "b2"}),
                tool_call("a", "c2", args={"to": "a2"}),  # no result of a's yet: open
            ],
        )
    )
    assert PendingResult.objects.count() == 3
    detect_runs(
        _ingest(
            tenant,
            [
                tool_call("b", "c1", args={"to": "b1"}),
                tool_call("a", "c1", args={"to": "a1"}),
                tool_result("a", "c2", result={"from": "a2"}),
                tool_call("b", "c2", args={"to": "b2"}),
            ],
        )
    )
    calls = ToolCall.objects.filter(run__tenant=tenant)
    assert sorted((c.args["to"], c.result["from"]) for c in calls) == [
        ("a1", "a1"),
        ("a2", "a2"),
        ("b1", "b1"),
        ("b2", "b2"),
    ]
    assert not PendingResult.objects.exists()


def _loop_runs(tenant, n: int, prefix: str) -> list[int]:
    events = []
    for r in range(n):
        run = f"{prefix}-{r}"
        events += [run_started(run), model_round(run, n=1)]
        for i in range(3):
            events += [tool_call(run, f"c{i}", n=i + 1), tool_result(run, f"c{i}", n=i + 1)]
        events += [_write(run, "w", 4, f"{run}:w"), tool_result(run, "w", n=4, result={"ok": 1})]
        events += [tool_result(run, "late", n=5), tool_call(run, "open", n=5)]
    return _ingest(tenant, events)


@pytest.mark.django_db
def test_the_queries_of_a_task_do_not_grow_with_its_runs(needs_postgres, tenant):
    # On PostgreSQL: elsewhere (the embedded SQLite) the runs' figures are written one run at a time.
    Backend.objects.create(name="openai")  # rounds priced (at no cost): the price query runs
    counts = {}
    for n in (2, 12):
        pks = _loop_runs(tenant, n, f"n{n}")
        with CaptureQueriesContext(connection) as queries:
            detect_runs(pks)
        counts[n] = len(queries)
        # a second batch: results of the calls left open, calls of the results that came first
        more = []
        for r in range(n):
            run = f"n{n}-{r}"
            more += [tool_result(run, "open", n=6), tool_call(run, "late", n=6), model_round(run, n=6)]
        pks = _ingest(tenant, more)
        with CaptureQueriesContext(connection) as queries:
            detect_runs(pks)
        counts[(n, "again")] = len(queries)
    assert Detection.objects.filter(action="correct").count() == 14  # every run's loop was found
    assert counts[2] == counts[12] and counts[(2, "again")] == counts[(12, "again")], counts
    assert counts[12] <= 20, counts


@pytest.mark.django_db(transaction=True)
def test_a_run_another_task_holds_is_passed_over_then_processed(needs_postgres, tenant, monkeypatch):
    monkeypatch.setattr("ingest.services.ingestion.detection_enqueue", lambda pks: None)
    pks = _ingest(
        tenant, [run_started("free"), run_started("held"), model_round("free"), model_round("held")]
    )
    free, held = sorted(pks, key=lambda pk: Run.objects.get(pk=pk).run_id)
    s = connection.settings_dict
    url = f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    seen: list[int] = []
    with psycopg.connect(url) as other:
        other.execute("SELECT 1 FROM ingest_runcursor WHERE run_id = %s FOR UPDATE", [held])

        def release() -> None:
            # The free run is processed and committed while the other run is still held.
            for _ in range(100):
                with psycopg.connect(url, autocommit=True) as probe:
                    position = probe.execute(
                        "SELECT position FROM ingest_runcursor WHERE run_id = %s", [free]
                    ).fetchone()[0]
                if position:
                    break
                threading.Event().wait(0.05)
            seen.append(position)
            other.commit()

        releaser = threading.Thread(target=release)
        releaser.start()
        assert detect_runs([held, free]) == 4
        releaser.join()
    assert seen == [2]
    assert RunCursor.objects.get(run_id=held).position == 2


CHILD = """
import random, sys
import django
django.setup()
from ingest.services import events_ingest, tenant_get_or_create
tenant = tenant_get_or_create(slug="acme")
p = int(sys.argv[1])
rng = random.Random(p)
runs = list({runs!r})
for b in range({batches}):
    rng.shuffle(runs)
    batch = []
    for run in runs[: rng.randint(2, len(runs))]:
        batch.append({{"type": "model_round", "run_id": run, "ts": "2026-11-29T10:00:00Z", "round": b + 1}})
        for k in ("a", "b"):  # call_ids reused: only in-order processing pairs them right
            marker = f"{{p}}/{{b}}/{{k}}"
            batch.append({{"type": "tool_call", "run_id": run, "ts": "2026-11-29T10:00:01Z", "round": b + 1,
                          "call_id": k, "tool": "t", "args": {{"marker": marker}}}})
            batch.append({{"type": "tool_result", "run_id": run, "ts": "2026-11-29T10:00:02Z", "call_id": k,
                          "status": "ok", "result": {{"marker": marker}}}})
    # Eager Celery: the batch's detection task runs here after the commit, beside the other
    # processes' tasks over the same runs.
    events_ingest(tenant=tenant, events=batch, max_event_bytes=1 << 20)
"""


@pytest.mark.real_workers
@pytest.mark.django_db(transaction=True)
def test_concurrent_tasks_over_the_same_runs_process_every_event_once_in_order(needs_postgres, tenant):
    runs = [f"shared-{i}" for i in range(8)]
    s = connection.settings_dict
    url = f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "CELERY_QUEUE": "test-discard"}
    env.pop("REDIS_URL", None)  # eager: each child's detection runs in the child, after each commit
    script = CHILD.format(runs=runs, batches=30)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(p)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(4)
    ]
    outputs = [proc.communicate(timeout=180) for proc in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    stored = Run.objects.filter(tenant=tenant)
    assert stored.count() == len(runs)
    # No task lost a run it passed over: every cursor is at its run's last event, and every event
    # was processed once (processed counts each pass's events).
    for run in stored:
        cursor = RunCursor.objects.get(run=run)
        assert cursor.position == cursor.processed == run.events_count > 0
    calls = ToolCall.objects.filter(run__tenant=tenant)
    assert calls.count() == sum(run.tool_calls for run in stored)
    assert all(c.result == {"marker": c.args["marker"]} for c in calls)
    assert not PendingResult.objects.exists()
