"""Tools whose kind nobody declared: inferred from the name and the results, overridable by config."""

from __future__ import annotations

import pytest

from ingest.detection import Config, Thresholds, ToolSpec, replay_run
from ingest.detection.kinds import kind_from_name, kind_resolve, status_of
from tests.ingest.detection.runs import RunBuilder, interventions


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("get_job_status", "poll"),
        ("getJobStatus", "poll"),
        ("jobs.get-status", "poll"),
        ("export_status", "poll"),
        ("wait_for_export", "poll"),
        ("check_build", "poll"),
        ("poll_queue", "poll"),
        ("get_order_details", "read"),
        ("search_orders", "read"),
        ("listFiles", "read"),
        ("create_ticket", "write"),
        ("cancel_pending_order", "write"),
        ("update_status", "write"),  # it sets one
        ("send_email", "write"),
        ("bash", "other"),
        ("calculate", "other"),
        ("", "other"),
    ],
)
def test_kind_from_name(name: str, kind: str):
    assert kind_from_name(name) == kind


def test_a_declared_kind_wins_then_the_config_then_the_name():
    assert kind_resolve("read", "poll", "get_job_status") == ("read", "event")
    assert kind_resolve(None, "read", "get_job_status") == ("read", "config")
    assert kind_resolve("", "", "get_job_status") == ("poll", "name")
    assert kind_resolve("bogus", "", "bash") == ("other", "default")


@pytest.mark.parametrize(
    ("result", "status"),
    [({"status": "RUNNING", "id": 4}, "running"), ({"state": "queued"}, "queued"), ("PENDING", "pending")],
)
def test_status_of_a_result(result, status):
    assert status_of(result) == status
    assert status_of({"rows": [1, 2]}) == "" and status_of("a whole sentence here") == ""


def _undeclared(builder: RunBuilder, tool: str, args: dict, result) -> RunBuilder:
    builder.say()
    builder.calls += 1
    call_id = f"c{builder.calls}"
    builder.events.append(
        builder._event("tool_call", round=builder.round, call_id=call_id, tool=tool, args=args)
    )
    builder.seconds += 30
    builder.events.append(builder._event("tool_result", call_id=call_id, status="ok", result=result))
    return builder


def test_an_undeclared_status_poll_within_its_budget_is_never_corrected():
    run = RunBuilder()
    for _ in range(12):
        _undeclared(run, "get_export_status", {"export_id": "E-1"}, {"status": "running", "rows": 0})
    _undeclared(run, "get_export_status", {"export_id": "E-1"}, {"status": "done", "rows": 120})
    assert interventions(run.detect()) == []
    # Past the poll budget it is a poll budget, not a repeat: and it says the kind was inferred.
    stuck = RunBuilder()
    for _ in range(20):
        _undeclared(stuck, "get_export_status", {"export_id": "E-1"}, {"status": "running"})
    found = interventions(stuck.detect())
    assert found[0].kind == "poll_budget"
    assert found[0].evidence["tool_kind"] == "poll"
    assert found[0].evidence["kind_inferred_from"] == "name"


def test_a_result_saying_still_working_makes_an_undeclared_tool_a_poll():
    run = RunBuilder()
    for _ in range(8):
        _undeclared(run, "fetch_report", {"report": "R-9"}, {"state": "queued", "position": 3})
    assert interventions(run.detect()) == []
    # A read of the same name whose results never said so is judged as a read.
    plain = RunBuilder()
    for _ in range(4):
        _undeclared(plain, "fetch_report", {"report": "R-9"}, {"title": "Q3", "rows": 3})
    found = interventions(plain.detect())
    assert found[0].kind == "exact_repeat" and found[0].evidence["kind_inferred_from"] == "name"


def test_a_status_that_changes_between_identical_calls_makes_an_undeclared_tool_a_poll():
    run = RunBuilder()
    for status in ("a", "b", "b", "b", "b", "b", "b", "c"):
        _undeclared(run, "job", {"id": 1}, {"status": status})
    assert interventions(run.detect()) == []


def test_tool_configs_override_what_the_name_says():
    run = RunBuilder()
    for _ in range(4):
        _undeclared(run, "check_inventory", {"sku": "S-1"}, {"sku": "S-1", "count": 3})
    assert interventions(run.detect()) == []  # a poll by its name, within its budget
    config = Config(thresholds=Thresholds(), tools={"check_inventory": ToolSpec(kind="read")})
    found = interventions(replay_run(run.events, config)[1])
    assert found[0].kind == "exact_repeat" and found[0].at_call == 3
    assert found[0].evidence["tool_kind"] == "read" and "kind_inferred_from" not in found[0].evidence
