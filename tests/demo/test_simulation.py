"""The demo traffic generators: valid events, and each scenario has the shape it claims. No database."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from demo.simulation import (
    AGENTS,
    ROUNDS,
    SCENARIOS,
    SCENARIOS_BY_NAME,
    TASK_TYPES,
    Event,
    rounds_sample,
    run_generate,
    scenario_budget_exhausted,
    scenario_legit_double_purchase,
    scenario_legit_paging,
    scenario_legit_polling,
    scenario_legit_transient_retry,
    scenario_loop_arg_jitter,
    scenario_loop_clarification,
    scenario_loop_exact_repeat,
    scenario_loop_oscillation,
    scenario_loop_same_error,
    scenario_normal,
    scenario_pick,
    scenario_write_timeout,
)
from ingest.schema import BUDGET_KEYS, validate_event

START = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "ingest" / "spec" / "trace-events.schema.json"
SEEDS = range(40)


def runs_of(fn, seeds=SEEDS) -> list[list[Event]]:
    return [fn(random.Random(seed), START) for seed in seeds]


def calls_with_results(events: list[Event]) -> list[tuple[Event, Event]]:
    """(tool_call, tool_result) pairs, joined as the server does: the most recent unanswered call."""
    open_calls: dict[str, list[Event]] = {}
    pairs: list[tuple[Event, Event]] = []
    for event in events:
        if event["type"] == "tool_call":
            open_calls.setdefault(event["call_id"], []).append(event)
        elif event["type"] == "tool_result":
            pairs.append((open_calls[event["call_id"]].pop(), event))
    assert not any(open_calls.values()), "a tool_call without a result"
    return sorted(pairs, key=lambda pair: events.index(pair[0]))


def signature(call: Event) -> str:
    return call["tool"] + json.dumps(call["args"], sort_keys=True)


def result_of(result: Event) -> Any:
    return result.get("result")


def finished(events: list[Event]) -> Event:
    assert events[-1]["type"] == "run_finished"
    return events[-1]


def labels(events: list[Event]) -> dict[str, str]:
    return events[0]["labels"]


def longest_tail(pairs: list[tuple[Event, Event]], same) -> list[tuple[Event, Event]]:
    """The longest run of consecutive pairs at the end where `same(previous, pair)` holds."""
    tail = pairs[-1:]
    for pair in reversed(pairs[:-1]):
        if not same(pair, tail[0]):
            break
        tail.insert(0, pair)
    return tail


# --- every scenario ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema_validator() -> jsonschema.protocols.Validator:
    # One compiled validator: jsonschema.validate() would check the schema again for every event.
    schema = orjson.loads(SCHEMA_PATH.read_bytes())
    return jsonschema.validators.validator_for(schema)(schema)


@pytest.fixture(scope="module")
def every_run() -> list[tuple[str, list[Event]]]:
    return [(s.name, events) for s in SCENARIOS for events in runs_of(s.fn, range(25))]


def test_it_makes_only_valid_events(every_run, schema_validator):
    for _, events in every_run:
        for event in events:
            validate_event(event)
            schema_validator.validate(event)


def test_every_run_is_well_formed(every_run):
    for name, events in every_run:
        run_id = events[0]["run_id"]
        assert events[0]["type"] == "run_started", name
        assert events[1]["type"] == "user_message", name
        assert finished(events)["status"] in ("succeeded", "failed", "truncated", "abandoned")
        assert {e["run_id"] for e in events} == {run_id}
        assert [e["type"] for e in events].count("run_finished") == 1
        assert len({e["event_id"] for e in events}) == len(events), f"{name}: event_id reused"
        stamps = [datetime.fromisoformat(e["ts"]) for e in events]
        assert stamps == sorted(stamps), f"{name}: time goes backwards"
        rounds = [e["round"] for e in events if e["type"] == "model_round"]
        assert rounds == list(range(1, len(rounds) + 1)), name
        current = 0
        for event in events:
            if event["type"] == "model_round":
                current = event["round"]
            elif event["type"] == "tool_call":
                assert event["round"] == current, f"{name}: a call outside its round"
                assert event["kind"] in ("read", "write", "poll", "other")
        calls_with_results(events)  # every call is answered
        assert labels(events)["sim_scenario"] == name
        assert labels(events)["sim_expect"] == SCENARIOS_BY_NAME[name].expect


def test_event_ids_and_run_ids_are_unique_across_runs(every_run):
    run_ids = [events[0]["run_id"] for _, events in every_run]
    assert len(set(run_ids)) == len(run_ids)
    event_ids = [e["event_id"] for _, events in every_run for e in events]
    assert len(set(event_ids)) == len(event_ids)


def test_declared_budgets_are_known_and_not_exceeded_unless_hit(every_run):
    for name, events in every_run:
        budgets = events[0].get("budgets", {})
        assert set(budgets) <= set(BUDGET_KEYS), name
        end = finished(events)
        used = {
            "max_rounds": sum(1 for e in events if e["type"] == "model_round"),
            "max_tool_calls": sum(1 for e in events if e["type"] == "tool_call"),
        }
        for key, value in used.items():
            if key in budgets and end.get("budget_type") != key:
                assert value < budgets[key], f"{name}: {key} {value} over {budgets[key]} without being hit"


def test_it_is_deterministic_for_a_seed():
    one = [run_generate(random.Random(7), START, run_prefix="t") for _ in range(1)]
    two = [run_generate(random.Random(7), START, run_prefix="t") for _ in range(1)]
    assert one == two
    rng_a, rng_b = random.Random(11), random.Random(11)
    assert [run_generate(rng_a, START).events for _ in range(30)] == [
        run_generate(rng_b, START).events for _ in range(30)
    ]
    assert run_generate(random.Random(12), START).events != run_generate(random.Random(13), START).events


def test_the_run_prefix_and_start_are_used():
    run = run_generate(random.Random(3), datetime(2027, 1, 2, 3, 4, 5, tzinfo=UTC), run_prefix="demo42")
    assert run.run_id.startswith("demo42-")
    assert run.events[0]["ts"] == "2027-01-02T03:04:05.000Z"


def test_the_module_imports_no_django():
    code = "import sys, demo.simulation; print('django' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- the mix -----------------------------------------------------------------------------------


def test_the_mix_picks_every_scenario_about_as_weighted():
    rng = random.Random(1)
    picks = Counter(scenario_pick(rng).name for _ in range(20_000))
    total = sum(s.weight for s in SCENARIOS)
    for scenario in SCENARIOS:
        share = picks[scenario.name] / 20_000
        assert abs(share - scenario.weight / total) < 0.015, scenario.name


def test_the_mix_covers_backends_models_and_task_types():
    rng = random.Random(2)
    runs = [run_generate(rng, START) for _ in range(300)]
    starts = [r.events[0] for r in runs]
    assert {(s["backend"], s["model"]) for s in starts} == {(a.backend, a.model) for a in AGENTS}
    assert {s["task_type"] for s in starts} == set(TASK_TYPES)
    assert len({s["agent"] for s in starts}) == len(AGENTS)
    assert {finished(r.events)["status"] for r in runs} == {"succeeded", "failed", "truncated", "abandoned"}
    kinds = {e["kind"] for r in runs for e in r.events if e["type"] == "tool_call"}
    assert {"read", "write", "poll"} <= kinds


def test_rounds_have_realistic_tokens_and_mostly_no_cost():
    rng = random.Random(3)
    rounds = [e for _ in range(300) for e in run_generate(rng, START).events if e["type"] == "model_round"]
    with_cost = [r for r in rounds if "cost_usd" in r]
    assert 0.05 < len(with_cost) / len(rounds) < 0.5  # some priced by the runtime, most by the server
    assert any(r.get("text") for r in rounds)
    assert all(500 <= r["input_tokens"] <= 200_000 and 1 <= r["output_tokens"] <= 1000 for r in rounds)


@pytest.mark.parametrize("task_type", sorted(TASK_TYPES))
def test_round_counts_stay_in_the_task_types_range(task_type):
    rng = random.Random(4)
    low, high = ROUNDS[task_type]
    counts = [rounds_sample(rng, task_type) for _ in range(2000)]
    assert low == min(counts) and max(counts) <= high


def test_research_has_a_heavy_tail():
    rng = random.Random(5)
    counts = sorted(rounds_sample(rng, "research") for _ in range(2000))
    median = counts[len(counts) // 2]
    assert median <= 16
    assert sum(1 for c in counts if c >= 40) > 40  # a tail well beyond the median…
    assert counts[-1] == ROUNDS["research"][1]  # …up to the cap


def test_normal_runs_succeed_without_repeating_a_call():
    for events in runs_of(scenario_normal, range(200)):
        assert finished(events)["status"] == "succeeded"
        signatures = [signature(call) for call, _ in calls_with_results(events)]
        assert len(signatures) == len(set(signatures))
        rounds = sum(1 for e in events if e["type"] == "model_round")
        low, high = ROUNDS[events[0]["task_type"]]
        assert low <= rounds <= high


def test_some_backends_reuse_call_ids_across_rounds():
    runs = runs_of(scenario_normal, range(300))
    local = [r for r in runs if r[0]["backend"] == "local"]
    assert any(
        len({c["call_id"] for c in r if c["type"] == "tool_call"})
        < sum(1 for c in r if c["type"] == "tool_call")
        for r in local
    )


def test_long_results_are_cut_with_the_digest_of_the_whole():
    results = [
        e for events in runs_of(scenario_normal, range(300)) for e in events if e.get("result_truncated")
    ]
    assert results
    assert all(len(r["result_sha256"]) == 64 and len(r["result"]) == 1500 for r in results)


# --- loops -------------------------------------------------------------------------------------


def _ends_like_a_loop(events: list[Event]) -> None:
    end = finished(events)
    assert end["status"] in ("truncated", "failed", "abandoned")
    if end["status"] == "truncated":
        assert end["terminated_by"] == "budget"
        assert end["budget_type"] in BUDGET_KEYS


def test_exact_repeat_is_the_same_read_with_the_same_result():
    for events in runs_of(scenario_loop_exact_repeat):
        pairs = calls_with_results(events)
        tail = longest_tail(
            pairs, lambda a, b: signature(a[0]) == signature(b[0]) and result_of(a[1]) == result_of(b[1])
        )
        assert len(tail) >= 4
        assert all(call["kind"] == "read" and result["status"] == "ok" for call, result in tail)
        _ends_like_a_loop(events)


def test_oscillation_alternates_two_signatures_for_three_cycles_or_more():
    for events in runs_of(scenario_loop_oscillation):
        sigs = [signature(call) for call, _ in calls_with_results(events)]
        a, b = sigs[-2], sigs[-1]
        assert a != b
        alternating = 0
        for i, sig in enumerate(reversed(sigs)):
            if sig != (b if i % 2 == 0 else a):
                break
            alternating += 1
        assert alternating >= 6
        results = {signature(c): [] for c, _ in calls_with_results(events)}
        for call, result in calls_with_results(events):
            results[signature(call)].append(json.dumps(result_of(result), sort_keys=True))
        assert len(set(results[a])) == 1 and len(set(results[b])) == 1  # no new information
        _ends_like_a_loop(events)


def _normalised(value: Any) -> Any:
    return " ".join(value.lower().split()) if isinstance(value, str) else value


def test_argument_jitter_nudges_one_argument_and_learns_nothing():
    styles = Counter()
    for events in runs_of(scenario_loop_arg_jitter, range(60)):
        style = labels(events)["sim_jitter"]
        styles[style] += 1
        pairs = calls_with_results(events)
        tail = longest_tail(
            pairs, lambda a, b: a[0]["tool"] == b[0]["tool"] and result_of(a[1]) == result_of(b[1])
        )
        args = [call["args"] for call, _ in tail]
        # A warm-up read may give the same answer just before the loop: it is not part of it.
        while len(args) > 1 and (args[0] == args[1] or set(args[0]) != set(args[-1])):
            args.pop(0)
        assert len(args) >= 4
        assert all(args[i] != args[i + 1] for i in range(len(args) - 1)), "neighbours must differ"
        changed = {k for a in args for k in a if a[k] != args[0][k]}
        assert len(changed) == 1
        (key,) = changed
        values = [a[key] for a in args]
        if style == "offset":
            assert max(values) - min(values) <= 2
        elif style == "case_whitespace":
            assert len({_normalised(v) for v in values}) == 1
        else:
            assert len({_normalised(v) for v in values}) >= 2
        _ends_like_a_loop(events)
    assert set(styles) == {"offset", "synonyms", "case_whitespace"}


def test_same_error_repeats_an_invalid_argument_verbatim():
    for events in runs_of(scenario_loop_same_error):
        tail = longest_tail(
            calls_with_results(events),
            lambda a, b: signature(a[0]) == signature(b[0]) and result_of(a[1]) == result_of(b[1]),
        )
        assert len(tail) >= 3
        assert all(r["status"] == "error" and r["error_class"] == "invalid_argument" for _, r in tail)
        _ends_like_a_loop(events)


def test_clarification_asks_the_same_question_after_the_user_answered():
    for events in runs_of(scenario_loop_clarification):
        texts = Counter(e["text"] for e in events if e["type"] == "model_round" and e.get("text"))
        question, asked = texts.most_common(1)[0]
        assert asked >= 3 and question.endswith(".") and "?" in question
        first = next(i for i, e in enumerate(events) if e.get("text") == question)
        assert any(e["type"] == "user_message" for e in events[first:]), "the user answered"
        _ends_like_a_loop(events)


def test_budget_runs_are_truncated_at_a_declared_budget_they_used_up():
    seen = set()
    for events in runs_of(scenario_budget_exhausted, range(60)):
        end = finished(events)
        assert (end["status"], end["terminated_by"]) == ("truncated", "budget")
        budget_type = end["budget_type"]
        seen.add(budget_type)
        limit = events[0]["budgets"][budget_type]
        rounds = [e for e in events if e["type"] == "model_round"]
        used = {
            "max_rounds": len(rounds),
            "max_tool_calls": sum(1 for e in events if e["type"] == "tool_call"),
            "max_tokens": sum(r["input_tokens"] + r["output_tokens"] for r in rounds),
            "max_cost_usd": sum(r.get("cost_usd", 0) for r in rounds),
        }[budget_type]
        assert 0 < limit <= used
        if budget_type != "max_cost_usd":
            assert limit == used
        else:
            assert all("cost_usd" in r for r in rounds) and events[0]["backend"] != "local"
    assert seen == {"max_tool_calls", "max_rounds", "max_cost_usd", "max_tokens"}


def test_loop_endings_include_budget_truncation_with_a_budget_type():
    ends = [finished(e) for fn in (scenario_loop_exact_repeat, scenario_loop_same_error) for e in runs_of(fn)]
    truncated = [e for e in ends if e["status"] == "truncated"]
    assert truncated and {e["budget_type"] for e in truncated} >= {"max_tool_calls", "max_same_tool_retries"}
    assert any(e.get("terminated_by") == "loop" for e in ends)


# --- legitimate repetition ---------------------------------------------------------------------


def test_polling_sees_running_then_succeeded():
    for events in runs_of(scenario_legit_polling):
        polls = [(c, r) for c, r in calls_with_results(events) if c["kind"] == "poll"]
        statuses = [r["result"]["status"] for _, r in polls]
        assert len(statuses) >= 4
        assert statuses[:-1] == ["RUNNING"] * (len(statuses) - 1) and statuses[-1] == "SUCCEEDED"
        assert len({signature(c) for c, _ in polls}) == 1  # the very same call each time
        poll_times = [datetime.fromisoformat(c["ts"]) for c, _ in polls]
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(poll_times)]
        assert gaps[-1] > gaps[0]  # backing off
        assert finished(events)["status"] == "succeeded"


def test_paging_advances_its_page_or_cursor_to_the_end():
    styles = set()
    for events in runs_of(scenario_legit_paging):
        pages = [(c, r) for c, r in calls_with_results(events) if c["tool"] == "list_orders"]
        assert len(pages) >= 3
        if "page" in pages[0][0]["args"]:
            styles.add("page")
            assert [c["args"]["page"] for c, _ in pages] == list(range(1, len(pages) + 1))
            assert pages[-1][1]["result"]["next_page"] is None
        else:
            styles.add("cursor")
            assert "cursor" not in pages[0][0]["args"]
            for (_, before), (call, _) in itertools.pairwise(pages):
                assert call["args"]["cursor"] == before["result"]["next_cursor"]
            assert pages[-1][1]["result"]["next_cursor"] is None
        assert len({signature(c) for c, _ in pages}) == len(pages)
        assert finished(events)["status"] == "succeeded"
    assert styles == {"page", "cursor"}


def test_double_purchase_is_two_identical_writes_with_their_own_keys():
    for events in runs_of(scenario_legit_double_purchase):
        assert any(e["type"] == "user_message" and "two" in e["text"] for e in events)
        writes = [(c, r) for c, r in calls_with_results(events) if c["kind"] == "write"]
        assert len(writes) == 2
        (first, r1), (second, r2) = writes
        assert first["args"] == second["args"] and first["tool"] == second["tool"] == "place_order"
        assert first["step_id"] != second["step_id"]
        assert first["operation_key"] != second["operation_key"]
        assert r1["result"]["order_id"] != r2["result"]["order_id"]
        assert finished(events)["status"] == "succeeded"


def test_transient_retry_repeats_the_call_after_a_503_and_succeeds():
    same_round = 0
    for events in runs_of(scenario_legit_transient_retry, range(60)):
        pairs = calls_with_results(events)
        failed = [i for i, (_, r) in enumerate(pairs) if r.get("error_class") == "transient"]
        assert failed
        after = pairs[failed[-1] + 1]
        assert signature(after[0]) == signature(pairs[failed[0]][0])
        assert after[1]["status"] == "ok"
        assert "503" in pairs[failed[0]][1]["result"]["error"]
        same_round += after[0]["round"] == pairs[failed[0]][0]["round"]
        assert finished(events)["status"] == "succeeded"
    assert 0 < same_round < 60  # the runtime retries by itself, or the model calls again


def test_write_timeouts_are_unknown_writes_sometimes_with_a_request_id():
    with_id = 0
    for events in runs_of(scenario_write_timeout, range(60)):
        timed_out = [(c, r) for c, r in calls_with_results(events) if r["status"] == "timeout"]
        assert len(timed_out) == 1
        call, result = timed_out[0]
        assert call["kind"] == "write" and (call.get("operation_key") or call.get("step_id"))
        assert result["latency_ms"] >= 15_000 and "result" not in result
        with_id += "external_request_id" in result
        assert labels(events)["sim_expect"] == "unknown_write"
    assert 0 < with_id < 60
