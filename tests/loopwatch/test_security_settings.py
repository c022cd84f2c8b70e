"""With DEBUG off, the production security settings are on, each one can be set by its variable, and
every answer carries the Content-Security-Policy."""

from __future__ import annotations

import pytest

from tests.loopwatch.test_settings import _setting

SECURITY = (
    "(settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE, settings.SECURE_HSTS_SECONDS, "
    "settings.SECURE_PROXY_SSL_HEADER, settings.SECURE_SSL_REDIRECT)"
)
SERVER = {"DATABASE_URL": "postgres://db.example/lw", "SECRET_KEY": "x" * 50}


def test_debug_off_means_secure_cookies_and_hsts():
    assert _setting(SECURITY, **SERVER) == repr((True, True, 31536000, None, False))
    assert _setting(SECURITY, DEBUG="true", **SERVER) == repr((False, False, 0, None, False))


def test_each_security_setting_has_its_variable():
    assert _setting(
        SECURITY,
        SESSION_COOKIE_SECURE="false",
        CSRF_COOKIE_SECURE="false",
        SECURE_HSTS_SECONDS="600",
        SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto",
        SECURE_SSL_REDIRECT="true",
        **SERVER,
    ) == repr((False, False, 600, ("HTTP_X_FORWARDED_PROTO", "https"), True))
    assert _setting(
        "settings.SECURE_PROXY_SSL_HEADER", SECURE_PROXY_SSL_HEADER="X-Forwarded-Ssl=on", **SERVER
    ) == repr(("HTTP_X_FORWARDED_SSL", "on"))
    assert _setting("settings.LOOPWATCH_CSP", LOOPWATCH_CSP="", **SERVER) == "''"


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/accounts/login/", "/api/v1/runs", "/static/js/alerts.js"])
def test_every_answer_carries_the_content_security_policy(client, settings, path):
    answer = client.get(path)
    assert answer["Content-Security-Policy"] == settings.LOOPWATCH_CSP
    assert "script-src 'self';" in answer["Content-Security-Policy"]  # no inline script anywhere
