"""The guard: POST /api/v1/runs/{run_id}/check decides before a tool runs, with the pipeline's engine."""

from __future__ import annotations

import orjson
import pytest
from django.conf import settings

from ingest.guard import config_cache_clear
from ingest.models import Detection, Operation, Run, RunCursor
from ingest.services import events_ingest, run_process
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result, ts

pytestmark = pytest.mark.django_db


def check_url(run_id: str = "r1") -> str:
    return f"/api/v1/runs/{run_id}/check"


@pytest.fixture(autouse=True)
def fresh_config():
    """The guard keeps thresholds and tools a few seconds per process: each test reads its own."""
    config_cache_clear()


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant, scopes=("ingest", "ledger"))


@pytest.fixture
def store(tenant):
    """Store events as ingest does, without processing them (no Celery: the check must catch up)."""

    def store(events: list[dict]) -> None:
        result = events_ingest(
            tenant=tenant, events=events, max_event_bytes=settings.LOOPWATCH_MAX_EVENT_BYTES
        )
        assert result.count("accepted") == len(events), result.verdicts

    return store


@pytest.fixture
def check(api, key):
    def check(body: dict, run_id: str = "r1", *, api_key: str | None = None, status: int = 200) -> dict:
        response = api.post(check_url(run_id), body, api_key or key)
        assert response.status_code == status, response.content
        return response.json()

    return check


def call(n: int, *, tool: str = "search_orders", args: dict | None = None, **fields) -> dict:
    """A check body for the call of round n."""
    return {
        "tool": tool,
        "kind": "read",
        "args": args or {"customer": "42"},
        "round": n,
        "ts": ts(n),
        **fields,
    }


def ran(
    n: int, *, tool: str = "search_orders", args: dict | None = None, result=None, **result_fields
) -> list:
    """The events of round n's call as a runtime sends them after running it."""
    return [
        model_round(n=n),
        tool_call(call_id=f"c{n}", n=n, tool=tool, args=args or {"customer": "42"}),
        tool_result(
            call_id=f"c{n}", n=n, result={"orders": []} if result is None else result, **result_fields
        ),
    ]


def actions(answer: dict) -> list[tuple[str, str]]:
    return [(d["kind"], d["action"]) for d in answer["detections"]]


# --- decisions -------------------------------------------------------------------------------------


def test_a_run_not_known_yet_is_allowed_and_says_so(check):
    answer = check(call(1), "never-seen")
    assert answer["decision"] == "allow" and answer["run_known"] is False
    assert not Run.objects.exists()  # asking does not create the run


def test_require_run_makes_a_run_not_known_a_404(check):
    answer = check({**call(1), "require_run": True}, "never-seen", status=404)
    assert answer == {
        "error": "not_found",
        "detail": "run_id: no run 'never-seen' for this API key's tenant",
        "field": "run_id",
    }


def test_the_check_processes_the_events_celery_has_not_seen_yet(check, store):
    store([run_started(), *ran(1), *ran(2)])
    assert RunCursor.objects.get().position == 0
    answer = check(call(3, ts="2026-11-29T10:00:03Z"))
    assert RunCursor.objects.get().position == 7
    assert Detection.objects.filter(kind="exact_repeat", action="observe").exists()  # the pipeline's own work
    assert answer["run_known"] is True and answer["decision"] == "reuse"


def test_a_first_call_is_allowed(check, store):
    store([run_started()])
    answer = check(call(1))
    assert answer == {
        "decision": "allow",
        "run_known": True,
        "kind": "read",
        "kind_from": "event",
        "hint": "",
        "detections": [],
    }


def test_an_identical_read_whose_result_has_not_changed_is_reused(check, store):
    store([run_started(), *ran(1, result={"orders": [7]}), *ran(2, result={"orders": [7]})])
    answer = check(call(3))
    assert answer["decision"] == "reuse"
    assert answer["reuse"]["result"] == {"orders": [7]} and answer["reuse"]["call_id"] == "c2"
    assert ("exact_repeat", "correct") in actions(answer)  # the engine's finding comes along
    assert "search_orders 3 times" in answer["hint"]


