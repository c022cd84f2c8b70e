"""The thresholds pages (placeholder until its issue-5 part lands)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def index(request):
    return render(request, "dashboards/placeholder.html", {"title": "thresholds"})
