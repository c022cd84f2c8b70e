"""Reads for the live alerts page: detections of the user's tenants, as alert payloads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from django.db.models import Q, QuerySet

from dashboards.selectors import operator_tenant_ids, visible_to
from dashboards.selectors import user_tenant_ids as _user_tenant_ids
from ingest.detection import KINDS
from ingest.incidents import IncidentPayload, incident_deliveries, incident_payload, reached_summary
from ingest.models import Detection, GuardDelivery, Incident, Run
from ingest.services import alert_payload

# Kinds stored besides the engine's: the ledger's duplicate side effect.
ALERT_KINDS = (*KINDS, "duplicate_side_effect")
PAGE_ALERTS = 100  # rows on a fresh page; older ones are a run's detail away
CATCH_UP_MAX = 500  # a socket that was away long gets the newest 500, and is told there were more


class AlertFilterError(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _parse_time(params: Any, name: str) -> datetime | None:
    raw = (params.get(name) or "").strip()
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise AlertFilterError(name, f"{raw[:40]!r} is not a time like 2026-11-29T08:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC)


@dataclass(frozen=True)
class AlertFilters:
    """What the page shows: interventions unless `observe`, optionally one kind, backend, model,
    action, and a time window [since, until) of the events that fired them (a bar of the overview)."""

    kind: str = ""
    backend: str = ""
    action: str = ""
    observe: bool = False
    model: str = ""
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def parse(cls, params: Any) -> AlertFilters:
        """From query parameters (a QueryDict or a dict of strings); a bad one raises naming it."""
        kind = (params.get("kind") or "").strip()
        if kind and kind not in ALERT_KINDS:
            raise AlertFilterError("kind", f"unknown kind {kind[:40]!r} (one of {', '.join(ALERT_KINDS)})")
        backend = (params.get("backend") or "").strip()
        if len(backend) > 100:
            raise AlertFilterError("backend", "at most 100 characters")
        action = (params.get("action") or "").strip()
        if action and action not in Detection.Action.values:
            raise AlertFilterError(
                "action", f"unknown action {action[:40]!r} (one of {', '.join(Detection.Action.values)})"
            )
        model = (params.get("model") or "").strip()
        if len(model) > 200:
            raise AlertFilterError("model", "at most 200 characters")
        since, until = _parse_time(params, "from"), _parse_time(params, "to")
        if since and until and until <= since:
            raise AlertFilterError("to", "must be after from")
        observe_raw = (params.get("observe") or "").strip().lower()
        if observe_raw not in ("", "0", "1", "on", "true", "false", "off"):
            raise AlertFilterError("observe", "must be 1 or 0")
        # Asking for the observe action is asking to see observations.
        observe = observe_raw in ("1", "on", "true") or action == Detection.Action.OBSERVE
        return cls(
            kind=kind, backend=backend, action=action, observe=observe, model=model, since=since, until=until
        )

    @property
    def narrowed(self) -> bool:
        return bool(self.kind or self.backend or self.model or self.action or self.since or self.until)

    def q(self) -> Q:
        q = Q()
        if not self.observe:
            # Interventions, and what a kind in shadow would have done (stored as observe).
            q &= ~Q(action=Detection.Action.OBSERVE) | Q(evidence__has_key="shadow")
        if self.kind:
            q &= Q(kind=self.kind)
        if self.backend:
            q &= Q(backend=self.backend)
        if self.action:
            q &= Q(action=self.action)
        if self.model:
            q &= Q(model=self.model)
        if self.since:
            q &= Q(ts__gte=self.since)
        if self.until:
            q &= Q(ts__lt=self.until)
        return q

    def matches(self, alert: dict[str, Any]) -> bool:
        """The same test as q(), on a published alert payload."""
        if not self.observe and alert.get("action") == Detection.Action.OBSERVE and not alert.get("shadow"):
            return False
        if self.since or self.until:
            try:
                ts = datetime.fromisoformat(str(alert.get("ts", "")).replace("Z", "+00:00"))
            except ValueError:
                return False
            if (self.since and ts < self.since) or (self.until and ts >= self.until):
                return False
        return (
            (not self.kind or alert.get("kind") == self.kind)
            and (not self.backend or alert.get("backend") == self.backend)
            and (not self.model or alert.get("model") == self.model)
            and (not self.action or alert.get("action") == self.action)
        )

    def as_query(self) -> dict[str, str]:
        query = {
            "kind": self.kind,
            "backend": self.backend,
            "model": self.model,
            "action": self.action,
            "from": _iso(self.since),
            "to": _iso(self.until),
        }
        if self.observe:
            query["observe"] = "1"
        return {k: v for k, v in query.items() if v}


def _iso(when: datetime | None) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else ""


class Alert(TypedDict, total=False):
    id: int
    run: int
    run_id: str
    tenant_id: int
    agent: str
    seq: int
    kind: str
    action: str
    tool: str
    count: int
    backend: str
    model: str
    hint: str
    ts: str
    shadow: str
    feedback: str
    feedback_note: str
    feedback_by: str
    feedback_at: str
    incident: IncidentPayload | None


def user_tenant_ids(*, user) -> list[int]:
    return _user_tenant_ids(user=user)


def feedback_tenant_ids(*, user) -> list[int]:
    """Tenants in which the user may mark alerts (operator or admin; a superuser in every one)."""
    return operator_tenant_ids(user=user)


def _detections(*, tenant_ids: list[int], filters: AlertFilters) -> QuerySet[Detection]:
    return (
        Detection.objects.filter(tenant_id__in=tenant_ids)
        .filter(filters.q())
        .select_related("run", "feedback_by")
        .only(
            *(f.name for f in Detection._meta.concrete_fields if f.name != "evidence"),
            "run__run_id",
            "run__tenant_id",
            "run__agent",
            "feedback_by__username",
        )
    )


def alert_as_dict(detection: Detection) -> Alert:
    alert: Alert = alert_payload(detection, run=detection.run)  # type: ignore[assignment]
    alert["feedback"] = detection.feedback
    alert["feedback_note"] = detection.feedback_note
    alert["feedback_by"] = detection.feedback_by.get_username() if detection.feedback_by else ""
    alert["feedback_at"] = detection.feedback_at.isoformat() if detection.feedback_at else ""
    return alert


def alert_list(*, tenant_ids: list[int], filters: AlertFilters, limit: int = PAGE_ALERTS) -> list[Alert]:
    """The newest alerts, newest first."""
    if not tenant_ids:
        return []
    rows = _detections(tenant_ids=tenant_ids, filters=filters).order_by("-pk")[:limit]
    return [alert_as_dict(d) for d in rows]


def alerts_after(
    *, tenant_ids: list[int], filters: AlertFilters, after: int, limit: int = CATCH_UP_MAX
) -> tuple[list[Alert], bool]:
    """Alerts with id > after, oldest first: at most `limit`, the newest ones, and whether there were more."""
    if not tenant_ids:
        return [], False
    rows = list(
        _detections(tenant_ids=tenant_ids, filters=filters).filter(pk__gt=after).order_by("-pk")[: limit + 1]
    )
    more = len(rows) > limit
    kept = rows[:limit]
    incidents = incidents_for_alerts(kept)
    alerts = []
    for d in reversed(kept):
        alert = alert_as_dict(d)
        alert["incident"] = incidents.get((d.run_id, d.kind, d.signature))
        alerts.append(alert)
    return alerts, more


def latest_alert_id(*, tenant_ids: list[int]) -> int:
    """The newest detection id of these tenants, whatever its action: where a page's socket starts."""
    if not tenant_ids:
        return 0
    return (
        Detection.objects.filter(tenant_id__in=tenant_ids)
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
        or 0
    )


