"""The Content-Security-Policy in Chromium: every page, the admin's included, runs with nothing
blocked (the page fixture fails a test on any blocked script, style, socket or image), and the
policy is really enforced: an inline script does not run."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from tests.browser.helpers import sign_in


def test_the_pages_run_under_the_policy_and_an_inline_script_does_not(page, live_stack, tenant):
    get_user_model().objects.create_superuser("root", password="pw-browser-1")
    from dashboards.models import Membership

    Membership.objects.create(user=get_user_model().objects.get(username="root"), tenant=tenant, role="admin")
    sign_in(page, live_stack, "root", "pw-browser-1", next_path="/alerts/")
    for path in ("/", "/alerts/", "/runs/", "/queue/", "/thresholds/", "/admin/", "/admin/ingest/run/"):
        answer = page.goto(live_stack.url + path, wait_until="load")
        assert answer.status == 200, path
        assert "script-src 'self'" in answer.headers["content-security-policy"], path
    assert page.js_errors == []

    # Enforced, not just sent: script injected into the page as markup (what an XSS would do) is refused.
    page.evaluate(
        "document.body.insertAdjacentHTML('beforeend', '<img src=x onerror=\"window.ran = true\">')"
    )
    page.wait_for_timeout(500)
    assert page.evaluate("window.ran === undefined")
    assert any("inline event handler" in line or "script-src" in line for line in page.csp_blocked)
    page.csp_blocked.clear()  # expected: the fixture's check is for the pages themselves
