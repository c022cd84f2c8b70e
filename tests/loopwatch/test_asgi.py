"""The HTTP handler (loopwatch.asgi.SyncChainASGIHandler) driven over ASGI: whole answers, streamed
files, cookies, and the database connection given back after each request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from django.db import connection

from loopwatch.asgi import django_asgi_app

ROOT = Path(__file__).resolve().parents[2]


def _request(
    method: str, path: str, body: bytes = b"", headers: list | None = None
) -> tuple[int, dict, bytes]:
    """One request through the handler; the status, the headers and the body as the server got them."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *(headers or [])],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    # The body in two messages, as a server passes a large one on.
    pending = [
        {"type": "http.request", "body": body[: len(body) // 2], "more_body": True},
        {"type": "http.request", "body": body[len(body) // 2 :], "more_body": False},
    ]
    sent: list[dict] = []

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(asyncio.wait_for(django_asgi_app(scope, receive, send), 30))
    start, *bodies = sent
    assert start["type"] == "http.response.start"
    assert bodies and all(m["type"] == "http.response.body" for m in bodies)
    assert not bodies[-1].get("more_body", False), "the last body message must close the answer"
    headers_out: dict[str, list[str]] = {}
    for name, value in start["headers"]:
        headers_out.setdefault(name.decode().lower(), []).append(value.decode("latin1"))
    return start["status"], headers_out, b"".join(m.get("body", b"") for m in bodies)


@pytest.mark.django_db(transaction=True)
def test_a_static_file_is_streamed_whole():
    status, headers, body = _request("GET", "/static/js/alerts.js")
    assert status == 200
    assert body == (ROOT / "static" / "js" / "alerts.js").read_bytes()
    assert headers["content-length"] == [str(len(body))]


@pytest.mark.django_db(transaction=True)
def test_an_api_error_is_a_whole_json_answer():
    status, headers, body = _request(
        "POST",
        "/api/v1/events",
        b"[{not json",
        [(b"authorization", b"Bearer nope"), (b"content-type", b"application/json")],
    )
    assert status == 401
    assert headers["content-type"] == ["application/json"]
    assert orjson.loads(body)["error"]


@pytest.mark.django_db(transaction=True)
def test_a_page_sets_its_cookies():
    status, headers, body = _request("GET", "/accounts/login/")
    assert status == 200
    assert any(c.startswith("csrftoken=") for c in headers["set-cookie"])
    assert b"csrfmiddlewaretoken" in body


@pytest.mark.django_db(transaction=True)
def test_each_request_gives_its_database_connection_back(needs_postgres, tenant, make_key):
    api_key = make_key(tenant)
    pool = connection.pool
    if pool is None:
        pytest.skip("DATABASE_URL asks for no pool (pool=false)")
    connection.close()
    for n in range(20):  # more requests than the handler has threads: a kept connection would show
        status, _, body = _request(
            "GET", f"/api/v1/runs/none-{n}", headers=[(b"authorization", f"Bearer {api_key}".encode())]
        )
        assert status == 404, body
    stats = pool.get_stats()
    assert stats["pool_available"] == stats["pool_size"], stats


def test_a_worker_loads_what_storing_events_needs_before_its_first_request(needs_redis):
    """A fresh interpreter that imports the ASGI application has finalised the Celery app and loaded
    redis-py: each uvicorn worker's first batch spent 0.6 s loading them, in a request an agent
    waited for (and frozen out of the garbage collector's full passes only what was loaded before).
    Its young generation is collected every WEB_GC_THRESHOLD allocations, not Python's 700."""
    import os
    import subprocess
    import sys

    probe = (
        "import gc, sys, loopwatch.asgi\n"
        "from celery import current_app\n"
        "print(current_app.finalized, 'redis' in sys.modules, gc.get_threshold()[0], gc.get_freeze_count() > 0)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True", "10000", "True"]
