"""Repeats, oscillation, interval loops, perturbation, polls and writes."""

from tests.ingest.detection.runs import RunBuilder, interventions


def test_a_read_is_observed_at_the_2nd_identical_call_and_corrected_at_the_3rd():
    run = RunBuilder()
    for n in range(4):
        run.call("search_orders", {"customer": "42", "request_id": f"r{n}"}, {"orders": []})
    found = run.detect()
    assert [(d.kind, d.action, d.at_call) for d in found] == [
        ("exact_repeat", "observe", 2),
        ("exact_repeat", "correct", 3),
    ]
    assert "search_orders 3 times" in found[1].hint


def test_repeats_escalate_to_handoff_and_terminate():
    run = RunBuilder()
    for _ in range(8):
        run.call("get_order", {"id": "ORD-1"}, {"status": "open"})
    actions = [(d.action, d.at_call) for d in interventions(run.detect(no_progress_steps=100))]
    assert actions == [("correct", 3), ("handoff", 5), ("terminate", 7)]


def test_a_single_retry_is_never_an_intervention():
    run = RunBuilder().call("get_order", {"id": "ORD-1"}, {"status": "open"})
    run.call("get_order", {"id": "ORD-1"}, {"status": "open"}).call(
        "get_order", {"id": "ORD-2"}, {"status": "x"}
    )
    assert interventions(run.detect()) == []


def test_a_changing_result_is_not_a_repeat():
    run = RunBuilder()
    for n in range(8):
        run.call("tail_log", {"file": "app.log"}, {"lines": [f"line {n}"]})
    assert interventions(run.detect()) == []


def test_paging_is_legit_and_the_same_page_again_is_a_loop():
    paging = RunBuilder()
    for page in range(1, 9):
        paging.call(
            "list_orders",
            {"status": "open", "page": page},
            {"orders": [{"id": page * 10 + i} for i in range(3)]},
        )
    assert interventions(paging.detect()) == []
    stuck = RunBuilder()
    for _ in range(4):
        stuck.call("list_orders", {"status": "open", "page": 2}, {"orders": [{"id": 21}]})
    assert [d.at_call for d in interventions(stuck.detect())] == [3]


def test_oscillation_is_corrected_after_three_full_cycles():
    run = RunBuilder()
    for _ in range(4):
        run.call("get_cart", {"user": "u1"}, {"items": 2}).call("get_prices", {"sku": "A"}, {"price": 5})
    found = interventions(run.detect())
    assert (found[0].kind, found[0].action, found[0].at_call) == ("oscillation", "correct", 6)
    assert found[0].evidence["period"] == 2


def test_a_three_step_cycle_too():
    run = RunBuilder()
    for _ in range(4):
        run.call("a", {"x": 1}, {"r": 1}).call("b", {"x": 1}, {"r": 2}).call("c", {"x": 1}, {"r": 3})
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_call) == ("oscillation", 9)


def test_alternation_with_changing_results_converges_legitimately():
    run = RunBuilder()
    for n in range(5):
        run.call("draft", {"doc": "d1"}, {"text": f"v{n}"}).call("review", {"doc": "d1"}, {"score": n})
    assert interventions(run.detect()) == []


def test_an_interval_loop_is_the_same_call_coming_back_with_the_same_result():
    run = RunBuilder()
    for n in range(3):
        run.call("web_search", {"q": "loopwatch pricing"}, {"hits": ["a", "b"]})
        run.call("read_file", {"path": f"notes/{n}.md"}, {"text": f"note {n}"})
        run.call("read_file", {"path": f"todo/{n}.md"}, {"text": f"todo {n}"})
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_call) == ("interval_loop", 7)


def test_perturbed_arguments_without_new_information():
    run = RunBuilder()
    run.call("search_orders", {"q": "cancelled orders"}, {"orders": [{"id": 1}]})
    run.call("search_orders", {"q": "canceled orders"}, {"orders": [{"id": 1}]})
    run.call("search_orders", {"q": "cancelled orders", "verbose": True}, {"orders": [{"id": 1}]})
    run.call("search_orders", {"q": "Cancelled Orders "}, {"orders": [{"id": 1}]})
    found = interventions(run.detect())
    assert found and found[0].kind == "perturbation" and found[0].at_call == 3


def test_different_ids_are_different_goals_even_when_results_are_empty():
    run = RunBuilder()
    for n in range(6):
        run.call("read_file", {"path": f"pkg/mod{n}/__init__.py"}, "")
    assert not [d for d in interventions(run.detect()) if d.kind == "perturbation"]


def test_parallel_calls_for_different_cities():
    run = RunBuilder().say("checking")
    for city in ("Paris", "Berlin", "Rome", "Oslo", "Lima"):
        run.call("get_weather", {"city": city}, {"temp": len(city)}, new_round=False)
    assert interventions(run.detect()) == []


def test_a_poll_is_legit_while_its_status_changes_and_within_its_budget():
    run = RunBuilder()
    for _ in range(10):
        run.wait(20).call("get_job_status", {"job": "j1"}, {"status": "RUNNING"}, kind="poll")
    run.call("get_job_status", {"job": "j1"}, {"status": "SUCCEEDED"}, kind="poll").finish()
    assert interventions(run.detect()) == []


def test_a_poll_past_its_budget_is_a_loop():
    run = RunBuilder()
    for _ in range(25):
        run.wait(20).call("get_job_status", {"job": "j1"}, {"status": "RUNNING"}, kind="poll")
    found = interventions(run.detect())
    assert found[0].kind == "poll_budget" and found[0].at_call == 16


def test_two_identical_writes_with_different_keys_are_two_operations():
    run = RunBuilder()
    for key in ("op-1", "op-2"):
        run.call("place_order", {"sku": "A", "qty": 1}, {"order": key}, kind="write", operation_key=key)
    assert interventions(run.detect()) == []


def test_a_write_retried_after_a_timeout_is_a_possible_duplicate():
    run = RunBuilder()
    run.call(
        "refund_payment", {"payment": "p1", "amount": 10}, None, kind="write", status="timeout", step_id="s7"
    )
    run.call("refund_payment", {"payment": "p1", "amount": 10}, {"ok": True}, kind="write", step_id="s7")
    found = interventions(run.detect())
    assert (found[0].kind, found[0].action, found[0].at_call) == ("duplicate_write", "correct", 2)
    assert "timed out" in found[0].hint


def test_counting_by_round_takes_a_parallel_batch_as_one_step():
    run = RunBuilder()
    for _ in range(6):
        run.say("batch")
        for sku in ("A", "B", "C"):
            run.call("get_price", {"sku": sku}, {"price": 5}, new_round=False)
    by_call = [d for d in interventions(run.detect(no_progress_steps=6)) if d.kind == "no_progress"]
    by_round = [
        d
        for d in interventions(run.detect(no_progress_steps=6, count_by_round=True))
        if d.kind == "no_progress"
    ]
    # after the first call nothing is new: by call, the 6th such call (call 7) is too many; by
    # round, a parallel batch of 3 is one step, so it takes 6 rounds of them
    assert by_call and by_call[0].at_call == 7
    assert by_round and by_round[0].at_call >= 16
