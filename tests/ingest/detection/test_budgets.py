from ingest.detection import RunState, replay_run
from tests.ingest.detection.runs import RunBuilder, interventions


def test_the_first_exhausted_budget_ends_the_run_with_a_diagnosis():
    run = RunBuilder(budgets={"max_tool_calls": 5})
    for n in range(7):
        run.call("read_file", {"path": f"src/{n}.py"}, {"text": f"code {n}"})
    state, found = replay_run(run.events)
    budget = [d for d in found if d.kind == "budget"]
    assert len(budget) == 1 and budget[0].action == "terminate" and budget[0].at_call == 5
    assert budget[0].evidence == {
        "terminated_by": "budget",
        "budget_type": "max_tool_calls",
        "limit": 5,
        "consumed": 5,
        "last_progress_step": 4,  # it fires as the 5th call is made, before its result
        "hint": budget[0].hint,
    }
    assert (state.terminated_by, state.budget_type) == ("budget", "max_tool_calls")
    assert found[-1] is budget[0]  # nothing after the end


def test_cost_tokens_and_wall_clock_budgets():
    run = RunBuilder(budgets={"max_wall_s": 30})
    for n in range(5):
        run.wait(10).call("read_file", {"path": f"f{n}"}, {"text": str(n)})
    assert [d.evidence["budget_type"] for d in run.detect() if d.kind == "budget"] == ["max_wall_s"]
    costly = RunBuilder(budgets={"max_cost_usd": 0.05})
    costly.events.append({**costly._event("model_round"), "round": 1, "cost_usd": 0.06})
    assert [d.evidence["budget_type"] for d in costly.detect() if d.kind == "budget"] == ["max_cost_usd"]


def test_no_progress_after_k_steps():
    run = RunBuilder()
    for n in range(14):
        run.call("grep", {"pattern": f"needle{n}"}, {"matches": []})
    found = [d for d in interventions(run.detect(no_progress_steps=10)) if d.kind == "no_progress"]
    assert found[0].at_call == 10 and found[0].action == "correct"


def test_the_state_resumes_where_another_worker_stopped():
    run = RunBuilder()
    for n in range(12):
        run.call("get_cart", {"user": "u"}, {"n": 1}) if n % 2 else run.call(
            "get_price", {"sku": "A"}, {"p": 5}
        )
    whole = replay_run(run.events)[1]
    from ingest.detection import Engine

    engine, state, pieces = Engine(), RunState(), []
    for i, event in enumerate(run.events):
        if i % 5 == 0:
            state = RunState.from_dict(
                __import__("orjson").loads(__import__("orjson").dumps(state.to_dict()))
            )
        pieces += engine.feed(state, event)
    assert [d.as_dict() for d in pieces] == [d.as_dict() for d in whole]
    assert interventions(whole)


def test_an_event_stamped_before_the_run_started_does_not_exhaust_the_wall_clock():
    # A guard check (or a replayed event) carrying a caller's clock days behind the run's start.
    run = RunBuilder(budgets={"max_wall_s": 3600})
    run.call("read_file", {"path": "a"}, {"text": "a"})
    early = run._event("tool_call", round=2, call_id="old", tool="read_file", args={"path": "b"})
    early["ts"] = "2026-11-26T21:38:44Z"  # 217,316 s before the run's start
    run.events.append(early)
    run.wait(60).call("read_file", {"path": "c"}, {"text": "c"})
    state, found = replay_run(run.events)
    assert [d for d in found if d.kind == "budget"] == []
    assert state.last_ts - state.start_ts < 3600
    from ingest.detection.budgets import consumed

    assert 0 < consumed(state, "max_wall_s") < 120  # measured from the run's own first event


def test_a_version_1_state_is_upgraded_and_goes_on():
    from ingest.detection.state import STATE_VERSION

    run = RunBuilder()
    for _ in range(2):
        run.call("get_order", {"id": "o1"}, {"id": "o1", "status": "open"})
    engine_state = replay_run(run.events)[0].to_dict()
    old = {k: v for k, v in engine_state.items() if k not in ("world", "user_keys", "texts", "harness")}
    old.update(version=1, questions=[["what is your order number", 3, True, 1, 0]], question_streak=[])
    state = RunState.from_dict(old)
    assert state.version == STATE_VERSION and state.questions == [["what is your order number", 1, True, 0]]
    from ingest.detection import Engine

    more = RunBuilder()
    more.call("get_order", {"id": "o1"}, {"id": "o1", "status": "open"})
    found = [d for e in more.events[1:] for d in Engine().feed(state, e)]
    assert [(d.kind, d.action) for d in found] == [("exact_repeat", "correct")]
