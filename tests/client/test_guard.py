"""Guard decorators against a live server over real HTTP: each decision, writes once, loopwatch down."""

from __future__ import annotations

import pytest

from ingest.models import Event, Operation, Run
from loopwatch_client import (
    Guard,
    HandoffRequested,
    LedgerClient,
    LedgerUnavailable,
    LoopDetected,
    RunTerminated,
    Tracer,
)

pytestmark = pytest.mark.django_db(transaction=True)


class ToolError(Exception):
    def __init__(self, message: str, error_class: str) -> None:
        super().__init__(message)
        self.error_class = error_class


@pytest.fixture
def key(tenant, make_key) -> str:
    return make_key(tenant, scopes=("ingest", "ledger"))


@pytest.fixture
def guard(live_server, key):
    tracer = Tracer(live_server.url, key, flush_interval=0.05)
    guard = Guard(
        live_server.url, key, tracer=tracer, ledger=LedgerClient(live_server.url, key, worker_id="agent-1")
    )
    yield guard
    tracer.close()


@pytest.fixture
def tools(guard):
    """Tools that count how often they really ran."""
    ran: dict[str, int] = {}

    @guard.tool(kind="read")
    def search_orders(customer: str, status: str = "open") -> dict:
        ran["search_orders"] = ran.get("search_orders", 0) + 1
        return {"orders": [{"id": "o1", "customer": customer, "status": status}]}

    @guard.tool(kind="read")
    def get_order(order_id: str) -> dict:
        ran["get_order"] = ran.get("get_order", 0) + 1
        raise ToolError(f"no field order_id={order_id!r}", "invalid_argument")

    @guard.tool(kind="read", name="lookup")
    def lookup(n: int) -> dict:
        ran["lookup"] = ran.get("lookup", 0) + 1
        return {"n": n}

    @guard.tool(kind="write", key="order-{order}:refund")
    def refund(order: str, amount: int, idempotency_key: str | None = None) -> dict:
        ran["refund"] = ran.get("refund", 0) + 1
        return {"refund": f"re_{order}", "amount": amount, "key": idempotency_key}

    return ran, search_orders, get_order, lookup, refund


def test_an_allowed_read_runs_and_is_traced(guard, tools, tenant):
    ran, search_orders, *_ = tools
    with guard.run("r1", agent="shop") as run:
        run.model_round(input_tokens=100, output_tokens=10)
        assert search_orders("42") == {"orders": [{"id": "o1", "customer": "42", "status": "open"}]}
    assert ran == {"search_orders": 1}
    assert guard.tracer.flush(timeout=10)
    kinds = list(Event.objects.filter(run__run_id="r1").order_by("seq").values_list("type", flat=True))
    assert kinds == ["run_started", "model_round", "tool_call", "tool_result", "run_finished"]
    call = Event.objects.get(run__run_id="r1", type="tool_call").body
    assert (call["tool"], call["kind"], call["args"], call["round"]) == (
        "search_orders",
        "read",
        {"customer": "42"},
        1,
    )
    assert guard.stats["allow"] == 1 and Run.objects.get(run_id="r1").status == Run.Status.SUCCEEDED


def test_an_unchanged_read_is_given_back_without_running_again(guard, tools):
    ran, search_orders, *_ = tools
    with guard.run("r1"):
        results = [search_orders("42") for _ in range(3)]
    assert ran == {"search_orders": 2}  # the third came from loopwatch
    assert results[0] == results[1] == results[2]
    assert guard.stats["reuse"] == 1
    assert guard.tracer.flush(timeout=10)
    reused = Event.objects.filter(run__run_id="r1", type="tool_result").order_by("seq").last().body
    assert reused["result"] == results[0] and reused["reused_from"]


def test_a_repeated_error_is_corrected_with_loop_detected(guard, tools):
    ran, _, get_order, *_ = tools
    with guard.run("r1") as run:
        for _ in range(2):
            run.model_round()
            with pytest.raises(ToolError):
                get_order("o1")
        run.model_round()
        with pytest.raises(LoopDetected) as stop:
            get_order("o1")
    assert ran == {"get_order": 2}
    assert stop.value.decision == "correct" and type(stop.value) is LoopDetected
    assert "failed 2 times with the same invalid_argument error" in stop.value.hint
    assert [d["kind"] for d in stop.value.detections] == ["repeated_error"]


