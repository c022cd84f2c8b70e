"""Writes of the notification pages: a tenant admin's rules."""

from __future__ import annotations

from typing import Any

from ingest.models import NotificationRule, Tenant

RULE_FIELDS = (
    "name",
    "enabled",
    "channel",
    "url",
    "secret",
    "emails",
    "kinds",
    "actions",
    "backends",
    "task_types",
)


def notification_rule_save(
    *, tenant: Tenant, data: dict[str, Any], rule: NotificationRule | None = None
) -> NotificationRule:
    """Create a rule of the tenant, or change one (the form has checked the values)."""
    rule = rule or NotificationRule(tenant=tenant)
    for name in RULE_FIELDS:
        setattr(rule, name, data.get(name, getattr(rule, name)))
    if rule.channel != NotificationRule.Channel.WEBHOOK:
        rule.secret = ""
    if rule.channel == NotificationRule.Channel.EMAIL:
        rule.url = ""
    else:
        rule.emails = []
    rule.save()
    return rule
