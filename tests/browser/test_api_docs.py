"""The navigation's "API docs" opens Swagger UI, served from this server alone: every request the
page makes stays on the server's origin (no CDN, no schema validator), and the operations of the
OpenAPI document are listed."""

from __future__ import annotations

from urllib.parse import urlsplit

from tests.browser.helpers import member, sign_in


def test_the_api_docs_render_from_this_server_only(page, live_stack, tenant):
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    _, password = member(tenant, "ana")
    sign_in(page, live_stack, "ana", password)
    requested.clear()
    with page.expect_navigation():
        page.click("nav >> text=API docs")
    assert urlsplit(page.url).path == "/api/v1/docs"
    page.wait_for_selector(".opblock-summary-path", state="attached")
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert any("/api/v1/events" in p for p in paths), paths
    assert any("/api/v1/runs/{run_id}/check" in p.replace("\u200b", "") for p in paths), paths
    assert "loopwatch API" in page.locator(".information-container").inner_text()
    origin = urlsplit(live_stack.url).netloc
    elsewhere = [
        url
        for url in requested
        if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != origin
    ]
    assert requested and elsewhere == []
    assert any(url.endswith("/api/v1/schema") for url in requested)
    assert page.js_errors == []


def test_the_favicon_is_served_to_the_browser(page, live_stack):
    answer = page.goto(live_stack.url + "/favicon.ico")
    assert answer.status == 200
    assert answer.headers["content-type"] == "image/x-icon"
    assert answer.body()[:4] == b"\x00\x00\x01\x00"  # an ICO header
    page.goto(live_stack.url + "/accounts/login/")
    icon = page.locator("link[rel=icon][type='image/svg+xml']").get_attribute("href")
    assert page.goto(live_stack.url + icon).status == 200
