"""Errors answer in the caller's language: JSON for the API, a page for a person."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from dashboards.models import Membership

pytestmark = pytest.mark.django_db


def test_a_missing_page_is_a_page_and_a_missing_api_resource_is_json(client, tenant):
    user = get_user_model().objects.create_user("ana", password="pw")
    Membership.objects.create(user=user, tenant=tenant)
    client.force_login(user)
    page = client.get("/no/such/page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
    assert "Not found" in page.content.decode() and 'id="nav-queue-open"' in page.content.decode()
    api = client.get("/api/v1/no/such/thing")
    assert api.status_code == 404 and api.json() == {
        "error": "not_found",
        "detail": "/api/v1/no/such/thing: no such resource",
    }
    asked_json = client.get("/no/such/page/", HTTP_ACCEPT="application/json")
    assert asked_json.status_code == 404 and asked_json.json()["error"] == "not_found"


def test_a_server_error_is_a_bare_page_for_people_and_json_for_the_api(rf):
    from ingest.api.errors import server_error

    page = server_error(rf.get("/runs/7/"))
    assert page.status_code == 500 and b"<h1>Server error</h1>" in page.content
    assert b"nav" not in page.content  # rendered without templates or the database
    api = server_error(rf.get("/api/v1/runs"))
    assert api.status_code == 500 and api["Content-Type"] == "application/json"
