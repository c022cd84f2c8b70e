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


# --- issue 15: axes, colours, clicks, marks; issue 11: bounded and escaped ---------------------------


def _loop_rows(pairs: int, buckets: list[datetime], kinds=("exact_repeat", "no_progress")) -> list[dict]:
    return [
        {"bucket": b, "backend": f"b{p}", "model": f"m{p}", "kind": kind, "n": p + 1}
        for p in range(pairs)
        for b in buckets
        for kind in kinds
    ]


def test_the_loop_chart_has_its_time_axis_on_the_bottom_panel_and_y_titles_at_every_size():
    buckets = [T0 + i * HOUR for i in range(4)]
    for pairs in (1, 2, 5, charts.MAX_FACETS + 3):
        figure = charts.loop_events_chart(_loop_rows(pairs, buckets), buckets, HOUR)
        layout = figure["layout"]
        xaxes = sorted((k for k in layout if k.startswith("xaxis")), key=lambda k: int(k[5:] or 1))
        panels = min(pairs, charts.MAX_FACETS)
        assert len(xaxes) == panels
        # exactly one axis shows its times: the bottom panel's (the lowest domain)
        labelled = [k for k in xaxes if layout[k]["showticklabels"]]
        bottom = min(xaxes, key=lambda k: layout["y" + k[1:]]["domain"][0])
        assert labelled == [bottom], pairs
        assert all(layout["y" + k[1:]]["title"]["text"] == "interventions" for k in xaxes)


def test_a_kind_keeps_its_colour_whatever_else_a_view_holds():
    buckets = [T0]
    alone = charts.loop_events_chart(_loop_rows(1, buckets, kinds=("no_progress",)), buckets, HOUR)
    mixed = charts.loop_events_chart(
        _loop_rows(1, buckets, kinds=("budget", "exact_repeat", "no_progress")), buckets, HOUR
    )

    def colours(figure):
        return {t["legendgroup"]: t["marker"]["color"] for t in figure["data"]}

    assert colours(alone)["no_progress"] == colours(mixed)["no_progress"]
    assert len(set(colours(mixed).values())) == 3
    # the repeat chart uses the same colours for the same kinds
    repeat = charts.repeat_triggers_chart(
        [{"backend": "b0", "kind": "exact_repeat", "n": 2}],
        [{"backend": "b0", "tool_calls": 100, "runs": 1}],
        ("exact_repeat", "oscillation"),
    )
    assert repeat["data"][0]["marker"]["color"] == colours(mixed)["exact_repeat"]
    # a backend's or a task type's colour depends on its name only
    assert (
        charts.color_of("openai") == charts.color_of("openai")
        and charts.color_of("other") == charts.OTHER_COLOR
    )
    assert charts.ACTION_COLORS["terminate"] == charts.color_of("terminate")


def test_a_loop_bar_carries_what_opens_its_alerts():
    buckets = [T0, T0 + HOUR]
    rows = _loop_rows(charts.MAX_FACETS + 2, buckets, kinds=("oscillation",))
    figure = charts.loop_events_chart(rows, buckets, HOUR)
    assert figure["layout"]["meta"] == {"step_s": 3600}
    metas = [t["meta"] for t in figure["data"]]
    busiest = f"b{charts.MAX_FACETS + 1}"
    assert {"backend": busiest, "model": f"m{charts.MAX_FACETS + 1}", "kind": "oscillation"} in metas
    # the "other" panel opens the kind's alerts of every backend
    assert metas[-1] == {"backend": "", "model": "", "kind": "oscillation"}
    assert figure["data"][0]["x"] == ["2026-11-29T08:00:00Z", "2026-11-29T09:00:00Z"]


def test_threshold_changes_are_marked_on_time_axes():
    figure = charts.loop_events_chart(_loop_rows(2, [T0]), [T0], HOUR)
    marked = charts.with_change_marks(
        figure, [{"at": T0 + timedelta(minutes=20), "text": "acme update <b>x</b>"}]
    )
    line = marked["layout"]["shapes"][-1]
    assert (line["x0"], line["yref"], line["line"]["dash"]) == ("2026-11-29T08:20:00Z", "paper", "dot")
    note = marked["layout"]["annotations"][-1]
    assert note["text"] == "thresholds" and note["hovertext"] == "acme update &lt;b&gt;x&lt;/b&gt;"
    unmarked = charts.with_change_marks(charts.loop_events_chart(_loop_rows(2, [T0]), [T0], HOUR), [])
    assert "shapes" not in unmarked["layout"]


