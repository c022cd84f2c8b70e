"""What every page's navigation bar shows: the open items of the user's tenants."""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from dashboards.selectors import visible_to
from ingest.models import Operation, Run


def nav(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    now = timezone.now()
    open_ops = Operation.objects.filter(visible_to(user)).filter(
        Q(status=Operation.Status.UNKNOWN) | Q(status=Operation.Status.RUNNING, lease_expires_at__lt=now)
    )
    # A second count rather than one sum: a run waiting blocks an agent now, a write does not.
    waiting = Run.objects.filter(visible_to(user), status=Run.Status.WAITING)
    return {"nav_queue_open": open_ops.count(), "nav_runs_waiting": waiting.count()}
