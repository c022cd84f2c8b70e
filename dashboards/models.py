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


# The roles that act on what they see: answer a handoff, decide on a write, give alert feedback.
OPERATOR_ROLES = (Membership.Role.OPERATOR, Membership.Role.ADMIN)


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


# --- the overview's hourly rollup (dashboards/overview/rollup.py builds it) -------------------------


class RollupHour(models.Model):
    """A UTC hour whose rollup rows are built, for every tenant at once.

    The overview reads the rows of an hour with a clean marker instead of that hour's runs and
    detections; an hour without a marker, or marked dirty (a verdict changed, late data), is read
    live. running/waiting: the hour's runs in those states when it was rolled (a change of either,
    by the guard say, makes the hour due again). until: where the rolled part ends, the hour's end
    once it is closed; the open hour is rolled up to a minute of the pass (null: the whole hour).
    """

    hour = models.DateTimeField(unique=True)
    until = models.DateTimeField(null=True, blank=True)
    rolled_at = models.DateTimeField()
    dirty = models.BooleanField(default=False)
    running = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00}{' dirty' if self.dirty else ''}"


class RollupState(models.Model):
    """How far the rollup pass has looked for late changes (one row per name)."""

    name = models.CharField(max_length=50, unique=True)
    checked_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} checked at {self.checked_at}"


class RunRollup(models.Model):
    """Runs started in one hour, per tenant and the overview's filter values, summed.

    ended: the budget type for finished runs a budget ended ("unspecified" when none was named),
    "" for every other run. finished_q0..q3: finished runs per quarter of the hour, for charts in
    15- and 30-minute steps.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False, related_name="+")
    hour = models.DateTimeField()
    backend = models.CharField(max_length=100)
    model = models.CharField(max_length=200, blank=True)
    task_type = models.CharField(max_length=100)
    agent = models.CharField(max_length=200, blank=True)
    ended = models.CharField(max_length=100, blank=True)
    runs = models.PositiveIntegerField(default=0)
    running = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    finished = models.PositiveIntegerField(default=0)
    flagged = models.PositiveIntegerField(default=0)
    events = models.BigIntegerField(default=0)
    tool_calls = models.BigIntegerField(default=0)
    cost = models.FloatField(default=0)
    success_cost = models.FloatField(default=0)
    burned = models.FloatField(default=0)
    finished_q0 = models.PositiveIntegerField(default=0)
    finished_q1 = models.PositiveIntegerField(default=0)
    finished_q2 = models.PositiveIntegerField(default=0)
    finished_q3 = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "hour"], name="runrollup_tenant_hour"),
            models.Index(fields=["hour"], name="runrollup_hour"),  # an hour's rows replaced at once
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.hour:%Y-%m-%d %H:00} {self.backend}/{self.task_type}: {self.runs}"


class TailRollup(models.Model):
    """Finished runs started in one hour, per tenant, filter values and task type, counted per value
    of a metric (model rounds or tool calls): the long-tail chart's histograms."""

    class Metric(models.TextChoices):
        ROUNDS = "rounds"
        TOOL_CALLS = "tool_calls"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False, related_name="+")
    hour = models.DateTimeField()
    backend = models.CharField(max_length=100)
    model = models.CharField(max_length=200, blank=True)
    task_type = models.CharField(max_length=100)
    agent = models.CharField(max_length=200, blank=True)
    metric = models.CharField(max_length=16, choices=Metric.choices)
    value = models.IntegerField()
    n = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "hour"], name="tailrollup_tenant_hour"),
            models.Index(fields=["hour"], name="tailrollup_hour"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.hour:%Y-%m-%d %H:00} {self.task_type} {self.metric}={self.value}: {self.n}"


class DetectionRollup(models.Model):
    """Detections whose event fell in one hour, per tenant, filter values, kind, action and verdict.

    n_q0..q3: the same per quarter of the hour.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False, related_name="+")
    hour = models.DateTimeField()
    backend = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    task_type = models.CharField(max_length=100, blank=True)
    agent = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=32)
    action = models.CharField(max_length=16)
    feedback = models.CharField(max_length=16, blank=True)
    n = models.PositiveIntegerField(default=0)
    n_q0 = models.PositiveIntegerField(default=0)
    n_q1 = models.PositiveIntegerField(default=0)
    n_q2 = models.PositiveIntegerField(default=0)
    n_q3 = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "hour"], name="detectionrollup_tenant_hour"),
            models.Index(fields=["hour"], name="detectionrollup_hour"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.hour:%Y-%m-%d %H:00} {self.kind} {self.action}: {self.n}"