def detection_for_user(*, user, pk: int) -> Detection | None:
    return Detection.objects.filter(visible_to(user), pk=pk).select_related("run").first()


def backends_seen(*, tenant_ids: list[int]) -> list[str]:
    """Backends of the tenants' recent alerts, for the filter's choices."""
    if not tenant_ids:
        return []
    recent = (
        Detection.objects.filter(tenant_id__in=tenant_ids).order_by("-pk").values_list("backend", flat=True)
    )
    return sorted({b for b in recent[:2000] if b})


# --- incidents -------------------------------------------------------------------------------------

PAGE_INCIDENTS = 50  # rows on a page; "older incidents" pages on by id
RANGES = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}


@dataclass(frozen=True)
class IncidentFilters:
    """What the incidents list shows: optionally one kind, backend, model, current action, status,
    the incidents seen within a time range (by last seen), and those seen in a window [since, until)
    (a bar of the overview: an incident whose first and last sightings enclose part of it)."""

    kind: str = ""
    backend: str = ""
    action: str = ""
    status: str = ""
    range: str = ""
    model: str = ""
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def parse(cls, params: Any) -> IncidentFilters:
        base = AlertFilters.parse(
            {k: params.get(k) for k in ("kind", "backend", "action", "model", "from", "to")}
        )
        status = (params.get("status") or "").strip()
        if status and status not in Incident.Status.values:
            raise AlertFilterError("status", f"must be one of {', '.join(Incident.Status.values)}")
        range_ = (params.get("range") or "").strip()
        if range_ and range_ not in RANGES:
            raise AlertFilterError("range", f"must be one of {', '.join(RANGES)} (or left out: any time)")
        return cls(
            kind=base.kind,
            backend=base.backend,
            action=base.action,
            status=status,
            range=range_,
            model=base.model,
            since=base.since,
            until=base.until,
        )

    @property
    def narrowed(self) -> bool:
        return any(
            (
                self.kind,
                self.backend,
                self.model,
                self.action,
                self.status,
                self.range,
                self.since,
                self.until,
            )
        )

    def q(self, *, now: datetime) -> Q:
        q = Q()
        for name in ("kind", "backend", "model", "action", "status"):
            if getattr(self, name):
                q &= Q(**{name: getattr(self, name)})
        if self.range:
            q &= Q(last_seen__gte=now - RANGES[self.range])
        if self.since:
            q &= Q(last_seen__gte=self.since)
        if self.until:
            q &= Q(first_seen__lt=self.until)
        return q

    def socket_query(self) -> dict[str, str]:
        """What the live socket filters alerts on (the status and range are the page's)."""
        query = {
            "kind": self.kind,
            "backend": self.backend,
            "model": self.model,
            "action": self.action,
            "from": _iso(self.since),
            "to": _iso(self.until),
        }
        return {k: v for k, v in query.items() if v}

    def as_query(self) -> dict[str, str]:
        query = {**self.socket_query(), "status": self.status, "range": self.range}
        return {k: v for k, v in query.items() if v}


