"""An operator resolves an UNKNOWN write from the queue in a real browser."""

from __future__ import annotations

from ingest.ledger import operation_claim, operation_complete
from ingest.models import Operation
from tests.browser.helpers import member, sign_in


def test_an_operator_resolves_an_unknown_write_from_the_queue(page, live_stack, tenant, other_tenant):
    operation_claim(
        tenant=tenant,
        key="acme:order-42:refund",
        tool="refund",
        args={"amount": 10},
        worker_id="w",
        lease_s=30,
    )
    operation_complete(
        tenant=tenant,
        key="acme:order-42:refund",
        worker_id="w",
        outcome="timeout",
        external_request_id="req_bNGf7",
    )
    operation_claim(tenant=other_tenant, key="globex-key", tool="refund", args={}, worker_id="w", lease_s=30)
    operation_complete(tenant=other_tenant, key="globex-key", worker_id="w", outcome="timeout")
    _, password = member(tenant, "olga", "operator")
    sign_in(page, live_stack, "olga", password, "/queue/")

    assert page.locator("#nav-queue-open").inner_text() == "1"
    assert page.locator("#queue-table tr[data-op]").count() == 1
    assert "globex-key" not in page.content()
    page.click("text=acme:order-42:refund")
    assert page.locator("#op-status").inner_text() == "UNKNOWN"
    # A second tab on the same operation, as a colleague (or a second click) would have it.
    stale = page.context.new_page()
    stale.goto(page.url)

    # An empty note is refused with the field named; nothing changes.
    form = page.locator("#decide-succeeded")
    form.locator("input[name=external_reference]").fill("re_777")
    with page.expect_navigation():
        form.locator("button").click()
    assert "note: required" in page.locator("#form-errors").inner_text()
    assert page.locator("#op-status").inner_text() == "UNKNOWN"

    form = page.locator("#decide-succeeded")
    form.locator("input[name=external_reference]").fill("re_777")
    form.locator("textarea[name=note]").fill("refund re_777 is in the PSP console")
    with page.expect_navigation():
        form.locator("button").click()
    assert page.locator("#op-status").inner_text() == "SUCCEEDED"
    assert "mark succeeded → SUCCEEDED" in page.locator(".messages").inner_text()
    assert page.locator("#nav-queue-open").inner_text() == "0"
    history = page.locator("#history").inner_text()
    assert "UNKNOWN → SUCCEEDED" in history and "user: olga" in history and "PSP console" in history
    assert "re_777" in history  # the operator's reference, on the decision
    # The attempt's request id is kept and shown beside the operator's reference.
    assert page.locator("#op-external").inner_text() == "req_bNGf7"
    assert page.locator("#op-operator-reference").inner_text().startswith("re_777")
    op = Operation.objects.get(operation_key="acme:order-42:refund")
    assert (op.status, op.external_request_id) == ("SUCCEEDED", "req_bNGf7")

    # The tab opened before the decision still shows UNKNOWN: its click changes nothing more.
    form = stale.locator("#decide-compensate")
    form.locator("textarea[name=note]").fill("refunded again")
    with stale.expect_navigation():
        form.locator("button").click()
    assert "already resolved by olga at" in stale.locator(".messages").inner_text()
    assert stale.locator("#op-status").inner_text() == "SUCCEEDED"
    assert Operation.objects.get(pk=op.pk).status == "SUCCEEDED"
    assert op.history.filter(actor="user").count() == 1
    assert page.js_errors == []