def test_durations_read_as_people_say_them():
    assert [
        charts.duration_text(d)
        for d in (
            timedelta(minutes=15),
            timedelta(minutes=1),
            timedelta(hours=3),
            timedelta(days=7),
            timedelta(seconds=45),
        )
    ] == ["15 min", "1 min", "3 h", "7 d", "45 s"]


def _strings(value):
    """The strings Plotly may draw: not `meta` and `customdata`, which carry raw names for a click
    and are never put in a hover template as text."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in ("meta", "customdata"):
                yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def test_names_a_tenant_chose_never_reach_plotly_as_markup():
    hostile = '<a href="https://evil.example">x</a>'
    buckets = [T0]
    rows = [{"bucket": T0, "backend": hostile, "model": hostile, "kind": "exact_repeat", "n": 3}]
    by_backend = [
        {
            "backend": hostile,
            "runs": 2,
            "succeeded": 1,
            "cost": 1.0,
            "success_cost": 0.5,
            "burned": 0.2,
            "tool_calls": 9,
        }
    ]
    figures = [
        charts.loop_events_chart(rows, buckets, HOUR),
        *charts.cost_charts(by_backend),
        charts.repeat_triggers_chart([{**rows[0], "action": "correct"}], by_backend, ("exact_repeat",)),
        charts.false_alarm_figures([{**rows[0], "action": "correct", "feedback": "false_alarm"}])[0],
        *charts.budget_share_charts(
            [{"bucket": T0, "task_type": hostile, "budget_type": hostile, "runs": 1}], buckets
        ),
        charts.long_tail_chart({hostile: {3: 1}}, metric_label="model rounds"),
    ]
    for figure in figures:
        drawn = [s for key in ("data", "layout") for s in _strings(figure[key])]
        assert not any("<a" in s for s in drawn), figure
        assert any("&lt;a href" in s for s in drawn), figure


def test_two_thousand_backend_model_pairs_make_a_bounded_page():
    buckets = [T0 + i * HOUR for i in range(24)]
    pairs = 2000
    rows = [
        {
            "bucket": buckets[p % 24],
            "backend": f"backend-{p % 400}",
            "model": f"model-{p}",
            "kind": "exact_repeat",
            "n": 1,
        }
        for p in range(pairs)
    ]
    loops = charts.loop_events_chart(rows, buckets, HOUR)
    assert len({t["yaxis"] for t in loops["data"]}) == charts.MAX_FACETS
    assert "1993 other backend / model pairs" in loops["layout"]["annotations"][-1]["text"]
    assert sum(sum(t["y"]) for t in loops["data"]) == pairs  # nothing dropped, the rest summed
    table = charts.action_table([{**r, "action": "correct"} for r in rows])
    assert len(table) == charts.MAX_TABLE_ROWS and table[-1]["other"]
    assert sum(line["total"] for line in table) == pairs
    by_backend = [
        {
            "backend": f"backend-{b}",
            "runs": 5,
            "succeeded": 1,
            "cost": 1.0,
            "success_cost": 0.1,
            "burned": 0.1,
            "tool_calls": 10,
            "running": 0,
        }
        for b in range(400)
    ]
    bounded = charts.backends_bounded(by_backend)
    assert len(bounded) == charts.MAX_SERIES and bounded[-1]["backend"] == "other"
    assert (
        sum(line["runs"] for line in bounded) == 2000 and bounded[-1]["merged"] == 400 - charts.MAX_SERIES + 1
    )
    success, _ = charts.cost_charts(bounded)
    assert (
        len(success["data"][0]["x"]) == charts.MAX_SERIES
        and success["data"][0]["x"][-1] == "389 other backends"
    )
    repeats = charts.repeat_triggers_chart(rows, bounded, ("exact_repeat",))
    assert len(repeats["data"][0]["x"]) == charts.MAX_SERIES
    assert sum(c[0] for c in repeats["data"][0]["customdata"]) == pairs
    tail = charts.long_tail_chart(
        {f"task-{i}": {i + 1: 1} for i in range(60)}, metric_label="rounds", selected="task-59"
    )
    assert len(tail["data"]) <= charts.MAX_TABLE_ROWS and any(
        t["visible"] and t["name"] == "task-59" for t in tail["data"]
    )
    budget_type, budget_task = charts.budget_share_charts(
        [
            {"bucket": T0, "task_type": f"t{i}", "budget_type": f"budget-{i}" if i else "other", "runs": 1}
            for i in range(100)
        ],
        [T0],
    )
    assert len(budget_type["data"]) == charts.MAX_SERIES and len(budget_task["data"]) == charts.MAX_SERIES
    assert sum(t["customdata"][0][0] for t in budget_type["data"]) == 100
