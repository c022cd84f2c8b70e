"""Users and their tenants."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from ingest.models import Tenant


class Membership(models.Model):
    """A user's role in one tenant; every page is scoped to the user's tenants."""

    class Role(models.TextChoices):
        VIEWER = "viewer"
        OPERATOR = "operator"
        ADMIN = "admin"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_user_tenant_uniq")]

    def __str__(self) -> str:
        return f"{self.user_id} {self.role} of {self.tenant_id}"


class ConfigChange(models.Model):
    """Who changed which detection setting of a tenant, when, from what to what (append-only)."""

    class Action(models.TextChoices):
        CREATE = "create"
        UPDATE = "update"
        DELETE = "delete"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="config_changes")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    target = models.CharField(max_length=300, help_text='e.g. "thresholds openai/gpt-4o/*" or "tool search"')
    action = models.CharField(max_length=8, choices=Action.choices)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True, default="")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["tenant", "-at"], name="configchange_tenant_at")]

    def __str__(self) -> str:
        return f"{self.target} {self.action} by {self.user_id}"