def test_a_read_is_not_reused_after_a_write(check, store):
    write = [
        tool_call(
            call_id="w", n=3, tool="update_ticket", kind="write", args={"id": "t1"}, operation_key="t1:close"
        ),
        tool_result(call_id="w", n=3, result={"ok": True}),
    ]
    store([run_started(), *ran(1), *ran(2), *write])
    answer = check(call(4))
    # The write changed the world: the same read asks a new question (neither reused nor corrected).
    assert answer["decision"] == "allow" and "reuse" not in answer
    assert actions(answer) == []


def test_a_read_whose_result_changed_or_was_cut_is_not_reused(check, store):
    store([run_started(), *ran(1, result={"n": 1}), *ran(2, result={"n": 2})])
    assert check(call(3))["decision"] == "allow"
    cut = {"result_truncated": True, "result_sha256": "a" * 64}
    store([run_started("r2"), *[{**e, "run_id": "r2"} for e in ran(1, **cut) + ran(2, **cut)]])
    answer = check(call(3), "r2")
    assert answer["decision"] == "correct" and actions(answer) == [("exact_repeat", "correct")]


def test_a_result_older_than_the_reuse_age_is_not_reused(check, store):
    store([run_started(), *ran(1), *ran(2)])
    assert check({**call(3), "ts": "2026-11-29T11:00:00Z"})["decision"] == "correct"


def test_a_repeated_error_corrects_the_next_call_of_that_tool_once(check, store):
    bad = {"status": "error", "error_class": "invalid_argument", "result": "no such field: custmer"}
    store([run_started(), *ran(1, **bad), *ran(2, **bad)])
    other = check(call(3, tool="get_order", args={"id": "o1"}))
    assert other["decision"] == "allow"
    answer = check(call(3))
    assert answer["decision"] == "correct" and actions(answer) == [("repeated_error", "correct")]
    assert "failed 2 times with the same invalid_argument error" in answer["hint"]
    # The runtime traces the call it did not run (without a result): the correction was given.
    store([model_round(n=3), tool_call(call_id="c3", n=3, guard="correct")])
    assert check(call(4))["decision"] == "allow"


def test_an_oscillation_is_corrected_before_the_call(check, store):
    # Tools of kind `other`: their results are never given back as reusable (side effects unknown).
    events = [run_started()]
    for n in range(1, 6):
        tool = "get_order" if n % 2 else "get_customer"
        events += ran(n, tool=tool, kind="other", args={"id": "o1"}, result={"same": True})
    store(events)
    answer = check(call(6, tool="get_customer", kind="other", args={"id": "o1"}))
    assert answer["decision"] == "correct" and actions(answer) == [("oscillation", "correct")]
    assert "alternating" in answer["hint"]


def test_a_handoff_marks_the_run_waiting_with_what_was_tried(check, store, tenant):
    bad = {"status": "error", "error_class": "not_found", "result": "no order o9"}
    store([run_started(), *[e for n in range(1, 5) for e in ran(n, args={"id": "o9"}, **bad)]])
    answer = check(call(5, args={"id": "o9"}))
    assert answer["decision"] == "handoff"
    run = Run.objects.get(tenant=tenant)
    assert run.status == Run.Status.WAITING and run.handoff == answer["handoff"]
    summary = answer["handoff"]
    assert summary["kind"] == "repeated_error" and summary["count"] == 4 and summary["by"] == "guard"
    assert [t["args"] for t in summary["tried"]] == [{"id": "o9"}] * 4
    assert {t["status"] for t in summary["tried"]} == {"error"}
    assert summary["proposed"]["args"] == {"id": "o9"}
    # Until a person lets it go on, every call is answered the same, whatever it is.
    again = check(call(5, tool="get_order", args={"id": "o1"}))
    assert again["decision"] == "handoff" and again["handoff"] == summary


