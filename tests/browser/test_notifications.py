"""A notification rule made and tested from its page, delivering to a local receiver (a real HTTP
server in a thread of the test)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from playwright.sync_api import expect

from dashboards.models import Membership
from ingest.models import NotificationDelivery, NotificationRule
from ingest.notify import SIGNATURE_HEADER, TIMESTAMP_HEADER
from tests.browser.helpers import member, sign_in


@pytest.fixture
def allow_local_notify(monkeypatch):
    """The server the browser talks to may reach the receiver on 127.0.0.1 (read from its environment)."""
    monkeypatch.setenv("LOOPWATCH_NOTIFY_ALLOW_HOSTS", "127.0.0.1")


def test_a_rule_made_on_its_page_sends_a_signed_test_to_a_local_receiver(
    allow_local_notify,
    receiver,
    page,
    live_stack,
    tenant,
):
    _, password = member(tenant, "ada", role=Membership.Role.ADMIN)
    sign_in(page, live_stack, "ada", password, next_path="/notifications/")
    page.click("#new-rule")
    page.fill("input[name=name]", "on-call hook")
    page.select_option("select[name=channel]", "webhook")
    page.fill("input[name=url]", receiver.url)
    page.select_option("select[name=actions]", ["handoff", "terminate"])
    # no secret: refused, naming the field
    with page.expect_navigation():
        page.click("#rule-form button")
    expect(page.locator("#errors")).to_contain_text("secret: required for a webhook")
    page.fill("input[name=secret]", "hook-secret")
    with page.expect_navigation():
        page.click("#rule-form button")
    expect(page.locator(".messages")).to_contain_text("Notification rule 'on-call hook' saved.")
    rule = NotificationRule.objects.get(name="on-call hook")
    assert (rule.channel, rule.actions, rule.tenant_id) == ("webhook", ["handoff", "terminate"], tenant.pk)

    with page.expect_navigation():
        page.click("#send-test")
    expect(page.locator(".messages")).to_contain_text("Test sent to 'on-call hook': HTTP 200.")
    expect(page.locator("#deliveries tr.delivery-sent [data-f=status_code]")).to_have_text("200")
    assert len(receiver.received) == 1
    _, headers, body = receiver.received[0]
    signed = hmac.new(b"hook-secret", headers[TIMESTAMP_HEADER].encode() + b"." + body, hashlib.sha256)
    assert headers[SIGNATURE_HEADER] == "sha256=" + signed.hexdigest()
    assert json.loads(body)["test"] is True and json.loads(body)["action"] == "handoff"
    assert NotificationDelivery.objects.get(rule=rule).status == "sent"
    assert page.js_errors == []
