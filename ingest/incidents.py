"""Incidents: a run's detections of one problem folded into one row, and what reached the agent.

A problem is a run's (kind, signature): the engine escalates a problem by that key (policy.level_for
per signature), so the correct, handoff and terminate it gives one repeated call are one incident.
Observations alone make no incident; a kind in shadow does (what it would have done is an alert).

The detection pass refreshes the incidents of the problems it stored detections for, from the
stored detections, in its own transaction (on PostgreSQL as one more statement of the pass's round
trip: `incidents_statement`). Refreshing from the rows rather than adding to counters keeps a run
processed twice, or a replay, from counting anything twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypedDict

import orjson
from django.db import connection, transaction
from django.db.models import Q

from ingest.bulk import postgres_statements
from ingest.models import Detection, GuardDelivery, Incident, Run

ACTION_ORDER = ("observe", "correct", "handoff", "terminate")
STEPS_MAX = 50  # steps kept on the row: a problem that fired more has its first 50 (the run has all)
# Interventions, and what a kind in shadow would have done (stored as observe with evidence.shadow).
ALERT_Q = ~Q(action=Detection.Action.OBSERVE) | Q(evidence__has_key="shadow")
DELIVERED_DECISIONS = ("correct", "handoff", "terminate")

ProblemKey = tuple[int, str, str]  # (run pk, kind, signature)


def problem_keys(rows: Iterable[Detection]) -> set[ProblemKey]:
    """The problems of these detections that make incidents (interventions and shadow)."""
    return {
        (row.run_id, row.kind, row.signature)
        for row in rows
        if row.action != Detection.Action.OBSERVE
        or (isinstance(row.evidence, dict) and "shadow" in row.evidence)
    }


_RETURNED = (
    "id",
    "tenant_id",
    "run_id",
    "kind",
    "signature",
    "tool",
    "backend",
    "model",
    "task_type",
    "agent",
    "action",
    "shadow",
    "steps",
    "alerts",
    "hint",
    "first_seen",
    "last_seen",
    "status",
    "verdict",
    "verdict_note",
    "verdict_at",
    "notified_action",
)


def _upsert_sql(*, keyed: bool) -> str:
    d, i = Detection._meta.db_table, Incident._meta.db_table
    order = "ARRAY['observe', 'correct', 'handoff', 'terminate']::text[]"
    keys = (
        "JOIN (SELECT DISTINCT * FROM jsonb_to_recordset(%s::jsonb) AS k(run_id bigint, kind text, signature text)) k "
        "ON d.run_id = k.run_id AND d.kind = k.kind AND d.signature = k.signature"
        if keyed
        else ""
    )
    return f"""
WITH folded AS (
    SELECT d.tenant_id, d.run_id, d.kind, d.signature,
        (array_agg(d.tool ORDER BY d.seq DESC, d.id DESC))[1] AS tool,
        (array_agg(d.backend ORDER BY d.seq DESC, d.id DESC))[1] AS backend,
        (array_agg(d.model ORDER BY d.seq DESC, d.id DESC))[1] AS model,
        (array_agg(d.task_type ORDER BY d.seq DESC, d.id DESC))[1] AS task_type,
        (array_agg(d.agent ORDER BY d.seq DESC, d.id DESC))[1] AS agent,
        (array_agg(d.action ORDER BY array_position({order}, d.action::text) DESC))[1] AS action,
        COALESCE((array_agg(d.evidence->>'shadow' ORDER BY array_position({order}, d.evidence->>'shadow') DESC)
            FILTER (WHERE d.evidence ? 'shadow'))[1], '') AS shadow,
        to_jsonb((array_agg(jsonb_build_object(
            'id', d.id, 'seq', d.seq, 'action', d.action, 'shadow', COALESCE(d.evidence->>'shadow', ''),
            'count', d.count, 'ts', d.ts) ORDER BY d.seq, d.id))[1:{STEPS_MAX}]) AS steps,
        count(*) AS alerts,
        (array_agg(d.hint ORDER BY d.seq DESC, d.id DESC))[1] AS hint,
        min(d.ts) AS first_seen, max(d.ts) AS last_seen, max(d.id) AS last_detection_id
    FROM {d} AS d {keys}
    WHERE d.action <> 'observe' OR d.evidence ? 'shadow'
    GROUP BY d.tenant_id, d.run_id, d.kind, d.signature
)
INSERT INTO {i} AS i (tenant_id, run_id, kind, signature, tool, backend, model, task_type, agent, action,
    shadow, steps, alerts, hint, first_seen, last_seen, last_detection_id, status, verdict, verdict_note,
    notified_action, created_at, updated_at)
SELECT tenant_id, run_id, kind, signature, tool, backend, model, task_type, agent, action, shadow, steps,
    alerts, hint, first_seen, last_seen, last_detection_id, 'open', '', '', '', now(), now()
