"""Plotly figures of the overview, as plain dicts (the template hands them to Plotly.newPlot).

Pure: rows in, figure out; no query, no clock. Dicts rather than plotly.graph_objects: building and
validating graph objects cost more CPU than the page's queries.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from datetime import datetime
from typing import Any

ACTIONS = ("observe", "correct", "handoff", "terminate")
ACTION_COLORS = {"observe": "#9ca3af", "correct": "#2563eb", "handoff": "#d97706", "terminate": "#dc2626"}
PALETTE = (
    "#2563eb",
    "#dc2626",
    "#059669",
    "#d97706",
    "#7c3aed",
    "#0891b2",
    "#db2777",
    "#65a30d",
    "#78716c",
    "#0f766e",
    "#9333ea",
    "#ea580c",
)
PERCENTILES = ((50, "p50"), (90, "p90"), (99, "p99"))
MAX_FACETS = 8  # backend/model panels of the loop chart; the rest are summed as "other"
FACET_HEIGHT = 150

Figure = dict[str, Any]


def _layout(**extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "margin": {"l": 50, "r": 20, "t": 30, "b": 40},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "legend": {"orientation": "h", "y": -0.2},
        "hovermode": "closest",
    }
    layout.update(extra)
    return layout


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def color_of(name: str, names: list[str]) -> str:
    return PALETTE[names.index(name) % len(PALETTE)] if name in names else PALETTE[-1]


# --- loop events ------------------------------------------------------------------------------------


def facet_name(backend: str, model: str) -> str:
    return f"{backend} / {model}" if model else backend


def loop_events_chart(rows: list[dict[str, Any]], buckets: list[datetime]) -> Figure:
    """Interventions (correct and stronger) over time, one panel per backend/model, stacked by kind.

    rows: {bucket, backend, model, kind, n}; rows of action observe, if any, are left out."""
    shown = [r for r in rows if r.get("action") != "observe"]
    volume: dict[str, int] = defaultdict(int)
    for r in shown:
        volume[facet_name(r["backend"], r["model"])] += r["n"]
    facets = sorted(volume, key=lambda name: (-volume[name], name))
    if len(facets) > MAX_FACETS:
        facets = [*facets[: MAX_FACETS - 1], "other"]
    kinds = sorted({r["kind"] for r in shown})
    index = {bucket: i for i, bucket in enumerate(buckets)}
    counts: dict[tuple[str, str], list[int]] = {}
    for r in shown:
        facet = facet_name(r["backend"], r["model"])
        facet = facet if facet in facets else "other"
        series = counts.setdefault((facet, r["kind"]), [0] * len(buckets))
        if r["bucket"] in index:
            series[index[r["bucket"]]] += r["n"]
    x = [_iso(b) for b in buckets]
    data: list[dict[str, Any]] = []
    n = max(len(facets), 1)
    gap = 0.06 if n > 1 else 0
    height = (1 - gap * (n - 1)) / n
    layout = _layout(
        barmode="stack",
        height=max(260, FACET_HEIGHT * n + 80),
        margin={"l": 50, "r": 20, "t": 20, "b": 40},
        annotations=[],
        legend={"orientation": "h", "y": -0.08 if n > 2 else -0.2},
    )
    totals: dict[str, int] = defaultdict(int)
    for name, n in volume.items():
        totals[name if name in facets else "other"] += n
    for i, facet in enumerate(facets):
        axis = "" if i == 0 else str(i + 1)
        top = 1 - i * (height + gap)
        layout[f"yaxis{axis}"] = {"domain": [max(top - height, 0), top], "rangemode": "tozero"}
        layout[f"xaxis{axis}"] = {"type": "date", "anchor": f"y{axis}", "showticklabels": i == n - 1}
        if i:
            layout[f"xaxis{axis}"]["matches"] = "x"
        layout["annotations"].append(
            {
                "text": f"<b>{facet}</b> · {totals[facet]}",
                "xref": "paper",
                "yref": "paper",
                "x": 0,
                "y": top,
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
            }
        )
        for kind in kinds:
            if (facet, kind) not in counts:
                continue
            series = counts[(facet, kind)]
            data.append(
                {
                    "type": "bar",
                    "name": kind,
                    "legendgroup": kind,
                    "showlegend": kind not in {t["name"] for t in data},
                    "x": x,
                    "y": series,
                    "xaxis": f"x{axis}",
                    "yaxis": f"y{axis}",
                    "marker": {"color": color_of(kind, kinds)},
                    "hovertemplate": f"{facet}<br>{kind}: %{{y}}<br>%{{x}}<extra></extra>",
                }
            )
    return {"data": data, "layout": layout}


def action_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Detections per backend/model and action, busiest first, with the total."""
    table: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys((*ACTIONS, "total"), 0))
    for r in rows:
        line = table[facet_name(r["backend"], r["model"])]
        line[r["action"]] = line.get(r["action"], 0) + r["n"]
        line["total"] += r["n"]
    return [
        {"name": name, **counts}
        for name, counts in sorted(table.items(), key=lambda item: (-item[1]["total"], item[0]))
    ]


