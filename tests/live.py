"""A real loopwatch server for tests that need one: uvicorn serving loopwatch.asgi, in a process of
its own, on the test database (what a test commits with the ORM is what the server sees)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def test_database_url() -> str:
    """DATABASE_URL of the test database; skips (fails under CI) when it is not PostgreSQL."""
    if connection.vendor != "postgresql":  # an in-memory SQLite database cannot be shared
        message = "needs PostgreSQL (DATABASE_URL=postgres://...)"
        if IN_CI:
            pytest.fail(f"{message}: CI must run on the real servers")
        pytest.skip(message)
    s = connection.settings_dict
    password = f":{s['PASSWORD']}" if s["PASSWORD"] else ""
    return f"postgres://{s['USER']}{password}@{s['HOST'] or HOST}:{s['PORT'] or 5432}/{s['NAME']}"


test_database_url.__test__ = False  # a helper, not a test


@contextlib.contextmanager
def uvicorn_serve(log: Path, **env: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """uvicorn on a free port with the test database, eager Celery and `env` on top; yields its URL
    and its process (one process: no --workers), stopped at the end."""
    port = free_port()
    environ = {**os.environ, "DATABASE_URL": test_database_url(), "LOG_LEVEL": "WARNING", **env}
    environ.pop("REDIS_URL", None)
    environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "loopwatch.asgi:application",
                "--host",
                HOST,
                "--port",
                str(port),
            ],
            cwd=ROOT,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"uvicorn exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"uvicorn did not answer:\n{log.read_text()[-3000:]}"
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(url + "/accounts/login/", timeout=2) as response:
                    if response.status == 200:
                        break
            time.sleep(0.2)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@dataclass
class Receiver:
    """What a local receiver got; `answers` are the statuses it gives, in order (then 200)."""

    url: str
    answers: list[int] = field(default_factory=list)
    received: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    redirect_hits: int = 0


@contextlib.contextmanager
def receiver_serve() -> Iterator[Receiver]:
    """A local HTTP receiver (a real server in a thread) that records the POSTs it gets."""
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/moved-here":
                state.redirect_hits += 1
            state.received.append((self.path, dict(self.headers), body))
            code = state.answers.pop(0) if state.answers else 200
            self.send_response(code)
            if code in (301, 302, 307, 308):
                self.send_header("Location", state.url.rsplit("/", 1)[0] + "/moved-here")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
