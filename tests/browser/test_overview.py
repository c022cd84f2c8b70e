"""The overview in a real browser: the charts draw with the Plotly bundle we serve, and a bar of the
long tail lists its runs."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from ingest.models import Detection, Run
from tests.browser.helpers import member, sign_in


def _run(tenant, run_id: str, **fields) -> Run:
    fields.setdefault("started_at", timezone.now() - timedelta(hours=1))
    fields.setdefault("status", "succeeded")
    fields.setdefault("backend", "openai")
    fields.setdefault("model", "gpt-4o")
    return Run.objects.create(tenant=tenant, run_id=run_id, **fields)


def test_the_overview_draws_its_charts_and_a_tail_bar_lists_its_runs(page, live_stack, tenant, other_tenant):
    for i in range(6):
        _run(tenant, f"faq-{i}", task_type="faq", rounds=1 + i % 3, tool_calls=2, cost_usd=0.01)
    _run(tenant, "research-short", task_type="research", rounds=10, tool_calls=20, cost_usd=0.4)
    long_runs = [
        _run(tenant, "research-long-1", task_type="research", rounds=52, tool_calls=130, cost_usd=3.0),
        _run(
            tenant,
            "research-long-2",
            task_type="research",
            rounds=60,
            tool_calls=150,
            cost_usd=4.0,
            status="truncated",
            terminated_by="budget",
            budget_type="max_rounds",
            loop_flagged=True,
            cost_after_loop_usd=2.5,
        ),
    ]
    _run(other_tenant, "research-theirs", task_type="research", rounds=55)
    Detection.objects.create(
        tenant=tenant,
        run=long_runs[1],
        seq=40,
        kind="exact_repeat",
        action="correct",
        backend="openai",
        model="gpt-4o",
        task_type="research",
        ts=timezone.now() - timedelta(minutes=50),
    )
    _, password = member(tenant, "ana", role="viewer")
    sign_in(page, live_stack, "ana", password, next_path="/runs/")
    # Not until "load": on a busy machine parsing the 4.8 MB Plotly bundle takes seconds.
    page.goto("/", wait_until="domcontentloaded")
    page.set_default_timeout(30_000)
    for chart in (
        "#chart-loops",
        "#chart-tail",
        "#chart-budget-type",
        "#chart-cost-success",
        "#chart-cost-burned",
    ):
        page.wait_for_selector(f"{chart}.js-plotly-plot .main-svg")
    traces = page.evaluate("document.getElementById('chart-tail').data.map(t => [t.name, t.visible])")
    assert traces == [["faq", False], ["research", True]]  # the longest tail first
    assert "p99 60" in page.locator("#chart-tail").inner_text()

    page.locator("#chart-tail").scroll_into_view_if_needed()  # the mouse acts within the viewport
    bars = page.locator("#chart-tail .trace.bars .point path")
    boxes = [
        box for box in (bars.nth(i).bounding_box() for i in range(bars.count())) if box and box["height"] > 0
    ]
    last = max(boxes, key=lambda box: box["x"])  # the bin of the longest runs: 49-64 rounds
    # Plotly takes clicks on its drag layer over the bars: hover near the top of the bar (a bar's path
    # on a log axis reaches far below the plot), then click there.
    x, y = last["x"] + last["width"] / 2, last["y"] + 8
    page.mouse.move(x, y)
    page.locator("#chart-tail .hoverlayer .hovertext").wait_for()
    page.mouse.click(x, y)
    title = page.locator("#tail-runs-title")
    title.wait_for()
    assert "research runs with 49\u201364 model rounds: 2" in title.inner_text()
    listed = page.locator("#tail-runs table a").all_inner_texts()
    assert listed == ["research-long-2", "research-long-1"]  # longest first; another tenant's not there
    assert "bin_task=research" in page.url
    assert page.js_errors == []
