"""Plotly.js served by loopwatch itself: pages must draw charts on machines without internet access.

The bundle comes from the installed plotly package, at a URL carrying its version, so it can be
cached for a year; gzipped once per process when the browser accepts it (4.8 MB -> ~1.4 MB).
"""

from __future__ import annotations

import functools
import gzip
import hashlib

from django.http import HttpRequest, HttpResponse, HttpResponseNotModified
from django.shortcuts import redirect
from django.views.decorators.http import require_safe

CACHE_CONTROL = "public, max-age=31536000, immutable"


@functools.cache
def plotlyjs_version() -> str:
    from plotly.offline import get_plotlyjs_version

    return get_plotlyjs_version()


@functools.cache
def _bundle() -> tuple[bytes, bytes, str]:
    from plotly.offline import get_plotlyjs

    body = get_plotlyjs().encode()
    return body, gzip.compress(body, compresslevel=6, mtime=0), f'"{hashlib.sha256(body).hexdigest()[:20]}"'


@require_safe
def plotlyjs(request: HttpRequest, version: str) -> HttpResponse:
    if version != plotlyjs_version():  # a page cached before an upgrade: send it to the bundle we have
        return redirect("plotlyjs", version=plotlyjs_version())
    body, zipped, etag = _bundle()
    if request.headers.get("If-None-Match") == etag:
        response: HttpResponse = HttpResponseNotModified()
    else:
        accepts_gzip = "gzip" in request.headers.get("Accept-Encoding", "")
        response = HttpResponse(
            zipped if accepts_gzip else body, content_type="text/javascript; charset=utf-8"
        )
        if accepts_gzip:
            response["Content-Encoding"] = "gzip"
    response["ETag"] = etag
    response["Cache-Control"] = CACHE_CONTROL
    response["Vary"] = "Accept-Encoding"
    return response
