"""Request bodies are read with limits, by a real uvicorn, over raw sockets.

- A route that needs an API key answers 401 before reading a byte of the body when the request
  has no valid key: a 1 GiB chunked upload neither reaches memory nor temp files.
- A body over LOOPWATCH_MAX_BODY_BYTES is refused with 413 as soon as it is over: at once when
  Content-Length says so, while it streams when it is chunked.
- A body that trickles in is cut off with 408 after LOOPWATCH_BODY_TIMEOUT_S.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.services import api_key_create, tenant_get_or_create
from tests.live import HOST, uvicorn_serve

LIMIT = 1024 * 1024  # the server's LOOPWATCH_MAX_BODY_BYTES here
BODY_TIMEOUT_S = 2
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory) -> Iterator[tuple[int, int, Path]]:
    """(port, pid, the server's TMPDIR)."""
    folder = tmp_path_factory.mktemp("bodies")
    temp = folder / "tmp"
    temp.mkdir()
    with uvicorn_serve(
        folder / "uvicorn.log",
        LOOPWATCH_MAX_BODY_BYTES=str(LIMIT),
        LOOPWATCH_MAX_EVENT_BYTES="1024",
        LOOPWATCH_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        TMPDIR=str(temp),
    ) as (url, proc):
        yield int(url.rsplit(":", 1)[1]), proc.pid, temp


@pytest.fixture
def key(transactional_db) -> str:
    _, raw = api_key_create(tenant=tenant_get_or_create(slug="acme"), scopes=["ingest"])
    return raw


class Watch:
    """The server process's resident memory and the bytes of its open files in its TMPDIR (a
    spooled upload is unlinked at once: only /proc/PID/fd sees it), sampled every 10 ms."""

    def __init__(self, pid: int, temp: Path) -> None:
        self.pid, self.temp = pid, str(temp)
        self.rss_start = self.rss_max = self._rss()
        self.temp_max = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def _temp_bytes(self) -> int:
        total = 0
        fds = Path(f"/proc/{self.pid}/fd")
        for fd in os.listdir(fds):
            try:
                if os.readlink(fds / fd).startswith(self.temp):
                    total += os.stat(fds / fd).st_size
            except OSError:  # closed meanwhile
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.rss_max = max(self.rss_max, self._rss())
            self.temp_max = max(self.temp_max, self._temp_bytes())

    def stop(self) -> Watch:
        self._stop.set()
        self._thread.join()
        return self


def _exchange(
    port: int, head: str, chunks: Iterator[bytes], timeout: float = 30
) -> tuple[int, dict, bytes, int]:
    """Send a request head, then the body chunks from a thread, while reading the answer here.
    Returns the status, the headers, the body and how many body bytes the server let us send."""
    sock = socket.create_connection((HOST, port))
    sock.settimeout(timeout)
    sock.sendall(head.encode("latin-1"))
    sent = 0

    def write() -> None:
        nonlocal sent
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # the server closed the connection: what this is about
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    raw = b""
    try:
        while b"\r\n\r\n" not in raw or len(raw) < _expected_length(raw):
            part = sock.recv(65536)
            if not part:
                break
            raw += part
    except ConnectionResetError:
        pass
    writer.join(timeout=timeout)
    sock.close()
    assert b"\r\n\r\n" in raw, f"no answer (got {raw[:200]!r})"
    header_block, body = raw.split(b"\r\n\r\n", 1)
    lines = header_block.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines[1:])}
    assert "content-length" in headers, headers  # a whole answer, not a chunked one
    return int(lines[0].split()[1]), headers, body, sent


def _expected_length(raw: bytes) -> int:
    if b"\r\n\r\n" not in raw:
        return 1 << 62
    head, _ = raw.split(b"\r\n\r\n", 1)
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return 1 << 62  # read until the server closes


