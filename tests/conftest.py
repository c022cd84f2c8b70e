"""Shared fixtures. The suite runs on whatever DATABASE_URL / REDIS_URL say; under CI=true a
test that needs PostgreSQL or Redis fails instead of skipping when they are not configured."""

from __future__ import annotations

import os

import pytest
from django.db import connection, connections

from ingest.services import api_key_create, tenant_get_or_create

IN_CI = os.environ.get("CI", "").lower() == "true"

# Connections opened by Channels' worker threads must close after each use, or the test
# database cannot be dropped at the end of the session.
connections.settings["default"]["CONN_MAX_AGE"] = 0


def _need(what: str, present: bool) -> None:
    if present:
        return
    message = f"needs {what}"
    if IN_CI:
        pytest.fail(f"{message}: CI must run on the real servers")
    pytest.skip(message)


@pytest.fixture
def needs_postgres() -> None:
    _need("PostgreSQL (DATABASE_URL=postgres://...)", connection.vendor == "postgresql")


@pytest.fixture
def needs_redis() -> None:
    _need("Redis (REDIS_URL=redis://...)", bool(os.environ.get("REDIS_URL")))


@pytest.fixture(autouse=True)
def eager_celery(request, settings):
    """Tasks run in-process after commit, unless a test drives real workers."""
    from loopwatch.celery import app

    if request.node.get_closest_marker("real_workers"):
        yield
        return
    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = previous


@pytest.fixture
def tenant(db):
    return tenant_get_or_create(slug="acme")


@pytest.fixture
def other_tenant(db):
    return tenant_get_or_create(slug="globex")


@pytest.fixture
def make_key(db):
    def make(tenant, scopes=("ingest", "read")) -> str:
        _, raw = api_key_create(tenant=tenant, scopes=list(scopes))
        return raw

    return make


@pytest.fixture
def api(client, django_capture_on_commit_callbacks):
    """Django's test client speaking JSON with a bearer key; work queued on commit runs after each call."""

    class Api:
        def post(self, path: str, body, key: str | None, content_type: str = "application/json", **extra):
            import orjson

            data = body if isinstance(body, bytes | str) else orjson.dumps(body)
            headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
            with django_capture_on_commit_callbacks(execute=True):
                return client.generic("POST", path, data, content_type=content_type, **headers, **extra)

        def get(self, path: str, key: str | None, **params):
            headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
            return client.get(path, params, **headers)

    return Api()


def pytest_collection_modifyitems(config, items):
    """Fault tests (real processes, private servers) and browser tests last: they are the slowest,
    and the fast tests should fail first."""

    def slowness(item) -> int:
        path = str(item.fspath).replace("\\", "/")
        return 2 if "tests/browser/" in path else 1 if "tests/faults/" in path else 0

    items.sort(key=slowness)


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """A channel layer of its own per test: channels_redis keeps per-event-loop state (receive
    locks, buffers, connections), and each async test runs on a new loop."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture
def receiver():
    """A local HTTP receiver (tests.live.receiver_serve) for outbound requests: notifications."""
    from tests.live import receiver_serve

    with receiver_serve() as state:
        yield state
