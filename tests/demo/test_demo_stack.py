"""The demo shows every part: `manage.py simulate` against a real server (uvicorn on the test
PostgreSQL database) sends REST events, OTLP spans and guarded runs; `demo_beat` then does what
Celery beat would, and the demo reconciler answers some UNKNOWN writes and leaves the others to a
person. Asserted on the rows the server stored."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from demo.downstream import PaymentService
from ingest.models import Operation, OperationTransition, Reconciler, Run
from tests.live import uvicorn_serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

# 30 runs of this seed hold OTLP runs (analyst), loops of guarded agents, and REST write timeouts
# of create_refund the payment service confirms and of writes it cannot answer (a search over seeds
# with demo.simulation and demo.downstream.refund_status found it; another generator may need another).
SEED, RUNS = 882, 30


def test_the_demo_fills_every_part(tmp_path, tenant, make_key, settings):
    settings.LOOPWATCH_RECONCILER_ALLOWED_HOSTS = ["127.0.0.1"]
    payments = PaymentService(0)
    try:
        with uvicorn_serve(tmp_path / "server.log") as (url, _):
            call_command(
                "demo_setup",
                key_file=tmp_path / "key",
                tenant=tenant.slug,
                downstream_url=payments.url,
                stdout=StringIO(),
            )
            # One unclear answer is enough to hand a write to a person (the demo asks three times).
            Reconciler.objects.filter(tenant=tenant).update(max_attempts=1)
            out = StringIO()
            call_command(
                "simulate",
                url=url,
                key=(tmp_path / "key").read_text().strip(),
                runs=RUNS,
                seed=SEED,
                rate=0,
                no_progress=True,
                stdout=out,
                stderr=StringIO(),
            )
            call_command("demo_beat", once=True)  # reconciliation, as beat would run it
    finally:
        payments.close()
    text = out.getvalue()
    assert "over OTLP:" in text and "through the guard:" in text, text

    runs = Run.objects.filter(tenant=tenant)
    otlp = runs.filter(labels__source="otlp")
    assert otlp.exists() and all(run.agent == "analyst" for run in otlp)
    guarded = runs.filter(labels__sim_via="guard")
    assert {run.agent for run in guarded} <= {"refund-desk", "shop-assistant"} and guarded.exists()
    waiting = guarded.filter(status=Run.Status.WAITING)
    assert waiting.exists(), "no guarded run was handed to a person"
    assert not runs.exclude(labels__sim_via="guard").filter(status=Run.Status.WAITING).exists()

    ops = Operation.objects.filter(tenant=tenant)
    reconciled = OperationTransition.objects.filter(
        operation__in=ops, actor=OperationTransition.Actor.RECONCILER, to_status=Operation.Status.SUCCEEDED
    )
    assert reconciled.filter(operation__tool="create_refund").exists()
    for transition in reconciled:
        assert transition.operation.last_reconcile["value"] == "succeeded"
    person = ops.filter(status=Operation.Status.UNKNOWN, needs_person=True)
    assert person.exists()
    assert all(
        op.tool != "create_refund" or op.last_reconcile.get("value") == "processing" for op in person
    ), [(op.tool, op.last_reconcile) for op in person]
