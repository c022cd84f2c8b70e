"""examples/agent_loop.py against a live server: the scripted loop is stopped, the refund runs once."""

from __future__ import annotations

import importlib.util
from io import StringIO
from pathlib import Path

import pytest

from ingest.models import Operation, Run

pytestmark = pytest.mark.django_db(transaction=True)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"


def test_the_example_agent_is_handed_to_a_person_and_refunds_once(live_server, tenant, make_key):
    spec = importlib.util.spec_from_file_location("agent_loop", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = StringIO()
    report = example.main(live_server.url, make_key(tenant, scopes=("ingest", "ledger")), out=out)
    text = out.getvalue()
    assert report["outcome"] == "handoff", text
    assert report["executed"] == ["get_order", "refund", "search_orders", "search_orders"], text
    assert "-> ledger execute, ran" in text and "-> ledger reuse, not run" in text
    assert text.count("-> reuse, not run") == 2 and "-> handoff:" in text
    assert report["tracer"]["dropped"] == 0
    run = Run.objects.get(run_id=report["run_id"])
    assert run.status == Run.Status.WAITING and run.handoff["kind"] == "exact_repeat"
    assert Operation.objects.get(tenant=tenant).attempts == 1
