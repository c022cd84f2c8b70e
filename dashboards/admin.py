"""Memberships in the Django admin: who sees which tenant with which role (the pages send people here
when they see no tenant). A tenant's page lists its members too."""

from __future__ import annotations

from django.contrib import admin

from dashboards.models import ConfigChange, Membership
from ingest.admin import TenantAdmin
from ingest.models import Tenant


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__slug", "tenant__name"]
    list_select_related = ["user", "tenant"]
    autocomplete_fields = ["user", "tenant"]


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


# The tenant's page (ingest's admin) with its members: ingest never imports dashboards, so the
# dashboards app adds them to it.
admin.site.unregister(Tenant)


@admin.register(Tenant)
class TenantWithMembersAdmin(TenantAdmin):
    inlines = [*TenantAdmin.inlines, MembershipInline]


@admin.register(ConfigChange)
class ConfigChangeAdmin(admin.ModelAdmin):
    list_display = ["at", "tenant", "user", "action", "target"]
    list_filter = ["tenant", "action"]
    readonly_fields = [f.name for f in ConfigChange._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False  # the history is written by the threshold pages

    def has_change_permission(self, request, obj=None) -> bool:
        return False