def test_a_budget_run_out_terminates_with_the_diagnosis(check, store):
    store([run_started(budgets={"max_tool_calls": 3}), *ran(1, args={"a": 1}), *ran(2, args={"a": 2})])
    answer = check(call(3, args={"a": 3}))
    assert answer["decision"] == "terminate"
    diagnosis = answer["diagnosis"]
    assert {k: diagnosis[k] for k in ("terminated_by", "budget_type", "limit", "consumed")} == {
        "terminated_by": "budget",
        "budget_type": "max_tool_calls",
        "limit": 3,
        "consumed": 3,
    }
    assert "last_progress_step" in diagnosis and diagnosis["hint"].startswith(
        "Budget max_tool_calls exhausted"
    )
    # The call counts when it arrives; from then on every check is answered terminate.
    store([tool_call(call_id="c3", n=3, args={"a": 3}, guard="terminate")])
    later = check(call(4, args={"a": 4}))
    assert later["decision"] == "terminate" and later["diagnosis"]["budget_type"] == "max_tool_calls"


def test_a_finished_run_terminates(check, store):
    store([run_started(), *ran(1), run_finished(status="succeeded")])
    answer = check(call(2, args={"other": 1}))
    assert answer["decision"] == "terminate"
    assert answer["diagnosis"]["status"] == "succeeded"


# --- writes: the ledger decides --------------------------------------------------------------------


def write(n: int = 1, **fields) -> dict:
    body = {
        "tool": "refund",
        "kind": "write",
        "args": {"order": "42", "amount": 10},
        "round": n,
        "ts": ts(n),  # the events' clock: without it the check is "now", hours after run_started
        "operation_key": "order-42:refund",
        "worker_id": "w1",
        "lease_s": 30,
    }
    return {**body, **fields}


def test_a_write_is_claimed_then_reused_then_its_result_given_back(check, store, api, key):
    store([run_started()])
    first = check(write())
    assert first["decision"] == "execute" and first["ledger"]["lease"]["owner"] == "w1"
    assert check(write(worker_id="w2"))["decision"] == "wait"
    response = api.post(
        "/api/v1/operations/order-42:refund/complete",
        {"worker_id": "w1", "outcome": "succeeded", "result": {"refund": "re_1"}},
        key,
    )
    assert response.status_code == 200
    again = check(write(2, worker_id="w2"))
    assert again["decision"] == "reuse" and again["ledger"]["result"] == {"refund": "re_1"}
    assert Operation.objects.get().attempts == 1


def test_a_write_of_a_run_not_known_still_goes_through_the_ledger(check):
    answer = check(write(), "new-run")
    assert answer["run_known"] is False and answer["decision"] == "execute"


def test_a_write_that_timed_out_is_reconciled_not_executed(check, api, key):
    check(write())
    api.post("/api/v1/operations/order-42:refund/complete", {"worker_id": "w1", "outcome": "timeout"}, key)
    answer = check(write(worker_id="w2"))
    assert answer["decision"] == "reconcile" and answer["ledger"]["status"] == "UNKNOWN"


def test_a_write_that_failed_for_good_is_not_executed_again(check, api, key):
    check(write())
    api.post(
        "/api/v1/operations/order-42:refund/complete",
        {
            "worker_id": "w1",
            "outcome": "failed",
            "error_class": "invalid_argument",
            "result": "no such order",
        },
        key,
    )
    answer = check(write(worker_id="w2"))
    assert answer["decision"] == "failed"
    assert answer["ledger"]["error"]["error_class"] == "invalid_argument"


def test_a_write_with_other_arguments_is_a_conflict(check):
    check(write())
    answer = check(write(args={"order": "42", "amount": 99}))
    assert answer["decision"] == "conflict"
    assert answer["hint"].startswith("args: operation order-42:refund was claimed with other arguments")


