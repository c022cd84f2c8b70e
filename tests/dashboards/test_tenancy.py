"""Tenancy a newcomer can follow (issue 15): a superuser sees and administers every tenant, members are
managed in the admin and by `manage.py add_member`, `create_api_key` says who will see the traces, and
an unknown tenant in a URL is the app's 404 page."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from dashboards.models import Membership
from ingest.incidents import incidents_refresh, problem_keys
from ingest.ledger import operation_claim, operation_complete
from ingest.models import Detection, Run, Tenant, ThresholdSet

pytestmark = pytest.mark.django_db


def _superuser():
    return get_user_model().objects.create_superuser("root", "root@example.com", "pw")


def test_a_superuser_without_memberships_sees_and_administers_every_tenant(client, tenant, other_tenant):
    mine = Run.objects.create(tenant=tenant, run_id="acme-run", status="running", backend="openai")
    theirs = Run.objects.create(tenant=other_tenant, run_id="globex-run", status="waiting", backend="local")
    detection = Detection.objects.create(
        tenant=other_tenant, run=theirs, seq=1, kind="exact_repeat", action="correct", ts=timezone.now()
    )
    incidents_refresh(keys=problem_keys([detection]))  # as the pipeline stores it
    operation_claim(tenant=other_tenant, key="g1", tool="refund", args={}, worker_id="w", lease_s=30)
    operation_complete(tenant=other_tenant, key="g1", worker_id="w", outcome="timeout")
    ThresholdSet.objects.create(tenant=other_tenant, values={"max_rounds": 9})
    client.force_login(_superuser())
    overview = client.get("/")
    assert overview.context["tenants"] == ["acme", "globex"]
    assert "globex-run" in client.get("/runs/").content.decode()
    assert (
        client.get(f"/runs/{theirs.pk}/").status_code == 200
        and client.get(f"/runs/{mine.pk}/").status_code == 200
    )
    assert [i["run_id"] for i in client.get("/alerts/").context["incidents"]] == ["globex-run"]
    queue = client.get("/queue/")
    assert queue.context["total"] == 1 and queue.context["waiting_total"] == 1
    assert 'id="nav-queue-open">1<' in queue.content.decode()
    # administers: thresholds of any tenant as its admin, a verdict on any alert
    page = client.get(f"/thresholds/{other_tenant.slug}/")
    assert page.status_code == 200 and page.context["is_admin"]
    detection = Detection.objects.get()
    response = client.post(f"/alerts/{detection.pk}/feedback/", {"verdict": "true_loop"})
    assert response.status_code == 302
    assert Detection.objects.get().feedback == "true_loop"


def test_a_member_still_sees_only_their_tenants(client, tenant, other_tenant):
    Run.objects.create(tenant=other_tenant, run_id="globex-run", status="running")
    user = get_user_model().objects.create_user("ana", password="pw", is_staff=True)
    Membership.objects.create(user=user, tenant=tenant, role="admin")
    client.force_login(user)
    assert "globex-run" not in client.get("/runs/").content.decode()
    assert client.get(f"/thresholds/{other_tenant.slug}/").status_code == 404


def test_memberships_are_in_the_django_admin_and_on_a_tenants_page(client, tenant):
    user = get_user_model().objects.create_user("ana", password="pw")
    Membership.objects.create(user=user, tenant=tenant, role="operator")
    client.force_login(_superuser())
    listing = client.get("/admin/dashboards/membership/")
    assert listing.status_code == 200 and "ana" in listing.content.decode()
    assert client.get("/admin/dashboards/membership/add/").status_code == 200
    tenant_page = client.get(f"/admin/ingest/tenant/{tenant.pk}/change/").content.decode()
    assert "memberships-TOTAL_FORMS" in tenant_page and "operator" in tenant_page


def test_add_member_gives_a_user_a_tenant_and_changes_a_role(tenant):
    get_user_model().objects.create_user("ana", password="pw")
    out = StringIO()
    call_command("add_member", "ana", "acme", "--role", "operator", stdout=out)
    assert "ana is now operator of acme" in out.getvalue()
    assert Membership.objects.get().role == "operator"
    call_command("add_member", "ana", "acme", "--role", "admin", stdout=out)
    assert "was operator of acme, now admin" in out.getvalue() and Membership.objects.get().role == "admin"
    with pytest.raises(CommandError, match="user: no user 'bob'"):
        call_command("add_member", "bob", "acme")
    with pytest.raises(CommandError, match=r"tenant: no tenant 'nope' \(tenants: acme\)"):
        call_command("add_member", "ana", "nope")
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("add_member", "ana", "acme", "--role", "owner")


def test_create_api_key_says_which_tenant_and_who_sees_it(db):
    out, err = StringIO(), StringIO()
    call_command("create_api_key", "acme", stdout=out, stderr=err)
    said = err.getvalue()
    assert out.getvalue().strip().startswith("lw_") or len(out.getvalue().strip()) > 20
    assert "for a new tenant acme" in said and "nobody can see acme's traces" in said
    assert "add_member USER acme --role admin" in said
    user = get_user_model().objects.create_user("ana", password="pw")
    Membership.objects.create(user=user, tenant=Tenant.objects.get(slug="acme"), role="viewer")
    _superuser()
    err = StringIO()
    call_command("create_api_key", "acme", stdout=StringIO(), stderr=err)
    said = err.getvalue()
    assert "for the existing tenant acme" in said
    assert "members ana (viewer)" in said and "superusers root" in said


@override_settings(DEBUG=True)
def test_an_unknown_tenant_in_a_url_is_the_apps_404_page_with_debug_on(client, tenant):
    user = get_user_model().objects.create_user("ana", password="pw")
    Membership.objects.create(user=user, tenant=tenant, role="admin")
    client.force_login(user)
    for path in ("/thresholds/nope/", "/thresholds/nope/history/", "/runs/999999/", "/queue/999999/"):
        response = client.get(path)
        page = response.content.decode()
        assert response.status_code == 404, path
        assert "<h1>Not found</h1>" in page and 'id="nav-queue-open"' in page, path
        assert "URLconf" not in page and "DEBUG = True" not in page, path
