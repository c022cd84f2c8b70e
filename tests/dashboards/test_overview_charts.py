"""The overview's chart builders: pure functions, no database (pytest-django blocks any query)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

from dashboards.overview import charts

T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _nearest_rank(values: list[int], p: int) -> int:
    ordered = sorted(values)
    rank = -(-p * len(ordered) // 100)  # ceil
    return ordered[rank - 1]


def test_percentiles_are_the_nearest_rank_of_the_runs_behind_the_histogram():
    rng = random.Random(5)
    for _ in range(50):
        values = [max(1, int(rng.lognormvariate(2, 1))) for _ in range(rng.randint(1, 400))]
        hist: dict[int, int] = {}
        for v in values:
            hist[v] = hist.get(v, 0) + 1
        got = charts.percentiles(hist)
        assert got["p50"] == _nearest_rank(values, 50)
        assert got["p90"] == _nearest_rank(values, 90)
        assert got["p99"] == _nearest_rank(values, 99)
        assert got["max"] == max(values) and got["runs"] == len(values)


def test_tail_bins_cover_every_value_once_and_double_every_two_bins():
    bins = charts.tail_bins(1000)
    covered = [v for lo, hi in bins for v in range(lo, hi + 1)]
    assert covered == list(range(covered[0], covered[-1] + 1)) and covered[0] == 0 and covered[-1] >= 1000
    widths = [hi - lo + 1 for lo, hi in bins if lo >= 5]
    assert all(b == 2 * a for a, b in zip(widths[::2], widths[2::2], strict=False))
    assert charts.tail_bins(3)[-1] == (3, 3)  # nothing beyond the largest value


def test_the_long_tail_shows_the_longest_tail_first_with_its_marks_and_bar_data():
    hist = {"faq": {1: 50, 2: 30, 3: 5}, "research": {8: 10, 12: 6, 40: 3, 180: 1}}
    figure = charts.long_tail_chart(hist, metric_label="model rounds")
    json.dumps(figure)  # what the template embeds
    shown = [trace for trace in figure["data"] if trace["visible"]]
    assert [trace["name"] for trace in shown] == ["research"]
    research = shown[0]
    # every run is in exactly one bar, and each bar says which runs it holds
    assert sum(n for n in research["y"] if n) == 20
    for (task, lo, hi), n in zip(research["customdata"], research["y"], strict=True):
        assert task == "research"
        assert (n or 0) == sum(c for v, c in hist["research"].items() if lo <= v <= hi)
    stats = charts.percentiles(hist["research"])
    notes = " ".join(a["text"] for a in figure["layout"]["annotations"])
    for name in ("p50", "p90", "p99", "max"):
        assert f"{name} {stats[name]}" in notes
    assert figure["layout"]["yaxis"]["type"] == "log"
    menu = figure["layout"]["updatemenus"][0]
    assert [b["label"] for b in menu["buttons"]] == ["faq (85)", "research (20)"]
    assert menu["active"] == 1


def test_the_long_tail_opens_on_the_task_type_asked_for():
    hist = {"faq": {1: 5}, "research": {80: 2}}
    figure = charts.long_tail_chart(hist, metric_label="tool calls", selected="faq")
    assert [t["name"] for t in figure["data"] if t["visible"]] == ["faq"]


def test_budget_shares_are_of_the_finished_runs_of_each_step():
    buckets = [T0, T0 + HOUR]
    rows = [
        {"bucket": T0, "task_type": "faq", "budget_type": "", "runs": 6},
        {"bucket": T0, "task_type": "faq", "budget_type": "max_tool_calls", "runs": 2},
        {"bucket": T0, "task_type": "research", "budget_type": "max_rounds", "runs": 2},
        {"bucket": T0 + HOUR, "task_type": "research", "budget_type": "", "runs": 4},
    ]
    by_type, by_task = charts.budget_share_charts(rows, buckets)
    shares = {t["name"]: t["y"] for t in by_type["data"]}
    assert shares == {"max_rounds": [20.0, 0.0], "max_tool_calls": [20.0, 0.0]}
    per_task = {t["name"]: t["y"] for t in by_task["data"]}
    assert per_task == {"faq": [25.0, None], "research": [100.0, 0.0]}


def test_loop_events_are_one_panel_per_backend_model_stacked_by_kind():
    rows = [
        {"bucket": T0, "backend": "openai", "model": "gpt-4o", "kind": "exact_repeat", "n": 3},
        {"bucket": T0 + HOUR, "backend": "openai", "model": "gpt-4o", "kind": "oscillation", "n": 1},
        {"bucket": T0, "backend": "local", "model": "", "kind": "exact_repeat", "n": 2},
        {"bucket": T0, "backend": "local", "model": "", "kind": "no_progress", "n": 1, "action": "observe"},
    ]
    figure = charts.loop_events_chart(rows, [T0, T0 + HOUR])
    assert figure["layout"]["barmode"] == "stack"
    panels = [a["text"] for a in figure["layout"]["annotations"]]
    assert panels == ["<b>openai / gpt-4o</b> · 4", "<b>local</b> · 2"]
    traces = {(t["yaxis"], t["name"]): t["y"] for t in figure["data"]}
    assert traces == {
        ("y", "exact_repeat"): [3, 0],
        ("y", "oscillation"): [0, 1],
        ("y2", "exact_repeat"): [2, 0],
    }
    assert [t["showlegend"] for t in figure["data"]] == [True, True, False]


def test_action_counts_per_backend_model():
    rows = [
        {"backend": "openai", "model": "gpt-4o", "kind": "exact_repeat", "action": a, "feedback": "", "n": n}
        for a, n in (("observe", 5), ("correct", 3), ("terminate", 1))
    ]
    assert charts.action_table(rows) == [
        {"name": "openai / gpt-4o", "observe": 5, "correct": 3, "handoff": 0, "terminate": 1, "total": 9}
    ]


def test_cost_per_successful_task_charges_the_failures_to_the_successes():
    by_backend = [
        {"backend": "anthropic", "succeeded": 4, "cost": 10.0, "success_cost": 6.0, "burned": 3.0},
        {"backend": "local", "succeeded": 0, "cost": 1.0, "success_cost": 0.0, "burned": 0.0},
    ]
    success, burned = charts.cost_charts(by_backend)
    assert success["data"][0]["y"] == [2.5, None]
    assert success["data"][0]["text"] == ["$2.500", "no success"]
    stacked = {t["name"]: t["y"] for t in burned["data"]}
    assert stacked == {"after the first loop detection": [3.0, 0.0], "the rest": [7.0, 1.0]}


def test_repeat_triggers_are_per_thousand_tool_calls_of_the_backend():
    rows = [
        {
            "backend": "openai",
            "model": "",
            "kind": "exact_repeat",
            "action": "observe",
            "feedback": "",
            "n": 6,
        },
        {
            "backend": "openai",
            "model": "",
            "kind": "no_progress",
            "action": "correct",
            "feedback": "",
            "n": 9,
        },
    ]
    figure = charts.repeat_triggers_chart(
        rows, [{"backend": "openai", "tool_calls": 3000}], ("exact_repeat",)
    )
    assert [(t["name"], t["y"]) for t in figure["data"]] == [("exact_repeat", [2.0])]


def test_the_false_alarm_rate_counts_reviewed_interventions_only():
    rows = [
        {
            "backend": "openai",
            "model": "",
            "kind": "k",
            "action": "correct",
            "feedback": "false_alarm",
            "n": 1,
        },
        {"backend": "openai", "model": "", "kind": "k", "action": "handoff", "feedback": "true_loop", "n": 3},
        {"backend": "openai", "model": "", "kind": "k", "action": "correct", "feedback": "", "n": 50},
        {
            "backend": "openai",
            "model": "",
            "kind": "k",
            "action": "observe",
            "feedback": "false_alarm",
            "n": 9,
        },
    ]
    figure, table, overall = charts.false_alarm_figures(rows)
    assert overall == {"reviewed": 4, "false_alarm": 1, "rate": 25.0}
    assert table[0]["rate"] == 25.0 and figure["data"][0]["text"] == ["1/4"]
