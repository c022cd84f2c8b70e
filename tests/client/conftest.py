"""A live loopwatch (pytest-django's live_server: real HTTP, the test database, Celery eager) and a
proxy in front of it that can lose answers or refuse requests, for the client's tests."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proxy:
    """Forwards requests to the live server. `lose_answers` requests are forwarded but their answer
    is never returned (the connection is closed: the client cannot know whether they landed);
    `hold_answers` requests are forwarded and answered only after `hold_s` (the client has timed
    out meanwhile); `refuse` requests get a 503 without being forwarded. `requests` counts what
    came in."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.lose_answers = 0
        self.hold_answers = 0
        self.hold_s = 0.0
        self.refuse = 0
        self.requests: list[str] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    proxy.requests.append(f"{self.command} {self.path}")
                    refuse = proxy.refuse > 0
                    proxy.refuse -= refuse
                    lose = not refuse and proxy.lose_answers > 0
                    proxy.lose_answers -= lose
                    hold = not refuse and not lose and proxy.hold_answers > 0
                    proxy.hold_answers -= hold
                if refuse:
                    payload = b'{"error": "unavailable", "detail": "proxy: refused"}'
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                conn.close()
                if lose:
                    self.close_connection = True
                    return
                if hold:
                    time.sleep(proxy.hold_s)
                self.send_response(response.status)
                for name, value in response.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="proxy", daemon=True).start()

    def posts(self, path: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.startswith("POST") and path in r)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(live_server) -> Iterator[Proxy]:
    proxy = Proxy(live_server.url)
    yield proxy
    proxy.stop()


@pytest.fixture
def down_url() -> str:
    """A port nobody listens on: connections are refused."""
    return f"http://127.0.0.1:{free_port()}"