def test_the_check_and_the_ledger_api_give_the_same_answer_to_the_same_claim(check, api, key):
    """One answer to a claim (ClaimAnswer.as_dict): the guard's `ledger` is the ledger API's body, for
    every decision that leaves the operation as it is (the API's conflict wraps it in its error shape)."""

    def claim(args: dict, worker_id: str) -> tuple[int, dict]:
        body = {"operation_key": "order-42:refund", "tool": "refund", "args": args, "worker_id": worker_id}
        response = api.post("/api/v1/operations/claim", {**body, "lease_s": 30}, key)
        return response.status_code, response.json()

    def both(worker_id: str, args: dict | None = None) -> tuple[dict, int, dict]:
        args = args or {"order": "42", "amount": 10}
        ledger = check(write(args=args, worker_id=worker_id))["ledger"]
        status, body = claim(args, worker_id)
        return ledger, status, body

    check(write())  # w1 holds the lease
    ledger, status, body = both("w2")
    assert (ledger["decision"], status) == ("wait", 409)
    assert 0 < body.pop("retry_after") <= ledger.pop("retry_after") <= 30  # the lease's rest, asked later
    assert ledger == body
    ledger, status, body = both("w2", {"order": "42", "amount": 99})
    assert ledger["decision"] == "conflict" and status == 422
    assert {k: v for k, v in ledger.items() if k not in ("decision", "operation_key", "status")} == {
        k: v for k, v in body.items() if k not in ("error", "field")
    }
    api.post(
        "/api/v1/operations/order-42:refund/complete",
        {"worker_id": "w1", "outcome": "succeeded", "result": {"refund": "re_1"}},
        key,
    )
    ledger, status, body = both("w3")
    assert (ledger["decision"], status) == ("reuse", 200)
    assert ledger == body and body["result"] == {"refund": "re_1"}


def test_a_write_by_step_id_claims_sha256_of_run_id_and_step_id(check):
    import hashlib

    body = write(step_id="s1")
    del body["operation_key"]
    answer = check(body, "r9")
    assert answer["decision"] == "execute"
    assert answer["ledger"]["operation_key"] == hashlib.sha256(b"r9:s1").hexdigest()


def test_a_write_stopped_by_the_engine_is_not_claimed(check, store):
    store([run_started(budgets={"max_tool_calls": 1}), *ran(1)])
    answer = check(write(2))
    assert answer["decision"] == "terminate" and "ledger" not in answer
    assert not Operation.objects.exists()


def test_the_tool_registry_makes_a_call_a_write(check, tenant):
    from ingest.models import ToolConfig

    ToolConfig.objects.create(tenant=tenant, name="refund", kind="write")
    body = write()
    del body["kind"], body["worker_id"]
    answer = check(body, status=400)
    assert answer["field"] == "worker_id"
    assert check({**body, "worker_id": "w1"})["decision"] == "execute"


# --- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"args": {}}, "tool", "is required"),
        ({"tool": "t"}, "args", "is required"),
        ({"tool": "t", "args": []}, "args", "must be an object, not an array"),
        ({"tool": "", "args": {}}, "tool", "must not be empty"),
        ({"tool": "t" * 201, "args": {}}, "tool", "must be at most 200 characters"),
        ({"tool": "t", "args": {}, "kind": "delete"}, "kind", "must be one of read, write, poll, other"),
        ({"tool": "t", "args": {}, "round": 0}, "round", "must be at least 1"),
        ({"tool": "t", "args": {}, "round": "2"}, "round", "must be an integer"),
        ({"tool": "t", "args": {}, "ts": "yesterday"}, "ts", "must be an RFC 3339 timestamp"),
        ({"tool": "t", "args": {}, "lease_s": 0}, "lease_s", "must be a number of seconds from 1"),
        ({"tool": "t", "args": {}, "require_run": "yes"}, "require_run", "must be true or false"),
        ({"tool": "t", "args": {}, "arg": {}}, "arg", "is not a field of a check"),
        ({"tool": "t", "args": {"q": "a\u0000b"}}, "args.q", "must not contain the character U+0000"),
        ({"tool": "t", "args": {}, "kind": "write", "worker_id": "w"}, "operation_key", "a write needs"),
        ({"tool": "t", "args": {}, "kind": "write", "step_id": "s"}, "worker_id", "a write needs"),
    ],
)
def test_a_bad_call_is_a_400_naming_the_field(check, body, field, reason):
    answer = check(body, status=400)
    assert answer["field"] == field
    assert answer["detail"].startswith(f"{field}: {reason}"), answer["detail"]


