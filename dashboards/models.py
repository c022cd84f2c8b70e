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
