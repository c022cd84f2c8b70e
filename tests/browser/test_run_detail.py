"""The run detail in a real browser: found by search, its timeline with folded long values, the
detection where it fired; another tenant's run is not there."""

from __future__ import annotations

from playwright.sync_api import expect

from ingest.models import Detection, Run
from ingest.services import events_ingest
from tests.browser.helpers import member, sign_in
from tests.ingest.events import model_round, run_started, tool_call, tool_result


def _ingest(tenant, events) -> None:
    # Detection runs eagerly in this process once the ingest transaction has committed.
    events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)


def test_a_member_finds_a_run_reads_its_timeline_and_cannot_open_another_tenants(
    page, live_stack, tenant, other_tenant
):
    events = [run_started("checkout-2041", agent="shop")]
    for i in range(1, 4):
        events += [
            model_round("checkout-2041", n=i, text=f"Checking the order again ({i})."),
            tool_call("checkout-2041", f"c{i}", n=i, args={"customer": "42"}),
            tool_result("checkout-2041", f"c{i}", n=i, result={"orders": [], "log": "line " * 120}),
        ]
    _ingest(tenant, events)
    _ingest(other_tenant, [run_started("checkout-2042")])
    theirs = Run.objects.get(tenant=other_tenant)
    correction = Detection.objects.get(run__run_id="checkout-2041", action="correct")
    _, password = member(tenant, "ana", role="viewer")
    sign_in(page, live_stack, "ana", password, next_path="/runs/")

    page.fill('input[name="q"]', "checkout-20")
    with page.expect_navigation():
        page.click('button:has-text("search")')
    expect(page.locator("table.runs")).to_contain_text("checkout-2041")
    expect(page.locator("table.runs")).not_to_contain_text("checkout-2042")
    with page.expect_navigation():
        page.click("text=checkout-2041")

    expect(page.locator("#run-title")).to_contain_text("checkout-2041")
    expect(page.locator("#fig-rounds")).to_have_text("3")
    expect(page.locator("ol.timeline")).to_contain_text("Checking the order again (2).")
    folded = page.locator("ol.timeline details").first
    assert not folded.locator("pre").is_visible()
    folded.locator("summary").click()
    expect(folded.locator("pre")).to_contain_text("line line")
    fired = page.locator(f"#det-{correction.pk}")
    expect(fired).to_contain_text("exact_repeat")
    expect(fired).to_contain_text(correction.hint)

    response = page.goto(f"{live_stack.url}/runs/{theirs.pk}/")
    assert response.status == 404
    assert page.js_errors == []