@pytest.mark.parametrize(
    ("raw", "field"), [(b"{not json", "body"), (b"[1, 2]", "body"), (b"", "body"), (b'"text"', "body")]
)
def test_a_body_that_is_not_an_object_is_a_400(api, key, raw, field):
    response = api.post(check_url(), raw, key)
    assert response.status_code == 400 and response.json()["field"] == field


def test_a_body_over_the_limit_is_a_413(api, key, settings):
    settings.LOOPWATCH_MAX_EVENT_BYTES = 2048
    response = api.post(check_url(), {"tool": "t", "args": {"q": "x" * 3000}}, key)
    assert response.status_code == 413 and response.json()["field"] == "body"


def test_keys_without_the_scope_or_no_key_are_refused(api, tenant, make_key):
    body = call(1)
    assert api.post(check_url(), body, None).status_code == 401
    assert api.post(check_url(), body, "lw_unknown").status_code == 401
    read_only = make_key(tenant, scopes=("read",))
    response = api.post(check_url(), body, read_only)
    assert response.status_code == 403 and "'ingest' scope" in response.json()["detail"]
    ingest_only = make_key(tenant, scopes=("ingest",))
    assert api.post(check_url(), body, ingest_only).status_code == 200
    response = api.post(check_url(), write(), ingest_only)
    assert response.status_code == 403 and response.json()["field"] == "Authorization"
    assert not Operation.objects.exists()


def test_another_tenants_run_is_a_run_not_known(check, store, other_tenant, make_key):
    bad = {"status": "error", "error_class": "not_found", "result": "no order o9"}
    store([run_started(), *[e for n in range(1, 5) for e in ran(n, args={"id": "o9"}, **bad)]])
    theirs = make_key(other_tenant, scopes=("ingest", "ledger"))
    answer = check(call(5, args={"id": "o9"}), api_key=theirs)
    assert answer == {
        "decision": "allow",
        "run_known": False,
        "kind": "read",
        "kind_from": "event",
        "hint": "",
        "detections": [],
    }
    strict = check({**call(5, args={"id": "o9"}), "require_run": True}, api_key=theirs, status=404)
    assert strict["field"] == "run_id"
    run = Run.objects.get(run_id="r1")
    assert run.status == Run.Status.RUNNING and run.handoff is None
    assert RunCursor.objects.get(run=run).position == 0  # not even processed on their behalf


# --- the check agrees with the pipeline ------------------------------------------------------------


