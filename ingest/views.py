"""Plain Django views of ingest: the Prometheus endpoint."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from ingest.metrics import exposition


@require_GET
def metrics_view(request):
    """Prometheus text format. With LOOPWATCH_METRICS_TOKEN set, scrapers send it as a bearer token."""
    token = settings.LOOPWATCH_METRICS_TOKEN
    if token and request.META.get("HTTP_AUTHORIZATION", "") != f"Bearer {token}":
        return HttpResponse("metrics: send Authorization: Bearer <LOOPWATCH_METRICS_TOKEN>\n", status=401)
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)
