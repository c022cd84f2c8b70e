from django.contrib import admin

from ingest.models import (
    ApiKey,
    Backend,
    Detection,
    ModelPrice,
    Operation,
    OperationTransition,
    Reconciler,
    Run,
    Tenant,
    ThresholdSet,
    ToolConfig,
)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "retention_days", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "tenant", "name", "scopes", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    fields = ["tenant", "name", "scopes", "prefix", "key_hash", "created_at", "last_used_at", "revoked_at"]

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
