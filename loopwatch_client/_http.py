"""One keep-alive HTTP/1.1 connection per thread to a loopwatch server (stdlib http.client)."""

from __future__ import annotations

import http.client
import json
import os
import select
import threading
from typing import Any
from urllib.parse import urlsplit

API_PREFIX = "/api/v1"
USER_AGENT = "loopwatch-client/0.3"
MIN_TIMEOUT_S = 0.01  # a deadline all but spent still gets one short try, never a blocking socket


class TransportError(OSError):
    """No answer: connection refused, reset, timed out, or a broken HTTP exchange.

    `may_have_landed` is False only when the request cannot have reached the server (the
    connection was refused): after a timeout or a reset it may have been processed.
    """

    may_have_landed = True


class Transport:
    """POST/GET JSON to base_url + /api/v1 with a bearer key; safe to share between threads and
    across fork (a child opens its own connections)."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url: expected http(s)://host[:port], got {base_url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        path = parts.path.rstrip("/")
        self.prefix = path if path.endswith(API_PREFIX) else path + API_PREFIX
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        }
        self.timeout = timeout
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        local = self._local
        conn: http.client.HTTPConnection | None = getattr(local, "conn", None)
        if conn is not None and getattr(local, "pid", None) != os.getpid():
            conn = None  # inherited through fork: the parent's socket, not ours
        if conn is not None and conn.sock is not None:
            # A keep-alive connection the server has closed meanwhile reads as readable (EOF):
            # open a new one rather than send a request into it.
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if readable:
                conn.close()
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self.timeout)
            local.conn, local.pid = conn, os.getpid()
        return conn

    def request(
        self, method: str, path: str, data: bytes | None = None, *, timeout: float | None = None
    ) -> tuple[int, dict[str, Any]]:
        """(status, JSON object answered) for prefix + path; TransportError when there is no answer.

        timeout: this request's limit in seconds (default: the transport's), for the connection and
        for each wait on the socket: a caller with a deadline passes what is left of it.
        """
        conn = self._connection()
        limit = self.timeout if timeout is None else max(timeout, MIN_TIMEOUT_S)
        conn.timeout = limit
        if conn.sock is not None:
            conn.sock.settimeout(limit)
        try:
            conn.request(method, self.prefix + path, body=data, headers=self._headers)
            response = conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            error = TransportError(f"{method} {self.prefix}{path}: {type(exc).__name__}: {exc}")
            error.may_have_landed = not isinstance(exc, ConnectionRefusedError)
            raise error from exc
        if response.will_close:
            conn.close()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"detail": raw[:300].decode(errors="replace")}
        if not isinstance(answer, dict):
            answer = {"detail": str(answer)[:300]}
        return response.status, answer

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
