"""An operator answers a run the guard handed to a person, in a real browser: from the queue to the
run, a note, Resume; a second tab opened before the answer changes nothing."""

from __future__ import annotations

from datetime import datetime

from playwright.sync_api import expect

from ingest.guard import ProposedCall, call_check, config_cache_clear
from ingest.models import Run
from ingest.services import events_ingest
from tests.browser.helpers import member, sign_in
from tests.ingest.events import model_round, run_started, tool_call, tool_result, ts

FAILED = {"status": "error", "error_class": "not_found", "result": "no order o9"}


def _handed_off(tenant, run_id: str) -> Run:
    """The same lookup failed 4 times; the guard is asked about a 5th and hands the run over."""
    events = [run_started(run_id, agent="shop")]
    for n in range(1, 5):
        events += [
            model_round(run_id, n=n),
            tool_call(run_id, f"c{n}", n=n, tool="get_order", args={"id": "o9"}),
            tool_result(run_id, f"c{n}", n=n, **FAILED),
        ]
    events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)
    config_cache_clear()
    call = ProposedCall(
        tool="get_order", args={"id": "o9"}, kind="read", round=5, ts=datetime.fromisoformat(ts(5))
    )
    assert call_check(tenant=tenant, run_id=run_id, call=call).decision == "handoff"
    return Run.objects.get(tenant=tenant, run_id=run_id)


def test_an_operator_resumes_a_waiting_run_with_a_note(page, live_stack, tenant, other_tenant):
    run = _handed_off(tenant, "order-9-lookup")
    _handed_off(other_tenant, "globex-run")
    _, password = member(tenant, "olga", "operator")
    sign_in(page, live_stack, "olga", password, "/queue/")

    expect(page.locator("#nav-runs-waiting")).to_have_text("1")
    waiting = page.locator("#waiting-table")
    expect(waiting).to_contain_text("repeated_error")
    expect(waiting).not_to_contain_text("globex-run")
    with page.expect_navigation():
        waiting.locator("text=order-9-lookup").click()
    expect(page.locator("#handoff")).to_contain_text("Waiting for a person")
    # A second tab on the same run, as a colleague (or a second click) would have it.
    stale = page.context.new_page()
    stale.goto(page.url)

    # Without a note nothing happens, and the page says why.
    with page.expect_navigation():
        page.click("#handoff-resume")
    expect(page.locator("#form-errors")).to_contain_text("note: required")
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING

    page.fill("#handoff-form textarea[name=note]", "order o9 was created by hand")
    with page.expect_navigation():
        page.click("#handoff-resume")
    expect(page.locator(".messages")).to_contain_text("resumed — checks decide again")
    answer = page.locator("#handoff-answer")
    expect(answer).to_contain_text("Resumed by olga at")
    expect(answer).to_contain_text("order o9 was created by hand")
    expect(page.locator("#handoff-form")).to_have_count(0)
    expect(page.locator("#timeline-handoff-answer")).to_contain_text("resumed by olga")
    expect(page.locator("#nav-runs-waiting")).to_have_text("0")
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING

    # The tab opened before the answer still shows the form: its Stop changes nothing.
    stale.fill("#handoff-form textarea[name=note]", "stop it")
    with stale.expect_navigation():
        stale.click("#handoff-stop")
    expect(stale.locator(".messages")).to_contain_text("already answered by olga at")
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    assert page.js_errors == []
