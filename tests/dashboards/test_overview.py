from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from dashboards.models import Membership
from ingest.services import events_ingest
from tests.ingest.events import model_round, run_started

pytestmark = pytest.mark.django_db


def test_the_overview_needs_a_login(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_overview_shows_only_the_users_tenants(client, tenant, other_tenant):
    events_ingest(tenant=tenant, events=[run_started("mine"), model_round("mine")], max_event_bytes=1 << 20)
    events_ingest(
        tenant=other_tenant, events=[run_started("theirs", backend="anthropic")], max_event_bytes=1 << 20
    )
    user = get_user_model().objects.create_user("ana", password="pw")
    Membership.objects.create(user=user, tenant=tenant)
    client.force_login(user)
    page = client.get("/").content.decode()
    assert "mine" in page and "theirs" not in page and "anthropic" not in page
    assert 'id="runs-total">1<' in page


def test_the_overview_says_what_to_do_when_empty(client, tenant):
    user = get_user_model().objects.create_user("ben", password="pw")
    Membership.objects.create(user=user, tenant=tenant)
    client.force_login(user)
    assert "No traces yet" in client.get("/").content.decode()


def test_a_member_signs_in_through_the_login_page(client, tenant):
    user = get_user_model().objects.create_user("cai", password="pw")
    Membership.objects.create(user=user, tenant=tenant)
    assert "Sign in" in client.get("/accounts/login/?next=/").content.decode()
    response = client.post("/accounts/login/", {"username": "cai", "password": "pw", "next": "/"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert "Overview" in client.get("/").content.decode()
