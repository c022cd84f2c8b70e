"""Notification rules of a tenant: listed for its members, kept and tested by its admins."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboards.models import Membership
from dashboards.notifications.forms import NotificationRuleForm
from dashboards.notifications.services import notification_rule_save
from dashboards.queue.forms import named_errors
from dashboards.selectors import user_tenants
from ingest.models import NotificationDelivery, NotificationRule
from ingest.notify import rule_test_send

DELIVERIES_SHOWN = 50


def _admin_tenant_ids(user) -> set[int]:
    return set(
        Membership.objects.filter(user=user, role=Membership.Role.ADMIN).values_list("tenant_id", flat=True)
    )


def _rule_for(user, pk: int) -> NotificationRule:
    rule = (
        NotificationRule.objects.filter(pk=pk, tenant__in=user_tenants(user=user))
        .select_related("tenant")
        .first()
    )
    if rule is None:
        raise Http404("no such notification rule")
    return rule


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    tenants = list(user_tenants(user=request.user))
    rules = (
        NotificationRule.objects.filter(tenant__in=tenants)
        .select_related("tenant")
        .order_by("tenant__slug", "name")
    )
    return render(
        request,
        "dashboards/notifications/index.html",
        {"rules": rules, "can_add": bool(_admin_tenant_ids(request.user)), "multi_tenant": len(tenants) > 1},
    )


@login_required
@require_http_methods(["GET", "POST"])
def rule_edit(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    """A new rule (pk None) or an existing one: its form, its test button and its delivery log."""
    admin_of = _admin_tenant_ids(request.user)
    rule = _rule_for(request.user, pk) if pk is not None else None
    can_edit = (rule.tenant_id in admin_of) if rule else bool(admin_of)
    tenants = [t for t in user_tenants(user=request.user) if t.pk in admin_of]
    status = 200
    if request.method == "POST":
        if not can_edit:
            raise PermissionDenied("notification rules are kept by the tenant's admins")
        form = NotificationRuleForm(request.POST)
        tenant = (
            rule.tenant
            if rule
            else next((t for t in tenants if str(t.pk) == request.POST.get("tenant")), None)
        )
        if tenant is None and rule is None and len(tenants) == 1:
            tenant = tenants[0]
        if tenant is None:
            form.add_error(None, "tenant: choose one of the tenants you administer")
        if tenant is not None and form.is_valid():
            saved = notification_rule_save(tenant=tenant, data=form.cleaned_data, rule=rule)
            messages.success(request, f"Notification rule {saved.name!r} saved.")
            return redirect("notifications:rule", pk=saved.pk)
        status = 400
    else:
        form = NotificationRuleForm(
            initial=NotificationRuleForm.initial_for(rule) if rule else {"enabled": True}
        )
    deliveries = (
        NotificationDelivery.objects.filter(rule=rule)
        .select_related("incident")
        .order_by("-pk")[:DELIVERIES_SHOWN]
        if rule
        else []
    )
    return render(
        request,
        "dashboards/notifications/rule.html",
        {
            "rule": rule,
            "form": form,
            "errors": named_errors(form),
            "can_edit": can_edit,
            "tenants": tenants,
            "deliveries": deliveries,
        },
        status=status,
    )


@login_required
@require_POST
def rule_test(request: HttpRequest, pk: int) -> HttpResponse:
    """Send a sample incident to the rule's target now, and say what it answered."""
    rule = _rule_for(request.user, pk)
    if rule.tenant_id not in _admin_tenant_ids(request.user):
        raise PermissionDenied("notification rules are tested by the tenant's admins")
    delivery = rule_test_send(rule=rule)
    if delivery.status == NotificationDelivery.Status.SENT:
        code = f"HTTP {delivery.status_code}" if delivery.status_code else "handed to the mail backend"
        messages.success(request, f"Test sent to {rule.name!r}: {code}.")
    else:
        messages.error(request, f"Test to {rule.name!r} failed: {delivery.error}")
    return redirect("notifications:rule", pk=rule.pk)


@login_required
@require_POST
def rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    rule = _rule_for(request.user, pk)
    if rule.tenant_id not in _admin_tenant_ids(request.user):
        raise PermissionDenied("notification rules are kept by the tenant's admins")
    name = rule.name
    rule.delete()
    messages.success(request, f"Notification rule {name!r} deleted, with its delivery log.")
    return redirect("notifications:index")