FROM folded
ORDER BY run_id, kind, signature
ON CONFLICT (run_id, kind, signature) DO UPDATE SET
    tool = EXCLUDED.tool, action = EXCLUDED.action, shadow = EXCLUDED.shadow, steps = EXCLUDED.steps,
    alerts = EXCLUDED.alerts, hint = EXCLUDED.hint, first_seen = EXCLUDED.first_seen,
    last_seen = EXCLUDED.last_seen, last_detection_id = EXCLUDED.last_detection_id,
    -- a new step after a verdict opens the incident again: the person judged less than there is now
    status = CASE WHEN EXCLUDED.last_detection_id > i.last_detection_id THEN 'open' ELSE i.status END,
    updated_at = CASE WHEN EXCLUDED.last_detection_id <> i.last_detection_id THEN now() ELSE i.updated_at END
RETURNING {", ".join(f"i.{name}" for name in _RETURNED)}
"""


def incidents_statement(keys: set[ProblemKey]) -> tuple[str, list] | None:
    """The upsert of these problems' incidents, for ingest.bulk.statements_run (PostgreSQL)."""
    if not keys:
        return None
    data = [{"run_id": r, "kind": k, "signature": s} for r, k, s in sorted(keys)]
    return _upsert_sql(keyed=True), [orjson.dumps(data).decode()]


def incidents_from_rows(rows: list[tuple] | None) -> list[Incident]:
    """The incidents incidents_statement returned, as (unsaved-looking) model instances."""
    out = []
    for row in rows or ():
        values = dict(zip(_RETURNED, row, strict=True))
        if isinstance(values["steps"], str):  # jsonb arrives as text through the multi-statement path
            values["steps"] = orjson.loads(values["steps"])
        incident = Incident(**{k: v for k, v in values.items() if k != "id"})
        incident.pk = values["id"]
        out.append(incident)
    return out


def incidents_refresh(*, keys: set[ProblemKey]) -> list[Incident]:
    """Create or bring up to date the incidents of these problems from their stored detections."""
    if not keys:
        return []
    if postgres_statements():
        sql, params = incidents_statement(keys)  # type: ignore[misc]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return incidents_from_rows(cursor.fetchall())
    return [i for i in (_refresh_one(key) for key in sorted(keys)) if i is not None]


