"""A 500 never shows connection URLs, keys or tokens: not on the debug page (DEBUG on), not in the
error report a logger or an e-mail gets (DEBUG off)."""

from __future__ import annotations

import sys

import pytest
from django.test import RequestFactory, override_settings
from django.views.debug import ExceptionReporter, technical_500_response

# Every secret ends in MARK; the report quotes source lines, so the literal stands only here.
MARK = "0451"
SECRETS = {
    "DATABASE_URL": f"postgres://lw:db-pass-{MARK}@db.example:5432/lw",
    "REDIS_URL": f"redis://:redis-pass-{MARK}@cache.example:6379/0",
    "CELERY_BROKER_URL": f"redis://:broker-pass-{MARK}@cache.example:6379/0",
    "CHANNEL_LAYERS": {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": f"redis://:layer-pass-{MARK}@cache.example:6379/0"}]},
        }
    },
    "LOOPWATCH_METRICS_TOKEN": f"metrics-token-{MARK}",
    "LOOPWATCH_RECONCILER_HEADERS": {"payments": {"X-Api": f"reconciler-secret-{MARK}"}},
}


HEADERS = {"HTTP_AUTHORIZATION": f"Bearer lw_apikey-{MARK}", "HTTP_COOKIE": f"sessionid=session-{MARK}"}


def _boom() -> None:
    # The report quotes the lines around this one: no secret may stand here.
    raise ValueError("boom")


def _failed_request():
    request = RequestFactory().post("/api/v1/events", data=b"[]", content_type="application/json", **HEADERS)
    try:
        _boom()
    except ValueError:
        return request, sys.exc_info()


@pytest.mark.parametrize("debug", [True, False])
def test_an_error_report_shows_no_connection_url_key_or_token(debug):
    with override_settings(DEBUG=debug, **SECRETS):
        request, exc_info = _failed_request()
        reports = [
            ExceptionReporter(request, *exc_info).get_traceback_html(),
            ExceptionReporter(request, *exc_info).get_traceback_text(),
        ]
        if debug:
            reports.append(technical_500_response(request, *exc_info).content.decode())
    for report in reports:
        assert "boom" in report  # it is the report of this error
        assert MARK not in report, report[report.index(MARK) - 300 : report.index(MARK) + 50]
