"""What keeps secrets and sessions safe at the edges of the web process (docs/security.md).

- SafeExceptionReporterFilter: a 500's report (the debug page, a logged or mailed report) shows no
  connection URL, key or token;
- ContentSecurityPolicyMiddleware: the Content-Security-Policy header of every answer.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.views.debug import SafeExceptionReporterFilter as DjangoFilter


class SafeExceptionReporterFilter(DjangoFilter):
    """Django's filter hides settings whose names say KEY, TOKEN, PASS...; ours also hides the ones
    that carry a password inside a URL or a structure (DATABASE_URL, REDIS_URL, the broker, the
    channel layer's hosts) and the reconcilers' headers."""

    hidden_settings = re.compile(
        DjangoFilter.hidden_settings.pattern + "|_URL$|BROKER|CHANNEL_LAYERS|HEADERS|DSN",
        flags=re.IGNORECASE,
    )


class ContentSecurityPolicyMiddleware:
    """Content-Security-Policy from LOOPWATCH_CSP on every answer that does not set its own.

    Django 5.2 has no CSP of its own. The pages run no inline script (data goes through
    json_script, code through static files), so the default allows scripts of this origin only;
    styles may be inline because Plotly sets them on the charts it draws."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.policy = settings.LOOPWATCH_CSP

    def __call__(self, request):
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response
