"""A tenant's notification rule: where its incidents go, and which."""

from __future__ import annotations

from django import forms
from django.core.validators import validate_email

from ingest.detection import KINDS
from ingest.downstream import Refused, url_target
from ingest.models import NotificationRule
from ingest.notify import SETTING

KIND_CHOICES = [(k, k) for k in (*KINDS, "duplicate_side_effect")]
ACTION_CHOICES = [(a, a) for a in ("correct", "handoff", "terminate")]
MAX_LIST = 50  # backends, task types or addresses of one rule


def _words(raw: str, field: str, *, limit: int = 100) -> list[str]:
    values = [v.strip() for v in raw.replace("\n", ",").split(",") if v.strip()]
    if len(values) > MAX_LIST:
        raise forms.ValidationError(f"{field}: at most {MAX_LIST}")
    for value in values:
        if len(value) > limit or "\x00" in value:
            raise forms.ValidationError(f"{field}: {value[:40]!r} is not a name (at most {limit} characters)")
    return list(dict.fromkeys(values))


class NotificationRuleForm(forms.Form):
    name = forms.CharField(max_length=200)
    enabled = forms.BooleanField(required=False, initial=True)
    channel = forms.ChoiceField(choices=NotificationRule.Channel.choices)
    url = forms.CharField(
        required=False,
        max_length=1000,
        help_text="webhook or Slack incoming webhook: http(s) URL; private hosts only when "
        "LOOPWATCH_NOTIFY_ALLOW_HOSTS names them",
    )
    secret = forms.CharField(
        required=False, max_length=200, help_text="webhook: the key of the HMAC-SHA256 signature"
    )
    emails = forms.CharField(required=False, help_text="e-mail: addresses, separated by commas")
    kinds = forms.MultipleChoiceField(required=False, choices=KIND_CHOICES, help_text="none: any kind")
    actions = forms.MultipleChoiceField(required=False, choices=ACTION_CHOICES, help_text="none: any action")
    backends = forms.CharField(required=False, help_text="comma-separated; empty: any backend")
    task_types = forms.CharField(required=False, help_text="comma-separated; empty: any task type")

    def clean_backends(self) -> list[str]:
        return _words(self.cleaned_data.get("backends", ""), "backends")

    def clean_task_types(self) -> list[str]:
        return _words(self.cleaned_data.get("task_types", ""), "task_types")

    def clean_emails(self) -> list[str]:
        addresses = _words(self.cleaned_data.get("emails", ""), "emails", limit=254)
        for address in addresses:
            try:
                validate_email(address)
            except forms.ValidationError:
                raise forms.ValidationError(f"emails: {address[:60]!r} is not an e-mail address") from None
        return addresses

    def clean(self):
        super().clean()
        data = self.cleaned_data
        channel = data.get("channel")
        if channel in (NotificationRule.Channel.WEBHOOK, NotificationRule.Channel.SLACK):
            url = (data.get("url") or "").strip()
            if not url:
                self.add_error("url", "url: required for a webhook or Slack")
            else:
                try:
                    url_target(url, setting=SETTING)
                except Refused as refused:
                    self.add_error("url", f"url: {refused}".replace("url: url: ", "url: "))
            data["url"] = url
        if channel == NotificationRule.Channel.WEBHOOK and not (data.get("secret") or "").strip():
            self.add_error("secret", "secret: required for a webhook (receivers check the signature with it)")
        if channel == NotificationRule.Channel.EMAIL and not data.get("emails"):
            self.add_error("emails", "emails: at least one address")
        return data

    @classmethod
    def initial_for(cls, rule: NotificationRule) -> dict:
        return {
            "name": rule.name,
            "enabled": rule.enabled,
            "channel": rule.channel,
            "url": rule.url,
            "secret": rule.secret,
            "emails": ", ".join(rule.emails),
            "kinds": rule.kinds,
            "actions": rule.actions,
            "backends": ", ".join(rule.backends),
            "task_types": ", ".join(rule.task_types),
        }