# --- budgets ------------------------------------------------------------------------------------------


def budget_share_charts(rows: list[dict[str, Any]], buckets: list[datetime]) -> tuple[Figure, Figure]:
    """Share of finished runs ended by a budget over time: stacked by budget type, and per task type."""
    index = {bucket: i for i, bucket in enumerate(buckets)}
    finished = [0] * len(buckets)
    by_type: dict[str, list[int]] = {}
    task_finished: dict[str, list[int]] = {}
    task_budget: dict[str, list[int]] = {}
    for r in rows:
        i = index.get(r["bucket"])
        if i is None:
            continue
        finished[i] += r["runs"]
        task_finished.setdefault(r["task_type"], [0] * len(buckets))[i] += r["runs"]
        task_budget.setdefault(r["task_type"], [0] * len(buckets))
        if r["budget_type"]:
            by_type.setdefault(r["budget_type"], [0] * len(buckets))[i] += r["runs"]
            task_budget[r["task_type"]][i] += r["runs"]
    x = [_iso(b) for b in buckets]
    types = sorted(by_type)
    by_type_fig = {
        "data": [
            {
                "type": "bar",
                "name": budget_type,
                "x": x,
                "y": [_share(n, total) for n, total in zip(series, finished, strict=True)],
                "customdata": [[n, total] for n, total in zip(series, finished, strict=True)],
                "marker": {"color": color_of(budget_type, types)},
                "hovertemplate": f"{budget_type}: %{{y:.1f}} %% (%{{customdata[0]}} of %{{customdata[1]}})"
                "<br>%{x}<extra></extra>",
            }
            for budget_type, series in sorted(by_type.items())
        ],
        "layout": _layout(
            barmode="stack",
            height=300,
            yaxis={"title": {"text": "% of finished runs"}, "ticksuffix": " %", "rangemode": "tozero"},
            xaxis={"type": "date"},
        ),
    }
    tasks = sorted(task_finished)
    by_task_fig = {
        "data": [
            {
                "type": "scatter",
                "mode": "lines+markers",
                "connectgaps": False,
                "name": task_type,
                "x": x,
                "y": [
                    _share(n, total) if total else None
                    for n, total in zip(task_budget[task_type], task_finished[task_type], strict=True)
                ],
                "customdata": [
                    [n, total]
                    for n, total in zip(task_budget[task_type], task_finished[task_type], strict=True)
                ],
                "line": {"color": color_of(task_type, tasks)},
                "hovertemplate": f"{task_type}: %{{y:.1f}} %% (%{{customdata[0]}} of %{{customdata[1]}})"
                "<br>%{x}<extra></extra>",
            }
            for task_type in tasks
        ],
        "layout": _layout(
            height=300,
            yaxis={"title": {"text": "% ended by a budget"}, "ticksuffix": " %", "rangemode": "tozero"},
            xaxis={"type": "date"},
        ),
    }
    return by_type_fig, by_task_fig


def _share(part: int, whole: int) -> float:
    return round(100 * part / whole, 2) if whole else 0.0