def test_what_the_check_says_is_what_the_pipeline_records_for_the_same_calls(check, store, tenant):
    """A scripted run driven as the client drives it: check, then trace the call (with its result
    when it ran or was reused, without one when it was stopped). What the check found for each
    proposed call is what the pipeline stores at that call's tool_call event."""
    store([run_started(budgets={"max_tool_calls": 14})])
    order, customer = {"id": "o1", "status": "open"}, {"name": "Ann"}
    script = [
        ("search_orders", "read", {"customer": "42"}, {"orders": []}),
        ("search_orders", "read", {"customer": "42"}, {"orders": []}),
        ("search_orders", "read", {"customer": "42"}, {"orders": []}),  # reused
        ("get_order", "other", {"id": "o1"}, order),
        ("get_customer", "other", {"id": "o1"}, customer),
        ("get_order", "other", {"id": "o1"}, order),
        ("get_customer", "other", {"id": "o1"}, customer),
        ("get_order", "other", {"id": "o1"}, order),
        ("get_customer", "other", {"id": "o1"}, customer),  # oscillation: corrected, not run
        ("get_order", "other", {"id": "o1"}, order),
        ("get_customer", "other", {"id": "o1"}, customer),
        ("search_orders", "read", {"customer": "42"}, {"orders": []}),
        ("search_orders", "read", {"customer": "42"}, {"orders": []}),
        ("search_orders", "read", {"customer": "42"}, {"orders": []}),
        ("search_orders", "read", {"customer": "42"}, {"orders": []}),
    ]
    decisions, said = [], {}
    for n, (tool, kind, args, result) in enumerate(script, start=1):
        answer = check(call(n, tool=tool, kind=kind, args=args))
        decisions.append(answer["decision"])
        # What the proposed call itself causes (pending interventions are older events' findings).
        said[n] = sorted((d["kind"], d["action"]) for d in answer["detections"] if d["at_call"] == n)
        events = [model_round(n=n), tool_call(call_id=f"c{n}", n=n, tool=tool, kind=kind, args=args)]
        if answer["decision"] in ("allow", "reuse"):
            given = answer["reuse"]["result"] if answer["decision"] == "reuse" else result
            events.append(tool_result(call_id=f"c{n}", n=n, result=given))
        store(events)
        if answer["decision"] in ("handoff", "terminate"):
            break
    run = Run.objects.get(tenant=tenant)
    run_process(run_pk=run.pk)
    recorded: dict[int, list] = {}
    for d in Detection.objects.filter(run=run).exclude(at_call=0):
        call_seq = run.calls.get(call_id=f"c{d.at_call}").seq
        if d.seq == call_seq:
            recorded.setdefault(d.at_call, []).append((d.kind, d.action))
    assert {n: sorted(v) for n, v in recorded.items()} == {n: v for n, v in said.items() if v}
    # An exact repeat reused, an oscillation corrected once (then the engine waits for more
    # evidence), the repeat again: reused, then handed to a person.
    assert decisions == [
        *("allow", "allow", "reuse", "allow", "allow", "allow", "allow", "allow", "correct"),
        *("allow", "allow", "reuse", "handoff"),
    ]
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING
    assert "correct" in decisions and decisions[-1] in ("handoff", "terminate")


def _handed_off(check, store) -> None:
    bad = {"status": "error", "error_class": "not_found", "result": "no order o9"}
    store([run_started(), *[e for n in range(1, 5) for e in ran(n, args={"id": "o9"}, **bad)]])
    assert check(call(5, args={"id": "o9"}))["decision"] == "handoff"
    store([tool_call(call_id="c5", n=5, args={"id": "o9"}, guard="handoff")])  # as the client traces it


def test_a_person_lets_a_waiting_run_go_on_and_the_escalation_carries_on(check, store, tenant):
    from ingest.guard import run_handoff_resolve

    _handed_off(check, store)
    run = Run.objects.get(tenant=tenant)
    assert run_handoff_resolve(run=run, resume=True, by="ann", note="the order exists now") is True
    assert run_handoff_resolve(run=run, resume=True, by="bob") is False  # answered already
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.handoff["resolved"]["by"] == "ann"
    assert check(call(6, tool="get_order", args={"id": "o1"}))["decision"] == "allow"
    bad = {"status": "error", "error_class": "not_found", "result": "no order o9"}
    store([*ran(6, args={"id": "o9"}, **bad), *ran(7, args={"id": "o9"}, **bad)])  # a 5th and 6th failure
    answer = check(call(8, tool="get_order", args={"id": "o1"}))
    assert answer["decision"] == "terminate" and answer["diagnosis"]["kind"] == "repeated_error"


