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
