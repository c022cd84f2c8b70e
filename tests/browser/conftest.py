"""Browser tests: a real ASGI server (and a real Celery worker) in subprocesses, driven by headless
Chromium through Playwright.

The server runs on the test database, so the tests use committed transactions: what a test
creates with the ORM is what the server sees. On PostgreSQL only (an in-memory SQLite test
database cannot be shared with another process); under CI=true a missing PostgreSQL, Redis or
Chromium fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.db import connection

from loopwatch.celery import app as celery_app

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("LOOPWATCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
UVICORN = (
    sys.executable,
    "-m",
    "uvicorn",
    "loopwatch.asgi:application",
    "--host",
    "127.0.0.1",
    "--no-access-log",
)
CELERY_WORKER = (sys.executable, "-m", "celery", "-A", "loopwatch", "worker", "-c", "1", "-P", "solo")
CELERY_WORKER += ("--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Playwright's sync API drives an event loop in this thread; the ORM calls the tests make between
# page steps are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.django_db(transaction=True))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _database_url() -> str:
    s = connection.settings_dict
    password = f":{s['PASSWORD']}" if s["PASSWORD"] else ""
    return f"postgres://{s['USER']}{password}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@dataclass
class LiveStack:
    """The server's address and its processes' logs (printed when a test fails)."""

    url: str
    logs: list[Path] = field(default_factory=list)

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/accounts/login/", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def live_stack(transactional_db, needs_postgres, tmp_path, request):
    """uvicorn serving loopwatch.asgi (HTTP + WebSocket) on the test database; with REDIS_URL, a
    Celery worker on a queue of its own as well (detection runs there, alerts go through Redis)."""
    port = _free_port()
    queue = f"browser-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "CELERY_QUEUE": queue,
        "DEBUG": "false",
        "SECRET_KEY": "browser-tests-" + uuid.uuid4().hex,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "INFO",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    procs: list[subprocess.Popen] = []
    server_log = tmp_path / "server.log"
    procs.append(
        subprocess.Popen(
            [*UVICORN, "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=server_log.open("w"),
            stderr=subprocess.STDOUT,
        )
    )
    stack = LiveStack(url=f"http://127.0.0.1:{port}", logs=[server_log])
    if os.environ.get("REDIS_URL"):
        worker_log = tmp_path / "worker.log"
        procs.append(
            subprocess.Popen(
                [*CELERY_WORKER, "-Q", queue, "-n", f"{queue}@%h"],
                cwd=ROOT,
                env=env,
                stdout=worker_log.open("w"),
                stderr=subprocess.STDOUT,
            )
        )
        stack.logs.append(worker_log)
    try:
        _wait_ready(stack.url, procs[0], server_log)
        yield stack
    finally:
        _stop(procs)
        if os.environ.get("REDIS_URL"):
            with celery_app.connection_for_write() as conn:
                conn.default_channel.queue_purge(queue)
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(stack.log_tail())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="module")
def chromium():
    # Per module, not per session: Playwright's sync API keeps an event loop running in the main
    # thread while it is started, and async tests elsewhere (Channels' communicator) need none.
    if not Path(CHROMIUM).exists():
        if IN_CI:
            pytest.fail(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
        pytest.skip(f"Chromium is not installed at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, live_stack):
    context = chromium.new_context(base_url=live_stack.url, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(10_000)
    # A page's first load on a machine busy with other suites took more than 10 s (the overview,
    # twice); what the tests assert is what the page shows, not how fast.
    context.set_default_navigation_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors  # tests may assert the page ran without JavaScript errors
    # Whatever the Content-Security-Policy blocked on any page the test opened (Chromium reports it
    # on the console): every browser test checks that the policy breaks nothing.
    blocked: list[str] = []
    page.on(
        "console",
        lambda message: (
            blocked.append(f"{page.url}: {message.text}")
            if "Content Security Policy" in message.text
            else None
        ),
    )
    page.csp_blocked = blocked
    yield page
    context.close()
    assert not blocked, "the Content-Security-Policy blocked:\n" + "\n".join(blocked)