def _reached(incidents: list[Incident]) -> dict[int, str]:
    """Per incident: "guard" (every step answered by a check), "partly", "traces" (a guarded run,
    no check answered it) or "no guard" (the run does not use the guard)."""
    runs = {i.run_id for i in incidents if i.run.guard_checked_at is not None}
    delivered: set[tuple[int, str, str, str]] = set(
        GuardDelivery.objects.filter(run_id__in=runs).values_list("run_id", "kind", "signature", "action")
    )
    out = {}
    for i in incidents:
        if i.run.guard_checked_at is None:
            out[i.pk] = "no guard"
            continue
        actions = {s.get("action") for s in i.steps if s.get("action") != Detection.Action.OBSERVE}
        got = {a for a in actions if (i.run_id, i.kind, i.signature, a) in delivered}
        out[i.pk] = "guard" if got and got == actions else "partly" if got else "traces"
    return out


def _incident_rows(incidents: list[Incident]) -> list[dict[str, Any]]:
    reached = _reached(incidents)
    return [
        {
            **incident_payload(i, run=i.run, verdict_by=i.verdict_by.get_username() if i.verdict_by else ""),
            "reached": reached[i.pk],
        }
        for i in incidents
    ]


def incident_list(
    *,
    tenant_ids: list[int],
    filters: IncidentFilters,
    before: int | None = None,
    limit: int = PAGE_INCIDENTS,
    now: datetime,
) -> tuple[list[dict[str, Any]], bool]:
    """The newest incidents first (by when they began: a row never moves as its incident escalates),
    those older than `before` (an incident id) when given; and whether there are more."""
    if not tenant_ids:
        return [], False
    query = Incident.objects.filter(tenant_id__in=tenant_ids).filter(filters.q(now=now))
    if before is not None:
        query = query.filter(pk__lt=before)
    rows = list(query.select_related("run", "verdict_by").order_by("-pk")[: limit + 1])
    return _incident_rows(rows[:limit]), len(rows) > limit


def incidents_of_run(*, run: Run) -> list[dict[str, Any]]:
    return _incident_rows(
        list(Incident.objects.filter(run=run).select_related("run", "verdict_by").order_by("pk"))
    )


def latest_incident_id(*, tenant_ids: list[int]) -> int:
    if not tenant_ids:
        return 0
    return (
        Incident.objects.filter(tenant_id__in=tenant_ids).order_by("-pk").values_list("pk", flat=True).first()
        or 0
    )


def incident_for_user(*, user, pk: int) -> Incident | None:
    tenant_ids = user_tenant_ids(user=user)
    return (
        Incident.objects.filter(pk=pk, tenant_id__in=tenant_ids).select_related("run", "verdict_by").first()
    )


def incident_detail(*, incident: Incident) -> dict[str, Any]:
    """An incident with what reached the agent, step by step."""
    deliveries = incident_deliveries(incident=incident, run=incident.run)
    return {
        **_incident_rows([incident])[0],
        "deliveries": deliveries,
        "reached_summary": reached_summary(run=incident.run, deliveries=deliveries),
    }


def incidents_for_alerts(detections: list[Detection]) -> dict[tuple[int, str, str], IncidentPayload]:
    """The incidents of these detections, by problem (run, kind, signature), as payloads."""
    runs = {d.run_id for d in detections}
    if not runs:
        return {}
    keys = {(d.run_id, d.kind, d.signature) for d in detections}
    found = Incident.objects.filter(run_id__in=runs).select_related("run", "verdict_by")
    return {
        (i.run_id, i.kind, i.signature): incident_payload(
            i, run=i.run, verdict_by=i.verdict_by.get_username() if i.verdict_by else ""
        )
        for i in found
        if (i.run_id, i.kind, i.signature) in keys
    }