def test_a_person_stops_a_waiting_run(check, store, tenant):
    from ingest.guard import run_handoff_resolve

    _handed_off(check, store)
    assert run_handoff_resolve(run=Run.objects.get(tenant=tenant), resume=False, by="ann") is True
    run = Run.objects.get(tenant=tenant)
    assert (run.status, run.terminated_by, run.reason) == ("abandoned", "user", "stopped by ann")
    answer = check(call(6, tool="get_order", args={"id": "o1"}))
    assert answer["decision"] == "terminate" and answer["diagnosis"]["terminated_by"] == "user"


def test_a_resumed_run_is_not_handed_off_again_by_the_detection_already_answered(check, store, tenant):
    from ingest.guard import run_handoff_resolve

    bad = {"status": "error", "error_class": "not_found", "result": "no order o9"}
    store([run_started(), *[e for n in range(1, 5) for e in ran(n, args={"id": "o9"}, **bad)]])
    assert check(call(5, args={"id": "o9"}))["decision"] == "handoff"
    # The runtime did not trace the refused call: the handoff detection is still after the last call.
    run = Run.objects.get(tenant=tenant)
    assert run_handoff_resolve(run=run, resume=True, by="ann", note="fixed") is True
    assert Run.objects.get(pk=run.pk).handoff["resolved"]["seq"] == run.events_count
    assert check(call(5, tool="get_order", args={"id": "o1"}))["decision"] == "allow"
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING


def test_an_answer_names_the_handoff_it_was_shown(check, store, tenant):
    from ingest.guard import run_handoff_resolve

    _handed_off(check, store)
    run = Run.objects.get(tenant=tenant)
    assert (
        run_handoff_resolve(run=run, resume=False, by="ann", expected_at="2000-01-01T00:00:00+00:00") is False
    )
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING
    assert run_handoff_resolve(run=run, resume=False, by="ann", expected_at=run.handoff["at"]) is True


def test_a_run_that_asks_again_keeps_the_earlier_handoff_and_its_answer(check, store, tenant):
    from ingest.guard import run_handoff_resolve

    _handed_off(check, store)
    run = Run.objects.get(tenant=tenant)
    assert run_handoff_resolve(run=run, resume=True, by="ann", note="the order exists now") is True
    # Another tool fails again and again: a second handoff.
    bad = {"status": "error", "error_class": "not_found", "result": "no customer c9"}
    store([e for n in range(6, 10) for e in ran(n, tool="get_customer", args={"id": "c9"}, **bad)])
    assert check(call(10, tool="get_customer", args={"id": "c9"}))["decision"] == "handoff"
    handoff = Run.objects.get(pk=run.pk).handoff
    assert handoff["tool"] == "get_customer" and "resolved" not in handoff
    assert [(h["tool"], h["resolved"]["by"], h["resolved"]["note"]) for h in handoff["earlier"]] == [
        ("search_orders", "ann", "the order exists now")
    ]


HANDOFF_URL = "/api/v1/runs/r1/handoff"


def test_an_integration_answers_a_handoff_through_the_api(check, store, tenant, api, make_key):
    _handed_off(check, store)
    operator = make_key(tenant, ["operate"])
    shown = api.get("/api/v1/runs/r1", make_key(tenant, ["read"])).json()
    answer = {"answer": "resume", "note": "the order exists now", "by": "slack:ann"}
    response = api.post(HANDOFF_URL, {**answer, "handoff_at": Run.objects.get().handoff["at"]}, operator)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "running"
    assert response.json()["handoff"]["resolved"]["by"] == "slack:ann"
    assert shown["status"] == "waiting"
    assert check(call(6, tool="get_order", args={"id": "o1"}))["decision"] == "allow"

    again = api.post(HANDOFF_URL, {**answer, "by": "slack:bob"}, operator)
    assert again.status_code == 409
    assert again.json()["error"] == "already_answered" and "slack:ann" in again.json()["detail"]
    assert Run.objects.get().handoff["resolved"]["by"] == "slack:ann"  # nothing changed


