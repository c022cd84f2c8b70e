from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from dashboards.selectors import overview_figures, user_tenants


@login_required
def overview(request):
    tenants = user_tenants(user=request.user)
    return render(
        request,
        "dashboards/overview.html",
        {"tenants": tenants, **overview_figures(tenants=tenants)},
    )
