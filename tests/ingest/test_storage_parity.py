"""Where PostgreSQL writes with statements of its own, the portable ORM path (SQLite's) gives the same
rows: both run here on PostgreSQL over the same input, to two tenants, and the rows are compared.

The switch is ingest.bulk.postgres_statements (portable_writes() turns the statements off): the
pipeline's pass (the locked read, materialising rounds and calls, the detections and the runs'
progress), rows_update, and the ledger's one-statement claim and completion. The batch ingest path
has its own parity test (ingest.services.ingestion).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import time_machine
from django.conf import settings

from ingest.bulk import portable_writes, rows_update
from ingest.ledger import operation_claim, operation_complete
from ingest.models import (
    Detection,
    Incident,
    ModelRound,
    Operation,
    OperationTransition,
    PendingResult,
    Run,
    RunCursor,
    Tenant,
    ToolCall,
)
from ingest.services import events_ingest, runs_process
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result

# Set by the database or the clock of the moment, not by the input.
MOMENT = {"id", "tenant_id", "created_at", "updated_at", "at", "operation_id", "last_detection_id"}


def _rows(model, *, tenant: Tenant, order: tuple[str, ...], via: str = "tenant") -> list[dict[str, Any]]:
    """The tenant's rows of `model` without what only says which row or when it was written; the run
    named by its run_id (the pks differ between the tenants)."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname not in MOMENT]
    if "run_id" in names and model is not Run:
        names[names.index("run_id")] = "run__run_id"
    return list(model.objects.filter(**{via: tenant}).order_by(*order).values(*names))


def _events(run_id: str) -> list[list[dict[str, Any]]]:
    """Three batches of one run: identical reads (a repeat, then a correction), a result that comes
    before its call, a failing tool retried, a model round with text, and the run's end."""
    first = [run_started(run_id), model_round(run_id, 1, text="Let me look that up.")]
    for n in range(1, 5):
        first += [tool_call(run_id, f"c{n}", n), tool_result(run_id, f"c{n}", n)]
    second = [tool_result(run_id, "c6", 6, result={"n": 6})]  # before its call
    for n in (5, 6):
        second += [model_round(run_id, n), tool_call(run_id, f"c{n}", n, args={"customer": str(n)})]
    second.append(tool_result(run_id, "c5", 5, status="error", error_class="not_found", result="no"))
    third = []
    for n in (7, 8, 9):
        third += [
            tool_call(run_id, f"c{n}", n, tool="get_order", args={"order": "x"}),
            tool_result(run_id, f"c{n}", n, status="error", error_class="not_found", result="no"),
        ]
    third.append(run_finished(run_id, status="failed"))
    return [first, second, third]


def _ingest_and_process(tenant: Tenant, run_ids: list[str]) -> None:
    batches = [_events(run_id) for run_id in run_ids]
    for step in range(3):
        events = [event for per_run in batches for event in per_run[step]]
        result = events_ingest(
            tenant=tenant, events=events, max_event_bytes=settings.LOOPWATCH_MAX_EVENT_BYTES
        )
        assert result.count("accepted") == len(events), result.verdicts
        pks = list(Run.objects.filter(tenant=tenant).values_list("pk", flat=True))
        while runs_process(run_pks=pks, chunk=4):  # several passes, each resuming the engine's state
            pass


@pytest.mark.django_db
def test_the_pipelines_pass_stores_the_same_rows_both_ways(needs_postgres):
    native, portable = (Tenant.objects.create(slug=slug, name=slug) for slug in ("native", "portable"))
    run_ids = ["a", "b", "c"]
    _ingest_and_process(native, run_ids)
    with portable_writes():
        _ingest_and_process(portable, run_ids)

    def stored(tenant: Tenant) -> dict[str, list[dict[str, Any]]]:
        by_run = {"via": "run__tenant"}
        return {
            "runs": _rows(Run, tenant=tenant, order=("run_id",)),
            "cursors": _rows(RunCursor, tenant=tenant, order=("run__run_id",), **by_run),
            "detections": _rows(Detection, tenant=tenant, order=("run__run_id", "seq", "kind")),
            "calls": _rows(ToolCall, tenant=tenant, order=("run__run_id", "seq"), **by_run),
            "rounds": _rows(ModelRound, tenant=tenant, order=("run__run_id", "seq"), **by_run),
            "pending": _rows(PendingResult, tenant=tenant, order=("run__run_id", "seq"), **by_run),
            "incidents": _rows(Incident, tenant=tenant, order=("run__run_id", "kind", "signature")),
        }

    ours, theirs = stored(native), stored(portable)
    for incident in (*ours["incidents"], *theirs["incidents"]):  # a step names its detection's pk
        incident["steps"] = [{k: v for k, v in step.items() if k != "id"} for step in incident["steps"]]
    assert ours["detections"] and ours["calls"] and ours["rounds"] and ours["incidents"]  # all exercised
    assert any(d["action"] == "correct" for d in ours["detections"])
    for table in ours:
        assert ours[table] == theirs[table], table


@pytest.mark.django_db
def test_rows_update_writes_the_same_values_both_ways(needs_postgres, tenant):
    events_ingest(
        tenant=tenant,
        events=[run_started("a"), run_started("b")],
        max_event_bytes=settings.LOOPWATCH_MAX_EVENT_BYTES,
    )
    runs = {run.run_id: run for run in Run.objects.filter(tenant=tenant)}
    values = {
        "cost_usd": 1e-7,
        "loop_flagged": True,
        "handoff": {"hint": "ask", "n": [1, None]},
        "reason": "x\ty",
    }
    for run_id, portable in (("a", False), ("b", True)):
        run = runs[run_id]
        for name, value in values.items():
            setattr(run, name, value)
        if portable:
            with portable_writes():
                rows_update(Run, [run], list(values))
        else:
            rows_update(Run, [run], list(values))
    a, b = (Run.objects.values(*values).get(tenant=tenant, run_id=run_id) for run_id in ("a", "b"))
    assert a == b == values


@pytest.mark.django_db(transaction=True)  # the one-statement paths run outside a transaction only
def test_the_ledgers_claim_and_completion_store_the_same_rows_both_ways(needs_postgres):
    native, portable = (Tenant.objects.create(slug=slug, name=slug) for slug in ("native", "portable"))

    def ledger(tenant: Tenant) -> None:
        for n in range(3):
            answer = operation_claim(
                tenant=tenant,
                key=f"refund-{n}",
                tool="refund",
                args={"order": n, "amount": 10.5},
                worker_id="w1",
                lease_s=30,
                step_id=f"s{n}",
                attempt_id=f"a{n}",
            )
            assert answer.decision == "execute"
        for n in (0, 1):
            operation_complete(
                tenant=tenant,
                key=f"refund-{n}",
                worker_id="w1",
                outcome="succeeded",
                result={"refund": f"re_{n}", "amounts": [10.5, None]},
                external_request_id=f"req-{n}",
            )

    with time_machine.travel(datetime(2026, 11, 29, 10, 0, tzinfo=UTC), tick=False):
        ledger(native)
        with portable_writes():
            ledger(portable)
    by_op = {"via": "operation__tenant"}
    for model, order, through in (
        (Operation, ("operation_key",), {}),
        (OperationTransition, ("operation__operation_key", "to_status"), by_op),
    ):
        ours = _rows(model, tenant=native, order=order, **through)
        theirs = _rows(model, tenant=portable, order=order, **through)
        assert ours and ours == theirs, model.__name__
