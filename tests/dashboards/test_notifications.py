"""The notification pages: admins keep and test a tenant's rules, members see them, others not."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from dashboards.models import Membership
from ingest.models import NotificationDelivery, NotificationRule

pytestmark = pytest.mark.django_db


def _user(tenant, name: str, role: str):
    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


GOOD = {
    "name": "mail on-call",
    "channel": "email",
    "emails": "a@example.com, b@example.com",
    "actions": ["terminate"],
    "backends": "openai, anthropic",
    "enabled": "on",
}


def test_an_admin_makes_a_rule_and_a_bad_one_is_a_400_naming_the_field(client, tenant):
    client.force_login(_user(tenant, "ada", Membership.Role.ADMIN))
    response = client.post("/notifications/new/", GOOD)
    rule = NotificationRule.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/notifications/{rule.pk}/"
    assert (rule.emails, rule.actions, rule.backends, rule.url, rule.tenant_id) == (
        ["a@example.com", "b@example.com"],
        ["terminate"],
        ["openai", "anthropic"],
        "",
        tenant.pk,
    )
    for bad, field in (
        ({**GOOD, "emails": "not-an-address"}, "emails:"),
        ({**GOOD, "emails": ""}, "emails: at least one"),
        ({**GOOD, "channel": "webhook", "emails": "", "secret": "x"}, "url: required"),
        ({**GOOD, "channel": "slack", "url": "ftp://example.com/x"}, "url: must be an http"),
        ({**GOOD, "channel": "slack", "url": "http://127.0.0.1:9/x"}, "LOOPWATCH_NOTIFY_ALLOW_HOSTS"),
        ({**GOOD, "actions": ["explode"]}, "actions:"),
    ):
        page = client.post("/notifications/new/", bad)
        assert page.status_code == 400 and field in page.content.decode(), (bad, field)
    assert NotificationRule.objects.count() == 1


def test_a_member_sees_rules_an_operator_cannot_change_or_test_them(client, tenant):
    rule = NotificationRule.objects.create(tenant=tenant, name="r", channel="email", emails=["a@example.com"])
    client.force_login(_user(tenant, "otto", Membership.Role.OPERATOR))
    assert f'href="/notifications/{rule.pk}/"' in client.get("/notifications/").content.decode()
    assert client.post(f"/notifications/{rule.pk}/", GOOD).status_code == 403
    assert client.post(f"/notifications/{rule.pk}/test/").status_code == 403
    assert client.post(f"/notifications/{rule.pk}/delete/").status_code == 403
    assert not NotificationDelivery.objects.exists() and NotificationRule.objects.get().name == "r"


def test_another_tenants_rule_is_not_found(client, tenant, other_tenant):
    rule = NotificationRule.objects.create(tenant=tenant, name="r", channel="email", emails=["a@example.com"])
    client.force_login(_user(other_tenant, "oz", Membership.Role.ADMIN))
    assert client.get(f"/notifications/{rule.pk}/").status_code == 404
    assert client.post(f"/notifications/{rule.pk}/test/").status_code == 404
    assert client.post(f"/notifications/{rule.pk}/delete/").status_code == 404
    assert f'href="/notifications/{rule.pk}/"' not in client.get("/notifications/").content.decode()


def test_a_test_from_the_page_goes_through_the_mail_backend(client, tenant, mailoutbox):
    rule = NotificationRule.objects.create(tenant=tenant, name="r", channel="email", emails=["a@example.com"])
    client.force_login(_user(tenant, "ada", Membership.Role.ADMIN))
    response = client.post(f"/notifications/{rule.pk}/test/", follow=True)
    assert "Test sent to &#x27;r&#x27;: handed to the mail backend." in response.content.decode()
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["a@example.com"]
    assert NotificationDelivery.objects.get(rule=rule).test is True