# --- the long tail ------------------------------------------------------------------------------------


def tail_bins(top: int) -> list[tuple[int, int]]:
    """Bins [lo, hi] of whole numbers up to `top`, two per doubling (1, 2, 3, 4, 5-6, 7-8, 9-12, ...):
    evenly spaced on a log axis, so a long tail stays readable."""
    bins = [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]
    lo = 5
    while bins[-1][1] < top:
        power = 1 << (lo - 1).bit_length() - 1  # the largest power of two below lo
        hi = lo + power // 2 - 1
        bins.append((lo, hi))
        lo = hi + 1
    return [(lo, hi) for lo, hi in bins if lo <= max(top, 1)]


def bin_label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def percentiles(hist: dict[int, int]) -> dict[str, int]:
    """Nearest-rank p50, p90, p99 and the max of a histogram {value: count} (exact, from counts)."""
    total = sum(hist.values())
    if not total:
        return {}
    out: dict[str, int] = {}
    values = sorted(hist)
    targets = [(name, -(-p * total // 100)) for p, name in PERCENTILES]  # ceil(p% of n): the rank
    seen = 0
    for value in values:
        seen += hist[value]
        for name, rank in targets:
            if name not in out and seen >= rank:
                out[name] = value
    out["max"] = values[-1]
    out["runs"] = total
    return out


def tail_table(histograms: dict[str, dict[str, dict[int, int]]]) -> list[dict[str, Any]]:
    """Per task type: runs and the percentiles of rounds and of tool calls."""
    rounds, calls = histograms.get("rounds", {}), histograms.get("tool_calls", {})
    return [
        {
            "task_type": task,
            "rounds": percentiles(rounds.get(task, {})),
            "tool_calls": percentiles(calls.get(task, {})),
        }
        for task in sorted(set(rounds) | set(calls))
    ]


def long_tail_chart(hist: dict[str, dict[int, int]], *, metric_label: str, selected: str = "") -> Figure:
    """Runs per bin of `metric` (log count axis), one task type at a time (a menu switches), with its
    p50 / p90 / p99 / max marked. Each bar carries [task type, lo, hi] for the click that lists them."""
    tasks = sorted(hist)
    if not tasks:
        return {"data": [], "layout": _layout()}
    stats = {task: percentiles(hist[task]) for task in tasks}
    if selected not in tasks:  # the longest tail first: what the chart is for
        selected = max(tasks, key=lambda task: (stats[task]["p99"], stats[task]["runs"], task))
    top = max(max(h) for h in hist.values() if h)
    bins = tail_bins(top)
    if not any(0 in h for h in hist.values()):
        bins = bins[1:]
    labels = [bin_label(lo, hi) for lo, hi in bins]
    starts = [lo for lo, _ in bins]
    data = []
    marks: dict[str, tuple[list, list]] = {}
    highest = 1
    for task in tasks:
        counts = [0] * len(bins)
        for value, n in hist[
            task
        ].items():  # thousands of distinct tool-call counts: find the bin by bisection
            counts[bisect.bisect_right(starts, value) - 1] += n
        highest = max(highest, *counts)
        data.append(
            {
                "type": "bar",
                "name": task,
                "x": labels,
                "y": [c or None for c in counts],  # nothing drawn for an empty bin on a log axis
                "customdata": [[task, lo, hi] for lo, hi in bins],
                "visible": task == selected,
                "marker": {"color": color_of(task, tasks)},
                "hovertemplate": f"{task}: %{{y}} runs with %{{x}} {metric_label}<br>click to list them<extra></extra>",
            }
        )
        marks[task] = _percentile_marks(stats[task], bins, labels)
    buttons = [
        {
            "label": f"{task} ({stats[task]['runs']})",
            "method": "update",
            "args": [
                {"visible": [t == task for t in tasks]},
                {"shapes": marks[task][0], "annotations": marks[task][1]},
            ],
        }
        for task in tasks
    ]
    layout = _layout(
        height=340,
        bargap=0.08,
        showlegend=False,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        xaxis={"type": "category", "title": {"text": f"{metric_label} per run"}, "categoryarray": labels},
        # From half a run: on a log axis a bar starts at the bottom of the range, so a bin of one run
        # would otherwise be a sliver (log 1 = 0). Ranges of log axes are in powers of ten.
        yaxis={
            "type": "log",
            "title": {"text": "runs (log)"},
            "range": [math.log10(0.5), math.log10(highest * 2)],
            "dtick": 1 if highest >= 10 else "D2",
        },
        shapes=marks[selected][0],
        annotations=marks[selected][1],
        updatemenus=[
            {
                "buttons": buttons,
                "active": tasks.index(selected),
                "direction": "down",
                "x": 0,
                "y": 1.22,
                "xanchor": "left",
                "yanchor": "top",
                "showactive": True,
            }
        ],
    )
    return {"data": data, "layout": layout}


def _percentile_marks(
    stats: dict[str, int], bins: list[tuple[int, int]], labels: list[str]
) -> tuple[list, list]:
    """A dashed line at the bin of each of p50, p90, p99 and max, labelled with the value."""
    at: dict[str, list[str]] = defaultdict(list)
    for name in ("p50", "p90", "p99", "max"):
        value = stats[name]
        label = next(labels[i] for i, (lo, hi) in enumerate(bins) if lo <= value <= hi)
        at[label].append(f"{name} {value}")
    shapes, notes = [], []
    for label, names in at.items():
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": label,
                "x1": label,
                "y0": 0,
                "y1": 1,
                "line": {"dash": "dash", "width": 1.5, "color": "#111827"},
            }
        )
        notes.append(
            {
                "x": label,
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "yanchor": "bottom",
                "text": "<br>".join(names),
                "showarrow": False,
                "font": {"size": 11},
                "bgcolor": "rgba(255,255,255,0.8)",
            }
        )
    return shapes, notes


# --- cost ---------------------------------------------------------------------------------------------


def cost_charts(by_backend: list[dict[str, Any]]) -> tuple[Figure, Figure]:
    """Cost per successful task (all spend over the successes) and money burned in loops, per backend."""
    names = [row["backend"] for row in by_backend]
    per_success = [row["cost"] / row["succeeded"] if row["succeeded"] else None for row in by_backend]
    success_fig = {
        "data": [
            {
                "type": "bar",
                "x": names,
                "y": [round(v, 4) if v is not None else None for v in per_success],
                "text": [f"${v:.3f}" if v is not None else "no success" for v in per_success],
                "textposition": "outside",
                "customdata": [
                    [
                        row["succeeded"],
                        round(row["cost"], 2),
                        round(row["success_cost"] / row["succeeded"], 4) if row["succeeded"] else 0,
                    ]
                    for row in by_backend
                ],
                "marker": {"color": [color_of(n, names) for n in names]},
                "hovertemplate": "%{x}: $%{y} per successful task<br>%{customdata[0]} succeeded, "
                "$%{customdata[1]} spent in all<br>a succeeded run alone: $%{customdata[2]}<extra></extra>",
            }
        ],
        "layout": _layout(
            height=300,
            showlegend=False,
            yaxis={"title": {"text": "USD per successful task"}, "rangemode": "tozero"},
        ),
    }
    burned_fig = {
        "data": [
            {
                "type": "bar",
                "name": "after the first loop detection",
                "x": names,
                "y": [round(row["burned"], 4) for row in by_backend],
                "marker": {"color": "#dc2626"},
                "hovertemplate": "%{x}: $%{y} after the first loop detection<extra></extra>",
            },
            {
                "type": "bar",
                "name": "the rest",
                "x": names,
                "y": [round(row["cost"] - row["burned"], 4) for row in by_backend],
                "marker": {"color": "#cbd5e1"},
                "hovertemplate": "%{x}: $%{y} otherwise<extra></extra>",
            },
        ],
        "layout": _layout(
            barmode="stack", height=300, yaxis={"title": {"text": "USD"}, "rangemode": "tozero"}
        ),
    }
    return success_fig, burned_fig


# --- repeats, feedback, UNKNOWN ----------------------------------------------------------------------


def repeat_triggers_chart(
    rows: list[dict[str, Any]], by_backend: list[dict[str, Any]], repeat_kinds
) -> Figure:
    """Repeat-signature detections per backend, stacked by kind, per 1,000 tool calls of its runs."""
    calls = {row["backend"]: row["tool_calls"] for row in by_backend}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for r in rows:
        if r["kind"] in repeat_kinds:
            counts[(r["backend"], r["kind"])] += r["n"]
    backends = sorted({b for b, _ in counts} | set(calls))
    kinds = [k for k in repeat_kinds if any(kind == k for _, kind in counts)]
    data = []
    for kind in kinds:
        ns = [counts.get((b, kind), 0) for b in backends]
        data.append(
            {
                "type": "bar",
                "name": kind,
                "x": backends,
                "y": [
                    round(1000 * n / calls[b], 3) if calls.get(b) else None
                    for n, b in zip(ns, backends, strict=True)
                ],
                "customdata": [[n, calls.get(b, 0)] for n, b in zip(ns, backends, strict=True)],
                "marker": {"color": color_of(kind, list(repeat_kinds))},
                "hovertemplate": f"%{{x}} {kind}: %{{customdata[0]}} triggers, %{{y}} per 1,000 of "
                "%{customdata[1]} tool calls<extra></extra>",
            }
        )
    return {
        "data": data,
        "layout": _layout(
            barmode="stack",
            height=300,
            yaxis={"title": {"text": "per 1,000 tool calls"}, "rangemode": "tozero"},
        ),
    }


def false_alarm_figures(rows: list[dict[str, Any]]) -> tuple[Figure, list[dict[str, Any]], dict[str, Any]]:
    """The share of reviewed interventions operators marked false alarm, per backend and overall."""
    reviewed: dict[str, dict[str, int]] = defaultdict(lambda: {"true_loop": 0, "false_alarm": 0})
    for r in rows:
        if r["action"] != "observe" and r["feedback"] in ("true_loop", "false_alarm"):
            reviewed[r["backend"]][r["feedback"]] += r["n"]
    table: list[dict[str, Any]] = []
    for backend in sorted(reviewed):
        counts = reviewed[backend]
        n = counts["true_loop"] + counts["false_alarm"]
        table.append({"backend": backend, "reviewed": n, **counts, "rate": 100 * counts["false_alarm"] / n})
    total_false = sum(r["false_alarm"] for r in table)
    total = sum(r["reviewed"] for r in table)
    overall = {
        "reviewed": total,
        "false_alarm": total_false,
        "rate": 100 * total_false / total if total else None,
    }
    figure = {
        "data": [
            {
                "type": "bar",
                "x": [r["backend"] for r in table],
                "y": [round(r["rate"], 2) for r in table],
                "text": [f"{r['false_alarm']}/{r['reviewed']}" for r in table],
                "textposition": "outside",
                "marker": {"color": "#d97706"},
                "hovertemplate": "%{x}: %{y:.1f} %% false alarms (%{text} reviewed)<extra></extra>",
            }
        ],
        "layout": _layout(
            height=300,
            showlegend=False,
            yaxis={"title": {"text": "% false alarms"}, "ticksuffix": " %", "rangemode": "tozero"},
        ),
    }
    return figure, table, overall


def unknown_age_chart(ages: list[tuple[str, int]]) -> Figure:
    return {
        "data": [
            {
                "type": "bar",
                "x": [label for label, _ in ages],
                "y": [n for _, n in ages],
                "marker": {"color": ["#9ca3af", "#9ca3af", "#d97706", "#dc2626", "#dc2626", "#7f1d1d"]},
                "hovertemplate": "%{y} UNKNOWN for %{x}<extra></extra>",
            }
        ],
        "layout": _layout(
            height=260,
            showlegend=False,
            xaxis={"type": "category", "title": {"text": "UNKNOWN for"}},
            yaxis={"title": {"text": "operations"}, "rangemode": "tozero"},
        ),
    }
