"""Views of the site itself, not of an app."""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

FAVICON = settings.BASE_DIR / "static" / "favicon.ico"


@cache
def _favicon_bytes() -> bytes:
    return FAVICON.read_bytes()


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask for on pages that name no icon (the admin, API answers)."""
    response = HttpResponse(_favicon_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
