from django.conf import settings
from django.contrib import admin

from ingest.models import (
    ApiKey,
    Backend,
    Detection,
    Incident,
    ModelPrice,
    NotificationDelivery,
    NotificationRule,
    Operation,
    OperationTransition,
    Reconciler,
    Run,
    Tenant,
    ThresholdSet,
    ToolConfig,
)

QUOTAS = ("events_per_s", "events_per_day", "checks_per_s")
QUOTAS_HELP = (
    "Over a limit, a request is answered 429 with Retry-After, naming the limit (docs/limits.md). "
    "A key's limits hold beside its tenant's."
)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "retention_days", "limits", "created_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["limits", "created_at"]
    fieldsets = [
        (None, {"fields": ["slug", "name", "retention_days", "created_at"]}),
        ("Rate limits and quotas", {"fields": [*QUOTAS, "limits"], "description": QUOTAS_HELP}),
    ]

    @admin.display(description="limits in force")
    def limits(self, tenant: Tenant) -> str:
        """What holds, the LOOPWATCH_TENANT_* defaults filled in."""
        parts = []
        for field in QUOTAS:
            value = getattr(tenant, field)
            source = ""
            if value is None:
                value, source = getattr(settings, f"LOOPWATCH_TENANT_{field.upper()}"), " (default)"
            parts.append(f"{field}={value or 'none'}{source}")
        return ", ".join(parts)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "prefix",
        "tenant",
        "name",
        "scopes",
        *QUOTAS,
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["tenant"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "tenant",
                    "name",
                    "scopes",
                    "prefix",
                    "key_hash",
                    "created_at",
                    "last_used_at",
                    "revoked_at",
                ]
            },
        ),
        ("Rate limits and quotas", {"fields": list(QUOTAS), "description": QUOTAS_HELP}),
    ]

    def has_add_permission(self, request) -> bool:
        # A key is shown once when made: `manage.py create_api_key`, not a form that cannot show it.
        return False


class ModelPriceInline(admin.TabularInline):
    model = ModelPrice
    extra = 1


@admin.register(Backend)
class BackendAdmin(admin.ModelAdmin):
    list_display = ["name", "markup"]
    inlines = [ModelPriceInline]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = [
        "run_id",
        "tenant",
        "agent",
        "backend",
        "model",
        "task_type",
        "status",
        "rounds",
        "cost_usd",
    ]
    list_filter = ["tenant", "backend", "status", "task_type"]
    search_fields = ["run_id"]
    readonly_fields = [f.name for f in Run._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(ThresholdSet)
class ThresholdSetAdmin(admin.ModelAdmin):
    list_display = ["__str__", "tenant", "backend", "model", "task_type", "values", "updated_at"]
    list_filter = ["tenant", "backend", "task_type"]


@admin.register(ToolConfig)
class ToolConfigAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "kind", "core_args", "noise_args", "cursor_args", "casefold"]
    list_filter = ["tenant", "kind"]
    search_fields = ["name"]


@admin.register(Detection)
class DetectionAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "tenant",
        "run",
        "kind",
        "action",
        "tool",
        "count",
        "at_call",
        "backend",
        "model",
    ]
    list_filter = ["tenant", "kind", "action", "backend"]
    readonly_fields = [f.name for f in Detection._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


class OperationTransitionInline(admin.TabularInline):
    model = OperationTransition
    extra = 0
    can_delete = False
    readonly_fields = ["from_status", "to_status", "actor", "actor_id", "note", "evidence", "at"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin):
    list_display = ["operation_key", "tenant", "tool", "status", "needs_person", "attempts", "updated_at"]
    list_filter = ["tenant", "status", "needs_person", "tool"]
    search_fields = ["operation_key", "external_request_id"]
    readonly_fields = [f.name for f in Operation._meta.fields]
    inlines = [OperationTransitionInline]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Reconciler)
class ReconcilerAdmin(admin.ModelAdmin):
    list_display = [
        "tenant",
        "tool",
        "method",
        "url_template",
        "field",
        "done_values",
        "not_done_values",
        "max_attempts",
    ]
    list_filter = ["tenant"]
    search_fields = ["tool", "url_template"]


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    """Read only: incidents are written by the detection pass, verdicts on the pages."""

    list_display = ["id", "tenant", "run", "kind", "action", "alerts", "status", "verdict", "last_seen"]
    list_filter = ["tenant", "kind", "action", "status"]
    list_select_related = ["tenant", "run"]
    raw_id_fields = ["run", "verdict_by"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class NotificationDeliveryInline(admin.TabularInline):
    model = NotificationDelivery
    fields = ("incident", "action", "test", "status", "status_code", "attempts", "error", "created_at")
    readonly_fields = fields
    raw_id_fields = ["incident"]
    extra = 0
    can_delete = False
    ordering = ["-id"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(NotificationRule)
class NotificationRuleAdmin(admin.ModelAdmin):
    """Tenant admins keep their rules at /notifications/ (the URL is checked there); here staff see them."""

    list_display = ["name", "tenant", "channel", "enabled", "actions", "kinds"]
    list_filter = ["tenant", "channel", "enabled"]
    readonly_fields = ["url", "secret", "emails", "channel", "tenant"]
    inlines = [NotificationDeliveryInline]

    def has_add_permission(self, request) -> bool:
        return False
