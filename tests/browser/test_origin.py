"""Cross-site WebSocket hijacking, in Chromium: a page of another origin (another port of the same
host, so the browser sends the user's session cookie along) cannot open the alerts socket; the
same script on the app's own origin can."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from dashboards.models import Membership
from tests.browser.helpers import member, sign_in

# Opens the alerts socket and records what happened in window.wsResult.
SCRIPT = """
(url) => {
  window.wsResult = {opened: false, messages: [], closed: null};
  const ws = new WebSocket(url);
  ws.onopen = () => { window.wsResult.opened = true; };
  ws.onmessage = (event) => { window.wsResult.messages.push(event.data); };
  ws.onclose = (event) => { window.wsResult.closed = event.code; };
}
"""


@pytest.fixture
def other_origin():
    """A plain page served from another port of 127.0.0.1: another origin, the same site."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<!doctype html><title>elsewhere</title><p>another origin</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _open_alerts_socket(page, live_stack) -> dict:
    page.evaluate(SCRIPT, live_stack.ws_url + "/ws/alerts?after=0")
    # Polled from here: wait_for_function evaluates its predicate with eval(), which the app's
    # Content-Security-Policy (rightly) refuses.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        result = page.evaluate("window.wsResult")
        if result["closed"] is not None or result["messages"]:
            return result
        page.wait_for_timeout(100)
    raise AssertionError(f"the socket neither opened nor closed: {result}")


def test_a_page_of_another_origin_cannot_open_the_alerts_socket_with_the_users_cookie(
    page, live_stack, tenant, other_origin
):
    member(tenant, "ana", role=Membership.Role.OPERATOR)
    sign_in(page, live_stack, "ana", "pw-browser-1")

    page.goto(other_origin + "/")
    assert page.context.cookies(live_stack.url)  # the session cookie is there, and would be sent
    elsewhere = _open_alerts_socket(page, live_stack)
    assert elsewhere == {"opened": False, "messages": [], "closed": 1006}

    page.goto(live_stack.url + "/runs/")
    home = _open_alerts_socket(page, live_stack)
    assert home["opened"] is True
    assert '"type":"catch_up"' in home["messages"][0]
