"""The overview in Chromium as an operator uses it (issue 15): a bar of the loop chart lands on the
alerts of its backend, kind and time step; times in the viewer's zone with UTC on hover; the page
redraws itself, but not while a menu is open."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

from django.utils import timezone

from ingest.incidents import incidents_refresh, problem_keys
from ingest.models import Detection, Run
from tests.browser.helpers import member, sign_in


def _run(tenant, run_id: str, backend: str, model: str, started) -> Run:
    return Run.objects.create(
        tenant=tenant,
        run_id=run_id,
        backend=backend,
        model=model,
        task_type="refund",
        status="succeeded",
        started_at=started,
        rounds=4,
        tool_calls=6,
    )


def _detection(run, kind: str, ts, seq: int = 3) -> Detection:
    """Stored as the pipeline stores one: with its incident brought up to date."""
    detection = Detection.objects.create(
        tenant=run.tenant,
        run=run,
        seq=seq,
        kind=kind,
        action="correct",
        backend=run.backend,
        model=run.model,
        task_type=run.task_type,
        ts=ts,
    )
    incidents_refresh(keys=problem_keys([detection]))
    return detection


def test_a_loop_bar_opens_its_alerts_and_the_page_redraws_itself(chromium, live_stack, tenant, other_tenant):
    now = timezone.now()
    at = now - timedelta(minutes=30)
    target = _run(tenant, "target-run", "openai", "gpt-4o", at - timedelta(minutes=5))
    _detection(target, "oscillation", at)
    for i in range(2):  # the busier pair: the first panel
        _detection(target, "oscillation", at + timedelta(seconds=i + 1), seq=4 + i)
    earlier = _run(tenant, "earlier-run", "openai", "gpt-4o", now - timedelta(hours=5, minutes=5))
    _detection(earlier, "oscillation", now - timedelta(hours=5))  # another time step
    other = _run(tenant, "other-backend-run", "anthropic", "claude", at - timedelta(minutes=5))
    _detection(other, "oscillation", at)  # another backend, same step and kind
    theirs = _run(other_tenant, "their-run", "openai", "gpt-4o", at - timedelta(minutes=5))
    _detection(theirs, "oscillation", at)
    _, password = member(tenant, "olga", role="operator")

    context = chromium.new_context(
        base_url=live_stack.url, viewport={"width": 1400, "height": 1000}, timezone_id="Asia/Tokyo"
    )
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        sign_in(page, live_stack, "olga", password, next_path="/runs/")
        page.goto("/", wait_until="domcontentloaded")
        page.wait_for_selector("#chart-loops.js-plotly-plot .main-svg")

        # Times in the viewer's zone (UTC+09:00), the UTC time on hover (the title).
        said = page.locator("#range-said time").first
        utc = said.get_attribute("title")
        local = said.inner_text()
        assert utc.endswith(" UTC") and local != utc[:16] and "UTC" not in local
        assert "Asia/Tokyo" in page.locator("#time-zone-said").inner_text()
        assert page.locator("#step").inner_text() == "15 min"
        # The bottom panel carries the time axis.
        labelled = page.evaluate(
            "Object.keys(document.getElementById('chart-loops').layout)"
            ".filter(k => k.startsWith('xaxis') && document.getElementById('chart-loops').layout[k].showticklabels)"
        )
        assert labelled == ["xaxis2"]

        # Nothing redraws under an open menu.
        page.focus("#filters select[name=range]")
        assert page.evaluate("window.loopwatchOverview.refresh()") == "a filter menu is open"
        page.evaluate("document.activeElement.blur()")
        page.mouse.move(1, 1)
        _run(tenant, "late-run", "openai", "gpt-4o", now - timedelta(minutes=1))
        assert page.locator("#runs-total").inner_text() == "3"
        assert page.evaluate("window.loopwatchOverview.refresh()") == "refreshed"
        assert page.locator("#runs-total").inner_text() == "4"
        assert "UTC" not in page.locator("#range-said time").first.inner_text()  # still local
        assert errors == []

        # A bar of the busiest panel (openai / gpt-4o, the top one) opens its alerts.
        page.locator("#chart-loops").scroll_into_view_if_needed()
        bars = page.locator("#chart-loops .subplot.xy .trace.bars .point path")
        boxes = [
            b for b in (bars.nth(i).bounding_box() for i in range(bars.count())) if b and b["height"] > 0
        ]
        assert boxes, "no bar drawn in the first panel"
        bar = max(boxes, key=lambda b: b["x"])  # the latest step with interventions: the target's
        x, y = bar["x"] + bar["width"] / 2, bar["y"] + min(4, bar["height"] / 2)
        page.mouse.move(x, y)
        page.locator("#chart-loops .hoverlayer .hovertext").wait_for()
        hover = page.locator("#chart-loops .hoverlayer .hovertext").text_content()
        assert "UTC" in hover and "oscillation: 3" in hover
        with page.expect_navigation():
            page.mouse.click(x, y)
        assert urlsplit(page.url).path == "/alerts/"
        query = parse_qs(urlsplit(page.url).query)
        assert (query["backend"], query["model"], query["kind"]) == (["openai"], ["gpt-4o"], ["oscillation"])
        start = timezone.datetime.fromisoformat(query["from"][0].replace("Z", "+00:00"))
        end = timezone.datetime.fromisoformat(query["to"][0].replace("Z", "+00:00"))
        assert end - start == timedelta(minutes=15) and start <= at < end
        page.wait_for_selector("#alerts tr.incident")
        runs = page.locator("#alerts tr.incident a[href^='/runs/']").all_inner_texts()
        assert runs == ["target-run"]  # its one incident: the three detections of one problem
        assert page.locator("#alerts tr.incident [data-f=alerts]").inner_text() == "3 alerts"
        assert "a bar of the overview" in page.locator("#alerts-window").inner_text()
        assert errors == []
    finally:
        context.close()
