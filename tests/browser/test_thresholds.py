"""An admin changes a threshold, sees the preview of what it would have done, and saves it."""

from __future__ import annotations

from dashboards.models import ConfigChange
from ingest.models import ThresholdSet
from ingest.services import events_ingest
from tests.browser.helpers import member, sign_in
from tests.ingest.events import model_round, run_started, tool_call, tool_result


def _repeating_run(tenant, run_id: str) -> None:
    events = [run_started(run_id, backend="openai", model="gpt-4o")]
    for i in range(1, 5):
        events += [
            model_round(run_id, i),
            tool_call(run_id, f"c{i}", i),
            tool_result(run_id, f"c{i}", i, result={"orders": [1]}),
        ]
    events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)


def test_an_admin_changes_a_threshold_and_sees_the_preview(page, live_stack, tenant):
    _repeating_run(tenant, "loop-a")
    _repeating_run(tenant, "loop-b")
    ThresholdSet.objects.create(backend="openai", values={"oscillation_cycles": 4})
    _, password = member(tenant, "adam", "admin")
    sign_in(page, live_stack, "adam", password, "/thresholds/")

    page.click("#add-thresholds")
    page.fill("input[name=backend]", "openai")
    page.fill("input[name=repeat_tolerance]", "5")
    with page.expect_navigation():
        page.click("#preview-button")
    assert page.locator("#preview-loses").inner_text() == "2"
    assert page.locator("#preview-gains").inner_text() == "0"
    assert page.locator("#preview-changes tr.change-loses").count() == 2
    assert not ThresholdSet.objects.filter(tenant=tenant).exists()  # a preview stores nothing

    page.fill("textarea[name=note]", "openai retries once after an error")
    with page.expect_navigation():
        page.click("#save-button")
    assert "Saved the backend openai thresholds" in page.locator(".messages").inner_text()
    row = page.locator("#effective tr[data-name=repeat_tolerance]")
    assert "5" in row.inner_text() and "backend openai" in row.inner_text()
    inherited = page.locator("#effective tr[data-name=oscillation_cycles]").inner_text()
    assert "4" in inherited and "inherited: shared backend openai" in inherited
    assert "openai retries once after an error" in page.locator("#config-history").inner_text()
    assert ThresholdSet.objects.get(tenant=tenant).values == {"repeat_tolerance": 5}
    assert ConfigChange.objects.get().user.username == "adam"
    assert page.js_errors == []
