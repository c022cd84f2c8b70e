"""The browser stack itself: a member signs in and the navigation shows the open write queue."""

from __future__ import annotations

from ingest.models import Operation
from tests.browser.helpers import member, sign_in


def test_a_member_signs_in_and_sees_the_open_write_count(page, live_stack, tenant, other_tenant):
    for owner, key in ((tenant, "mine"), (other_tenant, "theirs-1"), (other_tenant, "theirs-2")):
        Operation.objects.create(
            tenant=owner, operation_key=key, tool="refund", fingerprint="f" * 64, status="UNKNOWN"
        )
    _, password = member(tenant, "ana")
    sign_in(page, live_stack, "ana", password)
    assert page.locator("nav").inner_text().count("ana") == 1
    assert page.locator("#nav-queue-open").inner_text() == "1"  # the other tenant's two are not counted
    assert page.js_errors == []
