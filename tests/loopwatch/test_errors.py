"""Errors answer in the caller's language: JSON for the API, a page for a person."""

from __future__ import annotations

import orjson
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


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param("django", id="django OperationalError"),
        pytest.param("pool", id="psycopg_pool PoolTimeout"),
        pytest.param("interface", id="django InterfaceError"),
    ],
)
def test_a_database_failure_is_503_with_retry_after_for_the_api_and_for_people(rf, exc):
    from django.db import InterfaceError, OperationalError
    from psycopg_pool import PoolTimeout

    from ingest.api.errors import DatabaseUnavailableMiddleware

    error = {
        "django": OperationalError("connection refused"),
        "pool": PoolTimeout("couldn't get a connection after 3.00 sec"),
        "interface": InterfaceError("connection already closed"),
    }[exc]
    middleware = DatabaseUnavailableMiddleware(lambda request: None)
    api = middleware.process_exception(rf.post("/api/v1/events"), error)
    assert api.status_code == 503 and api["Retry-After"] == "2"
    assert api["Content-Type"] == "application/json"
    assert orjson.loads(api.content) == {
        "error": "unavailable",
        "detail": "the database is unavailable; retry after 2 s",
    }
    page = middleware.process_exception(rf.get("/runs/7/"), error)
    assert page.status_code == 503 and page["Retry-After"] == "2"
    assert page["Content-Type"].startswith("text/html") and b"<h1>Unavailable</h1>" in page.content
    assert b'id="nav' not in page.content  # rendered without templates or the database
    assert page["Refresh"] == "2"  # a person's browser tries again by itself


def test_other_failures_are_left_to_the_server_error_handler(rf):
    from ingest.api.errors import DatabaseUnavailableMiddleware

    middleware = DatabaseUnavailableMiddleware(lambda request: None)
    assert middleware.process_exception(rf.get("/api/v1/runs"), ValueError("a bug")) is None


def test_a_database_failure_outside_a_view_reaches_server_error_which_answers_503(rf):
    # A middleware's failure is turned into a response by Django's handler500 (server_error), inside
    # the except block that caught it.
    from django.db import OperationalError

    from ingest.api.errors import server_error

    try:
        raise OperationalError("the server closed the connection unexpectedly")
    except OperationalError:
        api = server_error(rf.get("/api/v1/runs"))
        page = server_error(rf.get("/"))
    assert api.status_code == page.status_code == 503
    assert api["Retry-After"] == page["Retry-After"] == "2"
    try:
        raise ValueError("a bug")
    except ValueError:
        assert server_error(rf.get("/api/v1/runs")).status_code == 500
