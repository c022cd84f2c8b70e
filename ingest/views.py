"""Plain Django views of ingest: the Prometheus endpoint."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from ingest.metrics import exposition


@require_GET
def metrics_view(request):
    """Prometheus text format. With LOOPWATCH_METRICS_TOKEN set, scrapers send it as a bearer token;
    without one, /metrics answers only when LOOPWATCH_METRICS_PUBLIC (by default: the embedded mode
    with DEBUG on, the Quickstart)."""
    token = settings.LOOPWATCH_METRICS_TOKEN
    if token:
        sent = request.META.get("HTTP_AUTHORIZATION", "").encode()
        if not hmac.compare_digest(sent, f"Bearer {token}".encode()):
            return HttpResponse("metrics: send Authorization: Bearer <LOOPWATCH_METRICS_TOKEN>\n", status=401)
    elif not settings.LOOPWATCH_METRICS_PUBLIC:
        return HttpResponse(
            "metrics: not public here; set LOOPWATCH_METRICS_TOKEN and have the scraper send it as a "
            "bearer token (or LOOPWATCH_METRICS_PUBLIC=true behind a network that keeps others out)\n",
            status=403,
        )
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)