def incidents_backfill() -> int:
    """Incidents for every stored detection (the migration that brings incidents in). Returns how many."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_upsert_sql(keyed=False))
            return cursor.rowcount
    keys = set(Detection.objects.filter(ALERT_Q).values_list("run_id", "kind", "signature").distinct())
    return len(incidents_refresh(keys=keys))


def _level(action: str) -> int:
    return ACTION_ORDER.index(action) if action in ACTION_ORDER else -1


def _refresh_one(key: ProblemKey) -> Incident | None:
    run_pk, kind, signature = key
    rows = list(
        Detection.objects.filter(run_id=run_pk, kind=kind, signature=signature)
        .filter(ALERT_Q)
        .order_by("seq", "pk")
    )
    if not rows:
        return None
    last = rows[-1]
    shadows = [
        str(r.evidence.get("shadow")) for r in rows if isinstance(r.evidence, dict) and "shadow" in r.evidence
    ]
    values: dict[str, Any] = {
        "tenant_id": last.tenant_id,
        "tool": last.tool,
        "backend": last.backend,
        "model": last.model,
        "task_type": last.task_type,
        "agent": last.agent,
        "action": max((r.action for r in rows), key=_level),
        "shadow": max(shadows, key=_level) if shadows else "",
        "steps": [
            {
                "id": r.pk,
                "seq": r.seq,
                "action": r.action,
                "shadow": str(r.evidence.get("shadow", "")) if isinstance(r.evidence, dict) else "",
                "count": r.count,
                "ts": r.ts.isoformat(),
            }
            for r in rows[:STEPS_MAX]
        ],
        "alerts": len(rows),
        "hint": last.hint,
        "first_seen": min(r.ts for r in rows),
        "last_seen": max(r.ts for r in rows),
        "last_detection_id": max(r.pk for r in rows),
    }
    with transaction.atomic():
        incident = (
            Incident.objects.select_for_update().filter(run_id=run_pk, kind=kind, signature=signature).first()
        )
        if incident is None:
            return Incident.objects.create(run_id=run_pk, kind=kind, signature=signature, **values)
        if values["last_detection_id"] > incident.last_detection_id:
            incident.status = Incident.Status.OPEN
        for name, value in values.items():
            setattr(incident, name, value)
        incident.save()
        return incident


class IncidentPayload(TypedDict):
    id: int
    run: int
    run_id: str
    tenant_id: int
    agent: str
    kind: str
    tool: str
    action: str
    shadow: str
    backend: str
    model: str
    task_type: str
    alerts: int
    hint: str
    first_seen: str
    last_seen: str
    status: str
    verdict: str
    verdict_note: str
    verdict_by: str
    verdict_at: str
    steps: list[dict[str, Any]]


def _iso(value: datetime | str | None) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else value.isoformat()


def incident_payload(incident: Incident, *, run: Run, verdict_by: str = "") -> IncidentPayload:
    """An incident as pages, sockets, the API and notifications carry it."""
    steps = [
        {**step, "ts": _iso(step.get("ts"))}
        for step in (incident.steps if isinstance(incident.steps, list) else [])
    ]
    return {
        "id": incident.pk,
        "run": run.pk,
        "run_id": run.run_id,
        "tenant_id": incident.tenant_id,
        "agent": incident.agent,
        "kind": incident.kind,
        "tool": incident.tool,
        "action": incident.action,
        "shadow": incident.shadow,
        "backend": incident.backend,
        "model": incident.model,
        "task_type": incident.task_type,
        "alerts": incident.alerts,
        "hint": incident.hint,
        "first_seen": _iso(incident.first_seen),
        "last_seen": _iso(incident.last_seen),
        "status": incident.status,
        "verdict": incident.verdict,
        "verdict_note": incident.verdict_note,
        "verdict_by": verdict_by,
        "verdict_at": _iso(incident.verdict_at),
        "steps": steps,
    }


# --- what reached the agent ------------------------------------------------------------------------


def guard_answer_record(
    *,
    tenant_id: int,
    run_id: str,
    answer: dict[str, Any],
    now: datetime,
    run_pk: int | None = None,
    guard_checked: bool = False,
) -> None:
    """Remember that the run uses the guard and which intervention a check answered with.

    The intervention delivered is the answer's strongest detection (its hint is what the agent got);
    a check of a terminated run answers with the run's stored terminate, which is delivered too.
    `run_pk` and `guard_checked`: what the check already read of the run (GuardAnswer), so that an
    allow on a run marked before costs no query (this runs on every check).
    """
    if not answer.get("run_known"):
        return
    if not guard_checked:
        Run.objects.filter(tenant_id=tenant_id, run_id=run_id, guard_checked_at__isnull=True).update(
            guard_checked_at=now
        )
    decision = answer.get("decision")
    if decision not in DELIVERED_DECISIONS:
        return
    found = [d for d in answer.get("detections") or [] if d.get("action") == decision]
    if run_pk is None:
        run_pk = Run.objects.filter(tenant_id=tenant_id, run_id=run_id).values_list("pk", flat=True).first()
    if run_pk is None:
        return
    if not found and decision == Detection.Action.TERMINATE:
        stored = (
            Detection.objects.filter(run_id=run_pk, action=Detection.Action.TERMINATE)
            .order_by("seq")
            .values("kind", "signature")
            .first()
        )
        found = [{**stored, "action": decision}] if stored else []
    GuardDelivery.objects.bulk_create(
        [
            GuardDelivery(
                tenant_id=tenant_id,
                run_id=run_pk,
                kind=str(d.get("kind", ""))[:32],
                signature=str(d.get("signature", ""))[:64],
                action=decision,
                at=now,
            )
            for d in found
        ],
        ignore_conflicts=True,
    )


class StepDelivery(TypedDict):
    action: str
    seq: int
    ts: str
    reached: str  # "guard": a check answered it; "traces": only recorded from traces
    delivered_at: str


def incident_deliveries(*, incident: Incident, run: Run) -> list[StepDelivery]:
    """Each intervention step of the incident and whether it reached the agent through the guard."""
    delivered = {
        action: at
        for action, at in GuardDelivery.objects.filter(
            run_id=run.pk, kind=incident.kind, signature=incident.signature
        ).values_list("action", "at")
    }
    out: list[StepDelivery] = []
    for step in incident.steps if isinstance(incident.steps, list) else []:
        if step.get("action") == Detection.Action.OBSERVE:
            continue  # a kind in shadow: nothing was meant to reach the agent
        at = delivered.get(step.get("action", ""))
        out.append(
            {
                "action": step.get("action", ""),
                "seq": step.get("seq", 0),
                "ts": _iso(step.get("ts")),
                "reached": "guard" if at is not None else "traces",
                "delivered_at": _iso(at),
            }
        )
    return out


def reached_summary(*, run: Run, deliveries: list[StepDelivery]) -> str:
    """One line: did the interventions reach the agent, or were they only recorded from traces."""
    if not deliveries:
        return ""
    if run.guard_checked_at is None:
        return (
            "recorded from traces: this run does not use the guard, nothing reached the agent from loopwatch"
        )
    reached = [d["action"] for d in deliveries if d["reached"] == "guard"]
    missed = [d["action"] for d in deliveries if d["reached"] != "guard"]
    parts = []
    if reached:
        parts.append("delivered by a guard check: " + ", ".join(dict.fromkeys(reached)))
    if missed:
        parts.append("only recorded from traces (no check answered it): " + ", ".join(dict.fromkeys(missed)))
    return "; ".join(parts)


def delivered_keys(*, run: Run) -> set[tuple[str, str, str]]:
    """(kind, signature, action) of the run's interventions a guard check answered with."""
    return set(GuardDelivery.objects.filter(run=run).values_list("kind", "signature", "action"))
