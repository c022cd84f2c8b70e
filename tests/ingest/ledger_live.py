"""What the ledger's live tests share: a payment-like downstream service with injectable faults,
the tool an agent runtime wraps around it, and a real uvicorn serving loopwatch on the test
database (tests/ingest/test_ledger_faults.py, test_ledger_attempts.py, tests/client/test_deadlines.py).

The tool's pieces (DownstreamUnavailable, DownstreamRejected, args_for, downstream_tool) are
stdlib only: child processes get their source (inspect.getsource) and run it without Django.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from django.db import connection

from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"


# --- the tool, as an agent runtime wraps it (also run in the client processes: stdlib only) ---------


class DownstreamUnavailable(Exception):
    """503 or connection refused: the downstream did not take the request, so there was no effect."""

    error_class = "transient"


class DownstreamRejected(Exception):
    """4xx: the downstream refused the arguments; running it again cannot help."""

    error_class = "invalid_argument"


def args_for(key: str) -> dict:
    """The arguments of the operation `key`: the same in every process."""
    return {"customer": f"cus-{key}", "amount_cents": 100 + sum(map(ord, key)) % 900, "currency": "EUR"}


def downstream_tool(base_url: str, timeout: float, calls: list | None = None, after_s: float = 0.0):
    """charge(args, idempotency_key=...) -> the downstream's record; appends each key to `calls`;
    after_s: the tool goes on working this long after the downstream answered (a slow tool)."""

    def charge(args: dict, *, idempotency_key: str) -> dict:
        import json
        import time
        import urllib.error
        import urllib.request

        if calls is not None:
            calls.append(idempotency_key)
        request = urllib.request.Request(
            f"{base_url}/effects",
            data=json.dumps(args).encode(),
            method="POST",
            headers={"Idempotency-Key": idempotency_key, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                record = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                raise DownstreamUnavailable(f"503 from {base_url}") from exc
            raise DownstreamRejected(f"{exc.code} from {base_url}: {exc.read()[:200]!r}") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                raise DownstreamUnavailable(f"{base_url} refused the connection") from exc
            raise
        time.sleep(after_s)
        return record

    return charge


# --- the downstream service -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Downstream:
    """A payment-like service on a real port, with injectable faults.

    POST /effects (Idempotency-Key): performs the effect once per key and answers its record; the
    same key again answers the first record with no second effect. GET /status/<key>: {"state":
    "done", ...record} or {"state": "not_found"}. Faults per key (`fault(key, mode, seconds)`; the
    key "*" is every key without a fault of its own): drop (effect, then answer after `seconds`:
    the client has timed out), hold (effect, then wait for `release`: the executor is killed
    meanwhile), black_hole (no effect, no answer for `seconds`), slow (the effect only `seconds`
    after the request came, then the answer), fail_before (503, no effect), reject (400, no
    effect), status_hold (the status check of the key waits for `release`). `reached[key]` is set
    when a hold or a slow request is reached. stop()/start() take the whole service down and back
    on the same port.

    Two counters tell the two safeguards apart: `calls` (the requests that reached it: the ledger
    alone must keep that at one per key) and `effects` (what it did: its own idempotency would
    keep that at one anyway).
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()
        self.records: dict[str, dict] = {}
        self.status_asks: Counter[str] = Counter()
        self.faults: dict[str, tuple[str, float]] = {}
        self.reached: dict[str, threading.Event] = {}
        self.release = threading.Event()
        self.server: ThreadingHTTPServer | None = None

    def fault(self, key: str, mode: str | None, seconds: float = 0.0) -> None:
        with self.lock:
            if mode is None:
                self.faults.pop(key, None)
            else:
                self.faults[key] = (mode, seconds)
                self.reached.setdefault(key, threading.Event())

    def _fault_of(self, key: str) -> tuple[str, float]:
        return self.faults.get(key) or self.faults.get("*") or ("", 0.0)

    def _reached(self, key: str) -> None:
        self.reached.setdefault(key, threading.Event()).set()

    def start(self) -> None:
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                key = self.headers.get("Idempotency-Key", "")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/effects" or not key:
                    return self._answer(400, {"error": "POST /effects with an Idempotency-Key"})
                with downstream.lock:
                    downstream.calls[key] += 1
                    mode, seconds = downstream._fault_of(key)
                if mode == "fail_before":
                    return self._answer(503, {"error": "unavailable"})
                if mode == "reject":
                    return self._answer(400, {"error": "card declined"})
                if mode == "black_hole":
                    time.sleep(seconds)
                    return self._answer(503, {"error": "lost"})
                if mode == "slow":
                    with downstream.lock:
                        downstream._reached(key)
                    time.sleep(seconds)
                with downstream.lock:
                    if key not in downstream.records:  # honour the idempotency key
                        downstream.effects[key] += 1
                        downstream.records[key] = {
                            "id": f"ch_{sum(downstream.effects.values()):06d}",
                            "key": key,
                            "amount_cents": json.loads(body).get("amount_cents"),
                        }
                    record = downstream.records[key]
                if mode == "hold":
                    downstream._reached(key)
                    downstream.release.wait(30)
                elif mode == "drop":
                    time.sleep(seconds)
                self._answer(200, record)

            def do_GET(self) -> None:
                if not self.path.startswith("/status/"):
                    return self._answer(404, {"error": "no such path"})
                key = unquote(self.path.removeprefix("/status/"))
                with downstream.lock:
                    downstream.status_asks[key] += 1
                    record = downstream.records.get(key)
                    mode, _ = downstream.faults.get(key, ("", 0.0))
                if mode == "status_hold":
                    downstream._reached(key)
                    downstream.release.wait(30)
                self._answer(200, {"state": "done", **record} if record else {"state": "not_found"})

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                with contextlib.suppress(OSError):  # the client may have given up (a "drop")
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            block_on_close = False
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass

        self.release.clear()
        self.server = Server((HOST, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, name="downstream", daemon=True).start()

    def stop(self) -> None:
        """Down: the port is closed (connections are refused)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.release.set()


# --- the live loopwatch server --------------------------------------------------------------------


def database_url() -> str:
    s = connection.settings_dict
    return (
        f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )


def need_postgres() -> None:
    """As the needs_postgres fixture, for fixtures wider than a function."""
    if connection.vendor != "postgresql":
        message = "needs PostgreSQL (DATABASE_URL=postgres://...)"
        if IN_CI:
            pytest.fail(f"{message}: CI must run on the real servers")
        pytest.skip(message)


@contextlib.contextmanager
def uvicorn_serving(log_path: Path, *, workers: int = 2) -> Iterator[tuple[str, subprocess.Popen]]:
    """uvicorn serving loopwatch.asgi for the test database, REDIS_URL unset (Celery eager), DEBUG
    on; yields (its URL, the process, the leader of its own process group). Stopped at the end."""
    need_postgres()
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "DEBUG": "true", "LOG_LEVEL": "WARNING"}
    env.pop("REDIS_URL", None)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "uvicorn"),
                "loopwatch.asgi:application",
                "--host",
                HOST,
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"uvicorn exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"uvicorn did not answer:\n{log_path.read_text()[-3000:]}"
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            with contextlib.suppress(OSError):
                conn.request("GET", "/api/v1/operations/ping")
                if conn.getresponse().status in (401, 403):  # up: it asks for a key
                    break
            conn.close()
            time.sleep(0.2)
        conn.close()
        if workers > 1:
            time.sleep(1.0)  # the other workers boot too
        yield f"http://{HOST}:{port}", proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)  # a test may have left it frozen
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # a worker the supervisor left behind


def child_source(main: str) -> str:
    """A child process's script: the tool's stdlib pieces, then `main`."""
    import inspect

    return "\n".join(
        [
            "from __future__ import annotations",
            *(
                inspect.getsource(x)
                for x in (DownstreamUnavailable, DownstreamRejected, args_for, downstream_tool)
            ),
            main,
        ]
    )


def collect(procs: list[subprocess.Popen], timeout: float = 120) -> list[dict]:
    """The JSON report each child printed; every child must have exited 0 without loading Django."""
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out))
    for report in reports:
        assert not report["django_loaded"], "loopwatch_client must not import Django"
    return reports
