"""Plotly figures of the overview, as plain dicts (the template hands them to Plotly.newPlot).

Pure: rows in, figure out; no query, no clock. Dicts rather than plotly.graph_objects: building and
validating graph objects cost more CPU than the page's queries.
"""

from __future__ import annotations

import bisect
import math
import zlib
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

ACTIONS = ("observe", "correct", "handoff", "terminate")
ACTION_COLORS = {"observe": "#9ca3af", "correct": "#2563eb", "handoff": "#d97706", "terminate": "#dc2626"}
# One colour per kind on every chart, whatever else is in view (a kind's colour never depends on which
# kinds a range holds).
KIND_COLORS = {
    "exact_repeat": "#2563eb",
    "oscillation": "#7c3aed",
    "interval_loop": "#0891b2",
    "perturbation": "#db2777",
    "repeated_error": "#dc2626",
    "clarification": "#65a30d",
    "monologue": "#a16207",
    "empty_responses": "#78716c",
    "no_progress": "#ea580c",
    "poll_budget": "#0f766e",
    "duplicate_write": "#9333ea",
    "budget": "#b91c1c",
    "duplicate_side_effect": "#1e3a8a",
}
PALETTE = (
    "#2563eb",
    "#dc2626",
    "#059669",
    "#d97706",
    "#7c3aed",
    "#0891b2",
    "#db2777",
    "#65a30d",
    "#0f766e",
    "#9333ea",
    "#ea580c",
    "#a16207",
)
OTHER = "other"
OTHER_COLOR = "#9ca3af"
PERCENTILES = ((50, "p50"), (90, "p90"), (99, "p99"))
# A tenant decides how many backends, models, task types and budget names its runs carry: every panel,
# series, table and menu of the page is capped, the rest summed as "other", so that 2,000 distinct
# backend/model pairs cost no more to render than a dozen (issue 11; bench/overview_facets.py).
MAX_FACETS = 8  # backend/model panels of the loop chart
MAX_SERIES = 12  # backends of a per-backend chart, task types or budget names of a chart
MAX_TABLE_ROWS = 20  # rows of the tables under the charts
FACET_HEIGHT = 150
CHANGE_COLOR = "#6b7280"

Figure = dict[str, Any]