def test_a_stop_through_the_api_terminates_the_next_checks(check, store, tenant, api, make_key):
    _handed_off(check, store)
    response = api.post(
        HANDOFF_URL, {"answer": "stop", "note": "refund by hand", "by": "ops"}, make_key(tenant, ["operate"])
    )
    assert response.status_code == 200 and response.json()["status"] == "abandoned"
    assert check(call(6, tool="get_order", args={"id": "o1"}))["decision"] == "terminate"


def test_the_handoff_api_refuses_what_it_cannot_answer(check, store, tenant, other_tenant, api, make_key):
    operator = make_key(tenant, ["operate"])
    body = {"answer": "resume", "note": "go on", "by": "ops"}
    assert api.post(HANDOFF_URL, body, operator).status_code == 404  # no run yet
    store([run_started()])
    not_waiting = api.post(HANDOFF_URL, body, operator)
    assert not_waiting.status_code == 409 and not_waiting.json()["error"] == "not_waiting"
    _handed_off(check, store)
    assert api.post(HANDOFF_URL, body, make_key(tenant, ["ingest", "read", "ledger"])).status_code == 403
    assert api.post(HANDOFF_URL, body, make_key(other_tenant, ["operate"])).status_code == 404
    bad = api.post(HANDOFF_URL, {**body, "answer": "maybe"}, operator)
    assert bad.status_code == 400 and bad.json()["field"] == "answer"
    missing = api.post(HANDOFF_URL, {"answer": "stop", "by": "ops"}, operator)
    assert missing.status_code == 400 and missing.json()["field"] == "note"
    assert Run.objects.get(tenant=tenant).status == Run.Status.WAITING


def test_a_check_stamped_before_the_run_started_does_not_exhaust_the_wall_clock(check, store):
    # The caller's clock days behind the run's (or a copied example's ts): the wall-clock budget is
    # the run's own, from its first event.
    store([run_started(), *ran(1)])
    answer = check(call(2, ts="2026-11-26T21:38:44Z"))
    assert answer["decision"] == "allow", answer
    assert not [d for d in answer["detections"] if d["kind"] == "budget"]


# --- the guard's input: parse_check and the documented CheckInput agree at every edge ----------------


def _check_input_edges() -> list[dict]:
    """Bodies at and just past each limit CheckInput documents (lengths, bounds, choices)."""
    from rest_framework import serializers

    from ingest.api.guard import CheckInput

    base = {"tool": "t", "args": {}}
    bodies = []
    for name, spec in CheckInput().fields.items():
        if isinstance(spec, serializers.CharField) and spec.max_length:
            bodies += [{**base, name: "a" * spec.max_length}, {**base, name: "a" * (spec.max_length + 1)}]
        if isinstance(spec, serializers.ChoiceField):
            bodies += [{**base, name: choice} for choice in spec.choices] + [{**base, name: "nope"}]
        if isinstance(spec, serializers.IntegerField | serializers.FloatField):
            for edge in (spec.min_value, spec.max_value):
                if edge is not None:
                    bodies += [{**base, name: edge}, {**base, name: edge - 1}, {**base, name: edge + 1}]
    return bodies


def test_parse_check_takes_what_check_input_documents_and_refuses_the_rest():
    from ingest.api.errors import ApiError
    from ingest.api.guard import FIELDS, CheckInput, parse_check

    assert set(FIELDS) == set(CheckInput().fields)
    bodies = _check_input_edges()
    assert len(bodies) > 15
    for body in bodies:
        documented = CheckInput(data=body).is_valid()
        try:
            parse_check(orjson.dumps(body), run_id="r1")
            parsed = True
        except ApiError:
            parsed = False
        assert parsed == documented, body