def _chunked(total: int, size: int = MiB) -> Iterator[bytes]:
    piece = b"x" * size
    for _ in range(total // size):
        yield b"%x\r\n%s\r\n" % (size, piece)
    yield b"0\r\n\r\n"


def _head(path: str, *, key: str | None = None, extra: str = "Transfer-Encoding: chunked\r\n") -> str:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n{auth}{extra}\r\n"


@pytest.mark.parametrize("path", ["/api/v1/events", "/v1/traces"])
def test_a_gibibyte_without_a_key_is_refused_before_the_body_is_read(server, path, transactional_db):
    port, pid, temp = server
    watch = Watch(pid, temp)
    status, headers, body, sent = _exchange(port, _head(path), _chunked(1024 * MiB))
    watch.stop()
    assert status == 401
    assert sent < 64 * MiB, f"the server took {sent / MiB:.0f} MiB of the body"
    assert watch.temp_max < MiB, f"{watch.temp_max / MiB:.1f} MiB went to temp files"
    assert watch.rss_max - watch.rss_start < 64 * MiB, (
        f"memory grew by {(watch.rss_max - watch.rss_start) / MiB:.0f} MiB"
    )
    assert headers.get("connection") == "close"  # the rest of the body is not waited for
    assert json.loads(body)  # the route's own answer (an API error, an OTLP Status)


def test_a_chunked_body_over_the_limit_is_refused_while_it_streams(server, key):
    port, pid, temp = server
    watch = Watch(pid, temp)
    status, headers, body, sent = _exchange(port, _head("/api/v1/events", key=key), _chunked(256 * MiB))
    watch.stop()
    assert status == 413
    assert json.loads(body) == {
        "error": "body_too_large",
        "detail": f"body: over the limit of {LIMIT} bytes (LOOPWATCH_MAX_BODY_BYTES)",
        "field": "body",
    }
    assert headers.get("connection") == "close"
    assert sent < 64 * MiB, f"the server took {sent / MiB:.0f} MiB of the body"
    assert watch.temp_max <= 2 * LIMIT


def test_a_content_length_over_the_limit_is_refused_before_any_body_is_sent(server, key):
    port, _, _ = server
    # Nothing but the head: an answer can only come before the body.
    status, _, body, _ = _exchange(
        port,
        _head("/api/v1/events", key=key, extra=f"Content-Length: {10 * 1024 * MiB}\r\n"),
        iter(()),
        timeout=10,
    )
    assert status == 413
    assert (
        json.loads(body)["detail"]
        == f"body: {10 * 1024 * MiB} bytes, the limit is {LIMIT} bytes (LOOPWATCH_MAX_BODY_BYTES)"
    )


def test_a_body_that_trickles_in_is_cut_off(server, key):
    port, _, _ = server

    def trickle() -> Iterator[bytes]:
        for _ in range(200):
            yield b" "
            time.sleep(0.1)

    started = time.monotonic()
    status, headers, body, sent = _exchange(
        port, _head("/api/v1/events", key=key, extra="Content-Length: 200\r\n"), trickle(), timeout=15
    )
    assert status == 408
    assert json.loads(body) == {
        "error": "body_timeout",
        "detail": f"body: not received within {BODY_TIMEOUT_S} s (LOOPWATCH_BODY_TIMEOUT_S)",
        "field": "body",
    }
    assert time.monotonic() - started < BODY_TIMEOUT_S + 3
    assert sent < 200
    assert headers.get("connection") == "close"


def test_a_body_within_the_limits_is_served_on_a_connection_kept_alive(server, key):
    port, _, _ = server
    events = json.dumps([{"type": "run_started", "run_id": "r1", "ts": "2026-11-29T10:00:00Z"}]).encode()
    sock = socket.create_connection((HOST, port))
    sock.settimeout(10)
    for _ in range(2):
        sock.sendall(
            _head("/api/v1/events", key=key, extra=f"Content-Length: {len(events)}\r\n").encode() + events
        )
        raw = b""
        while len(raw) < _expected_length(raw):
            raw += sock.recv(65536)
        assert raw.startswith(b"HTTP/1.1 200 ")
    sock.close()