def test_a_run_over_its_budget_is_terminated_with_the_diagnosis(guard, tools):
    ran, _, _, lookup, _ = tools
    with pytest.raises(RunTerminated) as stop, guard.run("r1", budgets={"max_tool_calls": 3}) as run:
        for n in range(10):
            run.model_round()
            lookup(n)
    assert ran == {"lookup": 2}
    diagnosis = stop.value.diagnosis
    assert (
        diagnosis["terminated_by"],
        diagnosis["budget_type"],
        diagnosis["limit"],
        diagnosis["consumed"],
    ) == (
        "budget",
        "max_tool_calls",
        3,
        3,
    )
    assert guard.tracer.flush(timeout=10)
    run = Run.objects.get(run_id="r1")
    assert (run.status, run.terminated_by, run.budget_type) == ("truncated", "budget", "max_tool_calls")


def test_a_handoff_raises_and_the_run_waits_for_a_person(guard, tools):
    ran, _, get_order, *_ = tools
    with pytest.raises(HandoffRequested) as stop, guard.run("r1") as run:
        for _ in range(10):
            run.model_round()
            try:
                get_order("o1")
            except ToolError:
                pass
            except LoopDetected as correction:
                if correction.decision == "handoff":
                    raise
                # a correction is a hint: this agent ignores it and tries again
    # failed, failed, corrected (not run), failed, failed: a person is asked before a 5th run
    assert ran == {"get_order": 4}
    assert stop.value.handoff["kind"] == "repeated_error" and stop.value.handoff["count"] == 4
    assert Run.objects.get(run_id="r1").status == Run.Status.WAITING


def test_a_write_runs_once_through_the_ledger(guard, tools, tenant):
    ran, *_, refund = tools
    with guard.run("r1"):
        first = refund("42", 10)
        again = refund("42", 10)
    assert ran == {"refund": 1}
    assert first == again == {"refund": "re_42", "amount": 10, "key": "order-42:refund"}
    op = Operation.objects.get(tenant=tenant)
    assert (op.operation_key, op.status, op.attempts, op.lease_owner) == (
        "order-42:refund",
        "SUCCEEDED",
        1,
        "agent-1",
    )
    assert guard.tracer.flush(timeout=10)
    calls = [e.body for e in Event.objects.filter(run__run_id="r1", type="tool_call")]
    assert [(c["kind"], c["operation_key"]) for c in calls] == [
        ("write", "order-42:refund")
    ]  # only the one that ran
    op.refresh_from_db()
    assert op.executions == 1  # the trace saw it execute once: no duplicate side effect


def test_loopwatch_down_reads_run_unchecked_and_writes_refuse(down_url, caplog):
    tracer = Tracer(down_url, "lw_x", flush_interval=0.05, timeout=0.5)
    guard = Guard(down_url, "lw_x", tracer=tracer, timeout=0.5)
    ran = []

    @guard.tool(kind="read")
    def search(q: str) -> str:
        ran.append(q)
        return q.upper()

    @guard.tool(kind="write", key="k-{q}")
    def write(q: str) -> str:
        ran.append(f"write {q}")
        return q

    with guard.run("r1"):
        assert [search("a"), search("b")] == ["A", "B"]
        with pytest.raises(LedgerUnavailable):
            write("c")
    assert ran == ["a", "b"]
    assert guard.stats["unavailable"] == 2
    assert any("running it unchecked" in r.getMessage() for r in caplog.records)
    tracer.close(timeout=0.2)


def test_a_tool_called_outside_a_run_just_runs(guard, tools):
    ran, search_orders, *_ = tools
    assert search_orders("7")["orders"][0]["customer"] == "7"
    assert ran == {"search_orders": 1} and guard.stats["unguarded"] == 1 and guard.stats["checks"] == 0


def test_arguments_that_are_not_json_run_unchecked_for_a_read(guard):
    @guard.tool(kind="read")
    def measure(x: float) -> float:
        return x

    with guard.run("r1"):
        assert measure(float("nan")) != measure(float("nan"))  # nan: ran, unchecked
    assert guard.stats["unavailable"] == 2 and guard.stats["checks"] == 0


def test_loop_detected_reads_as_a_sentence_and_keeps_the_exceptions_args():
    from loopwatch_client import Decision

    stop = LoopDetected(
        Decision("correct", hint="You asked this twice: use the result."),
        tool="search_orders",
        args={"customer": "42", "status": "open"},
    )
    assert str(stop) == "search_orders: correct: You asked this twice: use the result."
    assert stop.args == (str(stop),)
    assert stop.tool_args == {"customer": "42", "status": "open"}
    assert (
        RunTerminated(Decision("terminate", hint="over budget"), tool="t", args={})
        .args[0]
        .endswith("over budget")
    )
