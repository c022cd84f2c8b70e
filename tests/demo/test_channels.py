"""The demo's other ways in, without a server: a generated run as OTLP spans, the guarded agents'
script of a run, and the payment service's answers. No database."""

from __future__ import annotations

import random
import urllib.error
import urllib.request
from datetime import UTC, datetime

import orjson
import pytest

from demo.downstream import PaymentService, refund_status
from demo.guarded import script_of
from demo.otlp import export_body, otlp_run, span_stamp
from demo.simulation import SCENARIOS_BY_NAME, SimRun

START = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def _run(name: str, seed: int) -> SimRun:
    events = SCENARIOS_BY_NAME[name].fn(random.Random(seed), START)
    return SimRun(scenario=name, run_id=events[0]["run_id"], events=events)


@pytest.mark.parametrize("name", ["normal", "loop_same_error", "write_timeout", "legit_transient_retry"])
def test_a_run_becomes_one_trace_of_spans_in_start_order_with_the_root_last(name):
    for seed in range(10):
        sim = _run(name, seed)
        run = otlp_run(sim)
        calls = [e for e in sim.events if e["type"] == "tool_call"]
        rounds = [e for e in sim.events if e["type"] == "model_round"]
        assert len(run.spans) == len(calls) + len(rounds) + 1
        now = 1_800_000_000_000_000_000
        stamped = [span_stamp(run, span, now + i) for i, span in enumerate(run.spans)]
        root = stamped[-1]
        assert "parentSpanId" not in root and root["name"].startswith("invoke_agent ")
        children = stamped[:-1]
        assert {s["parentSpanId"] for s in children} == {root["spanId"]}
        starts = [int(s["startTimeUnixNano"]) for s in children]
        assert starts == sorted(starts) and len(set(starts)) == len(starts)
        assert int(root["startTimeUnixNano"]) < starts[0]
        assert all(int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]) for s in stamped)
        tools = [s for s in children if s["name"].startswith("execute_tool ")]
        assert [s["name"].removeprefix("execute_tool ") for s in tools] == [c["tool"] for c in calls]
        assert otlp_run(sim).spans == run.spans  # the same run, the same spans and ids


def test_failed_calls_carry_the_status_and_exception_the_server_reads():
    sim = _run("write_timeout", 1)
    run = otlp_run(sim)
    stamped = [span_stamp(run, span, 1_800_000_000_000_000_000) for span in run.spans]
    timeouts = [
        s for s in stamped if s.get("status", {}).get("code") == 2 and s["name"].startswith("execute_tool")
    ]
    assert timeouts, "the write that timed out"
    kinds = {a["key"]: a["value"] for a in timeouts[0]["events"][0]["attributes"]}
    assert kinds["exception.type"] == {"stringValue": "TimeoutError"}
    errors = _run("loop_same_error", 2)
    run = otlp_run(errors)
    failed = [s for s in run.spans if s.error]
    assert failed and all(s.attributes["loopwatch.error_class"] == "invalid_argument" for s in failed)


def test_an_export_groups_spans_by_agent():
    first, second = otlp_run(_run("normal", 1)), otlp_run(_run("normal", 2))
    body = export_body([(r, span_stamp(r, r.spans[0], 10**18)) for r in (first, second, first)])
    services = [rs["resource"]["attributes"][0]["value"]["stringValue"] for rs in body["resourceSpans"]]
    assert sorted(services) == sorted({first.service, second.service})
    assert sum(len(rs["scopeSpans"][0]["spans"]) for rs in body["resourceSpans"]) == 3
    orjson.dumps(body)  # JSON all through


def test_the_guarded_script_pairs_each_call_with_its_result():
    for name in ("legit_transient_retry", "normal", "loop_exact_repeat"):
        for seed in range(10):
            sim = _run(name, seed)
            steps = script_of(sim)
            calls = [s for s in steps if s[0] == "call"]
            assert all(
                result is not None and result["call_id"] == call["call_id"] for _, call, result in calls
            )
            assert len(calls) == sum(e["type"] == "tool_call" for e in sim.events)
            assert steps[-1][0] == "finish"


def test_the_payment_service_answers_each_key_the_same_way():
    keys = [f"refund:ORD-{n}:full" for n in range(400)]
    answers = [refund_status(k) for k in keys]
    assert answers == [refund_status(k) for k in keys]
    done = sum(1 for status, body in answers if status == 200 and body["status"] == "succeeded")
    missing = sum(1 for status, _ in answers if status == 404)
    assert 0.5 < done / 400 < 0.7 and 0.1 < missing / 400 < 0.3
    service = PaymentService(0)
    try:
        key = next(k for k, (status, _) in zip(keys, answers, strict=True) if status == 200)
        with urllib.request.urlopen(f"{service.url}/refunds/{key}", timeout=5) as response:
            assert orjson.loads(response.read()) == refund_status(key)[1]
        missing_key = next(k for k, (status, _) in zip(keys, answers, strict=True) if status == 404)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{service.url}/refunds/{missing_key}", timeout=5)
        assert refused.value.code == 404
    finally:
        service.close()