def label(text: str) -> str:
    """Text that Plotly draws as it is: Plotly renders a subset of HTML (<a href>, <b>, <br>) in names,
    tick labels, hover and annotations, and a tenant chooses its backend, model, kind and task names."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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


def color_of(name: str) -> str:
    """A colour of a name that is the same on every chart and every range: a kind's own colour, else
    one of the palette chosen by a hash of the name (not by its place in a list)."""
    if name in KIND_COLORS:
        return KIND_COLORS[name]
    if name in ACTION_COLORS:
        return ACTION_COLORS[name]
    if name == OTHER:
        return OTHER_COLOR
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


def top_names(volume: Mapping[str, float], limit: int) -> list[str]:
    """The names with the most volume (ties by name), at most `limit` with OTHER as the last when
    some were left out."""
    names = sorted(volume, key=lambda name: (-volume[name], name))
    if len(names) > limit:
        return [*names[: limit - 1], OTHER]
    return names


def duration_text(step: timedelta) -> str:
    """A chart step or a duration as people say it: 15 min, 3 h, 1 d, 45 s."""
    seconds = int(step.total_seconds())
    if seconds and seconds % 86400 == 0:
        return f"{seconds // 86400} d"
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds and seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def change_marks(changes: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """A dotted line and a marker on a time axis at each threshold change ({at, text}): the figures
    after it were made with other settings."""
    shapes, notes = [], []
    for change in changes:
        at = _iso(change["at"])
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": at,
                "x1": at,
                "y0": 0,
                "y1": 1,
                "line": {"dash": "dot", "width": 1.5, "color": CHANGE_COLOR},
            }
        )
        notes.append(
            {
                "x": at,
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "yanchor": "bottom",
                "text": "thresholds",
                "hovertext": label(change["text"]),
                "showarrow": False,
                "font": {"size": 10, "color": CHANGE_COLOR},
                "name": "threshold-change",
            }
        )
    return shapes, notes


def with_change_marks(figure: Figure, changes: list[dict[str, Any]]) -> Figure:
    if changes:
        shapes, notes = change_marks(changes)
        layout = figure["layout"]
        layout["shapes"] = [*layout.get("shapes", []), *shapes]
        layout["annotations"] = [*layout.get("annotations", []), *notes]
    return figure


# --- loop events ------------------------------------------------------------------------------------


def facet_name(backend: str, model: str) -> str:
    return f"{backend} / {model}" if model else backend


def loop_events_chart(
    rows: list[dict[str, Any]], buckets: list[datetime], step: timedelta | None = None
) -> Figure:
    """Interventions (correct and stronger) over time, one panel per backend/model, stacked by kind.

    rows: {bucket, backend, model, kind, n}; rows of action observe, if any, are left out. Each
    series carries its backend, model and kind in `meta` (backend and model "" in the "other" panel)
    and the layout the step in seconds: a click on a bar opens the alerts of its bucket (once per
    series, not per bar: 8 panels of 96 bars stay small)."""
    step = step or (buckets[1] - buckets[0] if len(buckets) > 1 else timedelta(hours=1))
    shown = [r for r in rows if r.get("action") != "observe"]
    volume: dict[str, int] = defaultdict(int)
    pairs: dict[str, tuple[str, str]] = {}
    for r in shown:
        name = facet_name(r["backend"], r["model"])
        volume[name] += r["n"]
        pairs[name] = (r["backend"], r["model"])
    facets = top_names(volume, MAX_FACETS)
    kinds = sorted({r["kind"] for r in shown})
    index = {bucket: i for i, bucket in enumerate(buckets)}
    counts: dict[tuple[str, str], list[int]] = {}
    for r in shown:
        facet = facet_name(r["backend"], r["model"])
        facet = facet if facet in facets else OTHER
        series = counts.setdefault((facet, r["kind"]), [0] * len(buckets))
        if r["bucket"] in index:
            series[index[r["bucket"]]] += r["n"]
    x = [_iso(b) for b in buckets]
    data: list[dict[str, Any]] = []
    panels = max(len(facets), 1)
    gap = 0.06 if panels > 1 else 0
    height = (1 - gap * (panels - 1)) / panels
    layout = _layout(
        barmode="stack",
        height=max(260, FACET_HEIGHT * panels + 80),
        margin={"l": 60, "r": 20, "t": 20, "b": 40},
        annotations=[],
        legend={"orientation": "h", "y": -0.08 if panels > 2 else -0.2},
        meta={"step_s": int(step.total_seconds())},
    )
    totals: dict[str, int] = defaultdict(int)
    for name, n in volume.items():
        totals[name if name in facets else OTHER] += n
    others = sum(1 for name in volume if name not in facets)
    for i, facet in enumerate(facets):
        axis = "" if i == 0 else str(i + 1)
        top = 1 - i * (height + gap)
        layout[f"yaxis{axis}"] = {
            "domain": [max(top - height, 0), top],
            "rangemode": "tozero",
            "title": {"text": "interventions", "font": {"size": 10}},
        }
        # The bottom panel carries the time axis; the others share it (matches) without labels.
        layout[f"xaxis{axis}"] = {"type": "date", "anchor": f"y{axis}", "showticklabels": i == panels - 1}
        if i:
            layout[f"xaxis{axis}"]["matches"] = "x"
        backend, model = pairs.get(facet, ("", "")) if facet != OTHER else ("", "")
        title = f"{others} other backend / model pairs" if facet == OTHER else facet
        layout["annotations"].append(
            {
                "text": f"<b>{label(title)}</b> · {totals[facet]}",
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
                    "name": label(kind),
                    "legendgroup": kind,
                    "showlegend": kind not in {t["legendgroup"] for t in data},
                    "x": x,
                    "y": series,
                    "meta": {"backend": backend, "model": model, "kind": kind},
                    "xaxis": f"x{axis}",
                    "yaxis": f"y{axis}",
                    "marker": {"color": color_of(kind)},
                    "hovertemplate": f"{label(title)}<br>{label(kind)}: %{{y}}<br>%{{x}}"
                    "<br>click to list them<extra></extra>",
                }
            )
    return {"data": data, "layout": layout}


def action_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Detections per backend/model and action, busiest first, with the total; past MAX_TABLE_ROWS
    the rest summed in a last row "N other backend / model pairs"."""
    table: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys((*ACTIONS, "total"), 0))
    for r in rows:
        line = table[facet_name(r["backend"], r["model"])]
        line[r["action"]] = line.get(r["action"], 0) + r["n"]
        line["total"] += r["n"]
    ordered = sorted(table.items(), key=lambda item: (-item[1]["total"], item[0]))
    lines = [{"name": name, **counts} for name, counts in ordered[: MAX_TABLE_ROWS - 1]]
    rest = ordered[MAX_TABLE_ROWS - 1 :]
    if len(rest) == 1:
        lines.append({"name": rest[0][0], **rest[0][1]})
    elif rest:
        other = dict.fromkeys((*ACTIONS, "total"), 0)
        for _, counts in rest:
            for key, n in counts.items():
                other[key] = other.get(key, 0) + n
        lines.append({"name": f"{len(rest)} other backend / model pairs", "other": True, **other})
    return lines


