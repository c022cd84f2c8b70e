"""The demo's payment service: what a reconciler asks whether a refund happened.

`manage.py simulate --downstream-port N` serves it on 127.0.0.1:N while it sends traffic, and
`manage.py demo_setup --downstream-url http://127.0.0.1:N` gives the demo tenant a reconciler for
`create_refund` that asks it (`place_order` gets none: those writes are left to a person). The
answer for an operation key is fixed by the key's hash, so every ask gets the same one:

- DONE_SHARE: `{"status": "succeeded", "id": "rf_…"}`: it happened (the operation SUCCEEDED);
- NOT_FOUND_SHARE: 404: it never happened (RETRYABLE_FAILED once no attempt can still act);
- the rest: `{"status": "processing"}`: no verdict, asked again with backoff until the reconciler
  gives up and a person decides.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from urllib.parse import unquote

import orjson

REFUNDS_PATH = "/refunds/"
DONE_SHARE = 0.6
NOT_FOUND_SHARE = 0.2


def refund_status(operation_key: str) -> tuple[int, dict[str, str] | None]:
    """(HTTP status, body) for the refund of an operation key."""
    digest = hashlib.sha256(operation_key.encode()).digest()
    draw = int.from_bytes(digest[:4], "big") / 2**32
    if draw < DONE_SHARE:
        return 200, {"status": "succeeded", "id": "rf_" + digest[4:12].hex()}
    if draw < DONE_SHARE + NOT_FOUND_SHARE:
        return 404, None
    return 200, {"status": "processing"}


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "demo-payments/1"

    def do_GET(self) -> None:
        if not self.path.startswith(REFUNDS_PATH):
            self._answer(404, {"error": "not_found"})
            return
        status, body = refund_status(unquote(self.path[len(REFUNDS_PATH) :].split("?")[0]))
        self._answer(status, body if body is not None else {"error": "not_found"})

    def _answer(self, status: int, body: dict[str, str]) -> None:
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the demo's output is simulate's progress, not an access log


class PaymentService:
    """The service on 127.0.0.1:port in a daemon thread; `close()` stops it."""

    def __init__(self, port: int) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-payments", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
