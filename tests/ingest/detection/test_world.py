"""World-change awareness: after a write that did something, or a user's turn, the same read (or
test run) asks a new question; repeats, interval loops and repeated errors count within a stretch."""

from __future__ import annotations

from tests.ingest.detection.runs import RunBuilder, interventions

CONFIG = {"path": "settings.toml"}
TEXT = {"text": "debug = false"}


def test_a_read_again_after_a_write_is_a_new_question():
    run = RunBuilder()
    run.call("read_file", CONFIG, TEXT).call("read_file", CONFIG, TEXT)
    run.call("write_file", {"path": "settings.toml", "text": "debug = true"}, {"ok": True}, kind="write")
    run.call("read_file", CONFIG, TEXT).call("read_file", CONFIG, TEXT)
    assert interventions(run.detect()) == []
    run.call("read_file", CONFIG, TEXT)  # the 3rd since the write
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_call) == ("exact_repeat", 6)


def test_a_test_run_again_after_an_edit_is_a_new_question():
    run = RunBuilder()
    for n in range(4):
        run.call("bash", {"command": "pytest tests/test_x.py"}, "1 failed, 3 passed", kind="other")
        run.call("bash", {"command": f"sed -i 's/a/b{n}/' x.py"}, "", kind="write")
    assert interventions(run.detect()) == []


def test_a_read_again_after_a_users_turn_is_a_new_question():
    run = RunBuilder()
    for _ in range(2):
        run.call("get_order", {"id": "A-1"}, {"id": "A-1", "status": "packed"})
    run.user("Has it shipped yet? Please look again.")
    for _ in range(2):
        run.call("get_order", {"id": "A-1"}, {"id": "A-1", "status": "packed"})
    assert interventions(run.detect()) == []


def test_an_interval_loop_counts_within_the_stretch_since_the_world_changed():
    def cycle(run: RunBuilder) -> None:
        run.call("get_order", {"id": "A-1"}, {"id": "A-1", "status": "packed"})
        run.call("get_customer", {"id": "C-1"}, {"id": "C-1", "tier": "gold"})
        run.call("list_notes", {"order": "A-1"}, {"notes": []})

    run = RunBuilder()
    cycle(run)
    cycle(run)
    run.user("Any news on my order A-1? I need it by Friday.")
    cycle(run)
    cycle(run)
    assert [d for d in interventions(run.detect()) if d.kind in ("interval_loop", "oscillation")] == []
    cycle(run)  # the third pass since the user's turn
    assert [d.kind for d in interventions(run.detect())][:1] in (["interval_loop"], ["oscillation"])


def test_a_write_sent_again_with_the_same_result_did_nothing_new():
    # No idempotency key: the same arguments may be a real second order, so only the same answer
    # again and again says the write is being repeated for nothing (once more than a read).
    run = RunBuilder()
    for _ in range(3):
        run.call(
            "update_baggage", {"reservation": "R1", "bags": 2}, {"reservation": "R1", "bags": 2}, kind="write"
        )
    assert interventions(run.detect()) == []
    run.call(
        "update_baggage", {"reservation": "R1", "bags": 2}, {"reservation": "R1", "bags": 2}, kind="write"
    )
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_call) == ("exact_repeat", 4)


def test_an_action_repeated_three_times_then_stopping_is_left_alone():
    run = RunBuilder()
    for _ in range(3):
        run.call("transfer_to_human", {"summary": "wants a refund"}, "Transfer successful", kind="other")
    run.say("You are being transferred to a human agent.")
    assert interventions(run.detect()) == []


def test_the_same_failure_after_the_user_asked_again_counts_one_retry_more():
    failing = {"reservation": "R1", "payment": "card_9"}
    error = {"status": "error", "error_class": "not_found"}
    run = RunBuilder()
    run.call("book", failing, "payment card_9 not found", kind="write", **error)
    run.user("Yes, please book it.")
    run.call("book", failing, "payment card_9 not found", kind="write", **error)
    assert interventions(run.detect()) == []  # retried because the user asked
    run.user("Yes, please book it.")
    run.call("book", failing, "payment card_9 not found", kind="write", **error)
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_call, found[0].count) == ("repeated_error", 3, 3)


def test_identical_calls_in_one_parallel_batch_are_not_repeats_of_each_other():
    # The model sent the same search three times in one round: the results come after all three.
    run = RunBuilder().say()
    for n in range(1, 4):
        run.events.append(
            run._event(
                "tool_call", round=1, call_id=f"c{n}", tool="search_flights", kind="read", args={"to": "LAX"}
            )
        )
    for n in range(1, 4):
        run.events.append(
            run._event("tool_result", call_id=f"c{n}", status="ok", result=[], error_class="empty_result")
        )
    assert interventions(run.detect()) == []
    # A runtime that numbers no rounds: the same round, but each call after the last one's result.
    flat = RunBuilder().say()
    for _ in range(3):
        flat.call("search_flights", {"to": "LAX"}, {"flights": []}, new_round=False)
    found = interventions(flat.detect())
    assert (found[0].kind, found[0].at_call) == ("exact_repeat", 3)