def backends_bounded(by_backend: list[dict[str, Any]], limit: int = MAX_SERIES) -> list[dict[str, Any]]:
    """The per-backend lines of run_figures, the busiest `limit` - 1 by runs and the rest summed in an
    OTHER line (numbers summed field by field): what every per-backend chart and table shows."""
    if len(by_backend) <= limit:
        return by_backend
    names = top_names({line["backend"]: line["runs"] for line in by_backend}, limit)
    kept = [line for line in by_backend if line["backend"] in names]
    other: dict[str, Any] = {"backend": OTHER, "merged": 0}
    for line in by_backend:
        if line["backend"] in names:
            continue
        other["merged"] += 1
        for key, value in line.items():
            if key != "backend" and isinstance(value, int | float):
                other[key] = other.get(key, 0) + value
    return [*kept, other]


def backend_of(name: str, shown: set[str]) -> str:
    return name if name in shown else OTHER


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
    by_type = _capped_series(by_type, len(buckets))
    task_finished, task_budget = _capped_tasks(task_finished, task_budget, len(buckets))
    by_type_fig = {
        "data": [
            {
                "type": "bar",
                "x": x,
                "y": [_share(n, total) for n, total in zip(series, finished, strict=True)],
                "customdata": [[n, total] for n, total in zip(series, finished, strict=True)],
                "name": label(budget_type),
                "marker": {"color": color_of(budget_type)},
                "hovertemplate": f"{label(budget_type)}: %{{y:.1f}} %% (%{{customdata[0]}} of %{{customdata[1]}})"
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
    tasks = sorted(task_finished, key=lambda task: (task == OTHER, task))
    by_task_fig = {
        "data": [
            {
                "type": "scatter",
                "mode": "lines+markers",
                "connectgaps": False,
                "name": label(task_type),
                "x": x,
                "y": [
                    _share(n, total) if total else None
                    for n, total in zip(task_budget[task_type], task_finished[task_type], strict=True)
                ],
                "customdata": [
                    [n, total]
                    for n, total in zip(task_budget[task_type], task_finished[task_type], strict=True)
                ],
                "line": {"color": color_of(task_type)},
                "hovertemplate": f"{label(task_type)}: %{{y:.1f}} %% (%{{customdata[0]}} of %{{customdata[1]}})"
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


def _capped_series(series: dict[str, list[int]], length: int) -> dict[str, list[int]]:
    """At most MAX_SERIES series, the biggest; the rest summed as OTHER."""
    if len(series) <= MAX_SERIES:
        return series
    names = top_names({name: sum(values) for name, values in series.items()}, MAX_SERIES)
    keep = set(names) - {OTHER}
    out = {name: series[name] for name in names if name != OTHER}
    out[OTHER] = [0] * length  # a series a tenant named "other" joins the rest
    for name, values in series.items():
        if name not in keep:
            out[OTHER] = [a + b for a, b in zip(out[OTHER], values, strict=True)]
    return out


def _capped_tasks(
    finished: dict[str, list[int]], budget: dict[str, list[int]], length: int
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    if len(finished) <= MAX_SERIES:
        return finished, budget
    names = top_names({name: sum(values) for name, values in finished.items()}, MAX_SERIES)
    keep = set(names) - {OTHER}
    out_finished = {name: finished[name] for name in keep}
    out_budget = {name: budget[name] for name in keep}
    out_finished[OTHER], out_budget[OTHER] = [0] * length, [0] * length
    for name in finished:
        if name not in keep:
            out_finished[OTHER] = [a + b for a, b in zip(out_finished[OTHER], finished[name], strict=True)]
            out_budget[OTHER] = [a + b for a, b in zip(out_budget[OTHER], budget[name], strict=True)]
    return out_finished, out_budget


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


def busiest_tasks(hist: dict[str, dict[int, int]], limit: int = MAX_TABLE_ROWS, keep: str = "") -> list[str]:
    """The task types with the most finished runs (at most `limit`, `keep` always among them), by name."""
    volume = {task: sum(counts.values()) for task, counts in hist.items()}
    names = sorted(volume, key=lambda task: (-volume[task], task))[:limit]
    if keep in volume and keep not in names:
        names[-1] = keep
    return sorted(names)


def tail_table(histograms: dict[str, dict[str, dict[int, int]]]) -> list[dict[str, Any]]:
    """Per task type: runs and the percentiles of rounds and of tool calls (the MAX_TABLE_ROWS task
    types with the most finished runs)."""
    rounds, calls = histograms.get("rounds", {}), histograms.get("tool_calls", {})
    return [
        {
            "task_type": task,
            "rounds": percentiles(rounds.get(task, {})),
            "tool_calls": percentiles(calls.get(task, {})),
        }
        for task in busiest_tasks({**calls, **rounds})
    ]


def long_tail_chart(hist: dict[str, dict[int, int]], *, metric_label: str, selected: str = "") -> Figure:
    """Runs per bin of `metric` (log count axis), one task type at a time (a menu switches), with its
    p50 / p90 / p99 / max marked. Each bar carries [task type, lo, hi] for the click that lists them."""
    if not hist:
        return {"data": [], "layout": _layout()}
    tasks = busiest_tasks(hist, keep=selected)  # a menu of at most MAX_TABLE_ROWS task types
    hist = {task: hist[task] for task in tasks}
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
                "name": label(task),
                "x": labels,
                "y": [c or None for c in counts],  # nothing drawn for an empty bin on a log axis
                "customdata": [[task, lo, hi] for lo, hi in bins],
                "visible": task == selected,
                "marker": {"color": color_of(task)},
                "hovertemplate": f"{label(task)}: %{{y}} runs with %{{x}} {metric_label}<br>click to list them<extra></extra>",
            }
        )
        marks[task] = _percentile_marks(stats[task], bins, labels)
    buttons = [
        {
            "label": f"{label(task)} ({stats[task]['runs']})",
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


def backend_label(line: dict[str, Any]) -> str:
    """A backend as a chart shows it (escaped); the OTHER line says how many it holds."""
    if line["backend"] == OTHER and line.get("merged"):
        return f"{line['merged']} other backends"
    return label(line["backend"])


def cost_charts(by_backend: list[dict[str, Any]]) -> tuple[Figure, Figure]:
    """Cost per successful task (all spend over the successes) and money burned in loops, per backend
    (pass backends_bounded(): one bar per line)."""
    names = [backend_label(row) for row in by_backend]
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
                "marker": {"color": [color_of(row["backend"]) for row in by_backend]},
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
    rows: list[dict[str, Any]],
    by_backend: list[dict[str, Any]],
    repeat_kinds,
    window: tuple[datetime, datetime] | None = None,
) -> Figure:
    """Repeat-signature detections per backend, stacked by kind, per 1,000 tool calls of its runs.

    by_backend: backends_bounded() lines (detections of the other backends count under OTHER). Each
    bar carries [triggers, tool calls, backend ("" for OTHER), kind, from, to]: a click opens the
    alerts behind it (window: the page's range)."""
    calls = {row["backend"]: row["tool_calls"] for row in by_backend}
    names = {row["backend"]: backend_label(row) for row in by_backend}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for r in rows:
        if r["kind"] in repeat_kinds:
            backend = r["backend"] if r["backend"] in calls or OTHER not in calls else OTHER
            counts[(backend, r["kind"])] += r["n"]
    backends = sorted({b for b, _ in counts} | set(calls), key=lambda b: (b == OTHER, b))
    kinds = [k for k in repeat_kinds if any(kind == k for _, kind in counts)]
    start, end = (_iso(window[0]), _iso(window[1])) if window else ("", "")
    data = []
    for kind in kinds:
        ns = [counts.get((b, kind), 0) for b in backends]
        data.append(
            {
                "type": "bar",
                "name": label(kind),
                "x": [names.get(b, label(b)) for b in backends],
                "y": [
                    round(1000 * n / calls[b], 3) if calls.get(b) else None
                    for n, b in zip(ns, backends, strict=True)
                ],
                "customdata": [
                    [n, calls.get(b, 0), "" if b == OTHER else b, kind, start, end]
                    for n, b in zip(ns, backends, strict=True)
                ],
                "marker": {"color": color_of(kind)},
                "hovertemplate": f"%{{x}} {label(kind)}: %{{customdata[0]}} triggers, %{{y}} per 1,000 of "
                "%{customdata[1]} tool calls<br>click to list them<extra></extra>",
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
    if len(reviewed) > MAX_SERIES:
        shown = set(top_names({b: sum(c.values()) for b, c in reviewed.items()}, MAX_SERIES))
        merged: dict[str, dict[str, int]] = defaultdict(lambda: {"true_loop": 0, "false_alarm": 0})
        for backend, counts in reviewed.items():
            for key, n in counts.items():
                merged[backend_of(backend, shown)][key] += n
        reviewed = merged
    table: list[dict[str, Any]] = []
    for backend in sorted(reviewed, key=lambda b: (b == OTHER, b)):
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
                "x": [label(r["backend"]) for r in table],
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
