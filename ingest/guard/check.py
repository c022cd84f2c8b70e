"""The guard: decide about a tool call before it runs, with the pipeline's engine and thresholds.

A runtime asks about the call its model just proposed; the answer is one of

- `allow`: run it;
- `reuse`: an identical read whose result has not changed (see `_reusable`): here is that result,
  do not call the tool again;
- `correct`: do not run it, give the model this hint instead;
- `handoff`: ask a person; the run is marked WAITING with a summary of what was tried, and every
  check answers `handoff` until a person answers (`run_handoff_resolve`: resume or stop);
- `terminate`: stop the run, with the structured diagnosis; every later check answers the same;
- for a write that none of the above stops: the ledger's decision (`operation_claim`): execute,
  reuse, wait, reconcile, failed, compensated or conflict.

How (`call_check`):

1. Find the run; a run not known yet is allowed (`run_known: false`), a write still goes through
   the ledger. A run_id of another tenant is, for this key, a run not known (the same run_id under
   two tenants is two runs): nothing of the other tenant's run is read or changed.
2. Bring the run's engine state up to date with `run_process` (the pipeline's own step, under the
   run's cursor lock) when the run holds events its cursor has not reached: the check does not
   wait for Celery to have seen them. Thresholds and tools as the pipeline resolves them
   (`config_for`), cached CONFIG_TTL_S per process. Within a time budget (budget_s): what is not
   processed by then (or cannot be: a run another task is processing, a run whose detection is
   quarantined) is left to the pipeline, and the answer says so (`cut_short`).
3. Sticky ends: a run waiting for a person answers `handoff`, a finished or terminated run
   `terminate`.
4. Feed the proposed call as a `tool_call` event to the request's own copy of the state (read from
   the database, never saved). The check does not count as a call: the call counts when its
   `tool_call` event arrives, as for a runtime without a guard, so the pipeline later records for
   that event exactly what the check saw (the client traces a call it was told not to run too,
   without a result: the model did propose it, and the engine's escalation needs to see it).
5. Interventions the pipeline stored after the run's last tool_call, from detectors that fire on a
   result (a repeated error, perturbation, a poll over budget, no progress), concern the next call:
   those of the same tool, and no progress whatever the tool. A correction is thus given once.
6. The strongest action decides (reuse wins over correct, handoff and terminate over both); a
   write that handoff or terminate does not stop goes to the ledger.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

import orjson
from django.db import connection
from django.db.models import F, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from ingest.bulk import TENANT_PK
from ingest.detection import ACTIONS, Config, Engine, RunState
from ingest.detection.engine import failed_result, result_digest_of
from ingest.detection.kinds import DECLARED, kind_resolve
from ingest.detection.policy import CORRECT, HANDOFF, TERMINATE
from ingest.guard.handoffs import _handoff_mark
from ingest.ledger import DEFAULT_LEASE_S, operation_claim, operation_key_for
from ingest.models import Detection, Run, Tenant, ToolCall
from ingest.selectors import config_for
from ingest.services import run_process

# A result older than this is not given back as unchanged: the world may have moved meanwhile.
REUSE_MAX_AGE_S = 600.0
# Calls of the tool (and writes) looked at, newest first, to find the last two identical ones.
REUSE_WINDOW = 50


# A check's time for the events the pipeline has not processed yet (and for finding a reusable
# result): past it, the answer is given from the state as far as it got, and says so. Passes of
# GUARD_CHUNK events keep the overshoot small (a pass is not interrupted).
GUARD_BUDGET_S = 2.0
GUARD_CHUNK = 20
# Detectors of the model's words: a tool call is their remedy, not something they should stop.
TEXT_KINDS = ("clarification", "monologue", "empty_responses")
# Result-time detections that concern the next call whatever its tool.
RUN_WIDE_KINDS = ("no_progress",)
# Thresholds and tools are read once per scope and process for this long: a change made in the
# admin reaches the guard within CONFIG_TTL_S (the pipeline reads them for every batch it processes).
CONFIG_TTL_S = 5.0
CONFIG_CACHE_SIZE = 1024  # scopes (tenant, backend, model, task type); past it the cache starts over
FINISHED = (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.TRUNCATED, Run.Status.ABANDONED)
CHECK_CALL_ID = "loopwatch-guard-check"


class RunNotKnown(Exception):
    """The run is not known for this tenant and the caller asked for it to be (require_run)."""


class CallRefused(Exception):
    """The call cannot be checked as asked: a write without its key or executor, or a key that may
    not claim in the ledger. Raised before anything is changed."""

    def __init__(self, status: int, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.status = status
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class ProposedCall:
    """The call a model proposed, as the runtime asks about it."""

    tool: str
    args: dict[str, Any]
    kind: str = ""  # "": the tool registry's kind, else "other"
    round: int | None = None  # None: the run's current round
    ts: datetime | None = None  # when the runtime saw it; None: now
    operation_key: str = ""
    step_id: str = ""
    worker_id: str = ""  # writes: the executor that takes the ledger's lease
    lease_s: float = DEFAULT_LEASE_S
    attempt_id: str = ""  # writes: the client's id of this attempt (see operation_claim)


@dataclass
class GuardAnswer:
    decision: str
    run_known: bool
    kind: str
    kind_from: str = "event"  # event | config | name | result | default (ingest.detection.kinds)
    hint: str = ""
    detections: list[dict[str, Any]] = field(default_factory=list)
    diagnosis: dict[str, Any] | None = None
    handoff: dict[str, Any] | None = None
    reuse: dict[str, Any] | None = None
    ledger: dict[str, Any] | None = None
    # Set when the answer does not reflect every event of the run: {reason, detail, events_behind}.
    cut_short: dict[str, Any] | None = None
    # Not in the body: what the check read of the run, for recording what reached the agent.
    run_pk: int | None = None
    guard_checked: bool = False

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "decision": self.decision,
            "run_known": self.run_known,
            "kind": self.kind,
            "kind_from": self.kind_from,
            "hint": self.hint,
            "detections": self.detections,
        }
        for name in ("diagnosis", "handoff", "reuse", "ledger", "cut_short"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


def call_check(
    *,
    tenant: Tenant,
    run_id: str,
    call: ProposedCall,
    require_run: bool = False,
    may_claim: bool = True,
    budget_s: float = GUARD_BUDGET_S,
) -> GuardAnswer:
    """The guard's decision about `call` in run `run_id` of `tenant` (see the module docstring).

    may_claim: whether the caller may claim operations in the ledger (a write's check does).
    budget_s: the time for catching the run up and looking for a reusable result.
    Raises RunNotKnown (require_run and no such run) and CallRefused, both before any change.
    """
    now = timezone.now()
    deadline = time.monotonic() + budget_s
    run = _run_view(tenant.pk, run_id)
    if run is None:
        if require_run:
            raise RunNotKnown(run_id)
        configured = _config(tenant.pk, "unknown", "", "default").tool(call.tool).kind
        kind, kind_from = kind_resolve(call.kind, configured, call.tool)
        answer = GuardAnswer("allow", run_known=False, kind=kind, kind_from=kind_from)
        if _declared_write(kind, kind_from):
            _write_ready(call, kind, may_claim)
            _ledger_decide(answer, tenant=tenant, run_id=run_id, call=call)
        return answer

    if run.position < run.events_count:
        # Events the pipeline has not seen yet: process them now, under the run's lock, as the
        # Celery task would (it later finds nothing left to do), within the budget. A run caught up
        # is read as is.
        run_process(run_pk=run.pk, chunk=GUARD_CHUNK, deadline=deadline)
        run = _run_view(tenant.pk, run_id) or run
    engine = Engine(_config(run.tenant_id, run.backend, run.model, run.task_type))
    state = _state(run)
    kind, kind_from = kind_resolve(call.kind, engine.config.tool(call.tool).kind, call.tool)
    if kind_from not in DECLARED and call.tool in state.inferred:
        kind, kind_from = state.inferred[call.tool], "result"  # its results showed it polls
    # Only a declared write goes to the ledger (and needs its key): one the name suggests is judged
    # as a write by detection, but refusing it or claiming it would break runtimes that never said.
    declared_write = _declared_write(kind, kind_from)
    if declared_write:
        _write_ready(call, kind, may_claim)
    answer = GuardAnswer(
        "allow",
        run_known=True,
        kind=kind,
        kind_from=kind_from,
        cut_short=_behind(run, budget_s),
        run_pk=run.pk,
        guard_checked=run.guard_checked,
    )

    if run.status == Run.Status.WAITING:
        answer.decision, answer.handoff = "handoff", run.handoff or {}
        answer.hint = str(answer.handoff.get("hint", "The run is waiting for a person."))
        return answer
    if run.status in FINISHED or state.terminated_by:
        return _terminated(answer, run, state)

    sig, cursor = engine.identity(call.tool, call.args)
    record = state.sigs.get(sig)
    # Two identical successful results in a row at least: only then can a result be reusable. Only
    # of a tool said to be a read: a result handed back in place of a call the name only suggests
    # is a read could hide a side effect.
    may_reuse = (
        kind == "read"
        and kind_from in DECLARED
        and record is not None
        and record.streak >= 2
        and (record.last_digest or "").startswith("ok:")
    )
    found = _pending_interventions(run, call.tool) if state.max_action >= CORRECT else []
    event: dict[str, Any] = {
        "type": "tool_call",
        "run_id": run_id,
        "ts": (call.ts or now).isoformat(),
        "call_id": CHECK_CALL_ID,
        "tool": call.tool,
        "args": call.args,
    }
    if call.kind:
        event["kind"] = call.kind  # as the tool_call event will say; else the engine resolves it
    if call.round is not None:
        event["round"] = call.round
    if call.operation_key:
        event["operation_key"] = call.operation_key
    if call.step_id:
        event["step_id"] = call.step_id
    found += [d.as_dict() for d in engine.feed(state, event)]
    answer.detections = found

    strongest = max(
        (d for d in found if d["action"] != "observe"), key=lambda d: ACTIONS.index(d["action"]), default=None
    )
    level = ACTIONS.index(strongest["action"]) + 1 if strongest else 0
    if strongest is not None:
        answer.hint = strongest["hint"]
    if strongest is not None and level >= TERMINATE:
        answer.decision, answer.diagnosis = "terminate", _diagnosis(strongest, state)
        return answer
    if strongest is not None and level >= HANDOFF:
        answer.decision = "handoff"
        answer.handoff = _handoff_mark(run, strongest, call, kind, now)
        return answer
    if declared_write:
        # The duplicate-write detector's correction says what the ledger knows better.
        _ledger_decide(answer, tenant=tenant, run_id=run_id, call=call)
        return answer
    reuse = None
    if may_reuse:
        reuse = _reusable(run, engine, call, (sig, cursor), call.ts or now, deadline)
        if reuse is _OUT_OF_TIME:
            reuse = None
            answer.cut_short = answer.cut_short or {
                "reason": "time_budget",
                "detail": (
                    f"the time budget of {budget_s:g} s ran out before the earlier identical calls were "
                    "compared: a reusable result, if any, was not looked for"
                ),
                "events_behind": 0,
            }
    if reuse is not None:
        answer.decision, answer.reuse = "reuse", reuse
        if not answer.hint:
            answer.hint = (
                f"{call.tool} was called with these arguments twice already and returned the same "
                "result: here it is again."
            )
    elif level == CORRECT:
        answer.decision = "correct"
    return answer


def _behind(run: _RunView, budget_s: float) -> dict[str, Any] | None:
    """cut_short for a run whose cursor is behind its events after the catching up, else None."""
    behind = run.events_count - run.position
    if behind <= 0:
        return None
    if run.failures:
        retry = run.retry_at.isoformat() if run.retry_at else "later"
        return {
            "reason": "detection_failed",
            "detail": (
                f"detection failed on this run ({run.error}); its events after #{run.position} are not "
                f"processed until it is tried again ({retry}): this answer does not reflect them"
            ),
            "events_behind": behind,
        }
    return {
        "reason": "time_budget",
        "detail": (
            f"the run's events after #{run.position} were not all processed within the time budget of "
            f"{budget_s:g} s (or another task is processing them): this answer does not reflect the "
            f"last {behind}; the pipeline processes them"
        ),
        "events_behind": behind,
    }


_configs: dict[tuple[int, str, str, str], tuple[float, Config]] = {}


def _config(tenant_id: int, backend: str, model: str, task_type: str) -> Config:
    """detection_config's answer, kept CONFIG_TTL_S per process: two queries less per check."""
    scope = (tenant_id, backend, model, task_type)
    now = time.monotonic()
    cached = _configs.get(scope)
    if cached is not None and cached[0] > now:
        return cached[1]
    if len(_configs) >= CONFIG_CACHE_SIZE:
        _configs.clear()
    config = config_for(tenant_id=tenant_id, backend=backend, model=model, task_type=task_type)
    _configs[scope] = (now + CONFIG_TTL_S, config)
    return config


def config_cache_clear() -> None:
    _configs.clear()


def _declared_write(kind: str, kind_from: str) -> bool:
    return kind == "write" and kind_from in DECLARED


def _write_ready(call: ProposedCall, kind: str, may_claim: bool) -> None:
    if kind != "write":
        return
    if not (call.operation_key or call.step_id):
        raise CallRefused(
            400, "operation_key", "a write needs operation_key or step_id (its idempotency key)"
        )
    if not call.worker_id:
        raise CallRefused(
            400, "worker_id", "a write needs the executor's worker_id (it takes the ledger's lease)"
        )
    if not may_claim:
        raise CallRefused(
            403,
            "Authorization",
            "a write's check claims it in the ledger: this API key lacks the 'ledger' scope",
        )


@dataclass
class _RunView:
    """What a check reads of a run and its cursor, in one query."""

    pk: int
    tenant_id: int
    backend: str
    model: str
    task_type: str
    status: str
    terminated_by: str
    budget_type: str
    reason: str
    rounds: int
    tool_calls: int
    tool_errors: int
    cost_usd: float
    last_progress_step: int
    events_count: int
    handoff: dict[str, Any] | None
    guard_checked: bool  # a check has answered for this run before (ingest.incidents)
    position: int
    engine_state: dict[str, Any] | None
    failures: int = 0  # the cursor's quarantine (ingest.services)
    error: str = ""
    retry_at: datetime | None = None


_RUN_VIEW_FIELDS = tuple(f.name for f in fields(_RunView))
# By hand rather than through the ORM: the engine state is the biggest value a check reads, and
# orjson decodes it several times faster than the JSONField's json.loads. The tenant as TENANT_PK.
_RUN_VIEW_SQL = f"""
SELECT r.id, r.tenant_id, r.backend, r.model, r.task_type, r.status, r.terminated_by, r.budget_type,
       r.reason, r.rounds, r.tool_calls, r.tool_errors, r.cost_usd, r.last_progress_step, r.events_count,
       r.handoff, r.guard_checked_at IS NOT NULL, COALESCE(c.position, 0), c.engine_state, COALESCE(c.failures, 0), COALESCE(c.error, ''),
       c.retry_at
FROM {Run._meta.db_table} r LEFT JOIN {Run._meta.get_field("cursor").related_model._meta.db_table} c
  ON c.run_id = r.id
WHERE r.tenant_id = {TENANT_PK} AND r.run_id = %s
"""


def _json(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str | bytes) else value


def _run_view(tenant_id: int, run_id: str) -> _RunView | None:
    with connection.cursor() as cursor:
        cursor.execute(_RUN_VIEW_SQL, [tenant_id, run_id])
        row = cursor.fetchone()
    if row is None:
        return None
    # The columns come in _RunView's order: the run's, then its cursor's.
    values = dict(zip(_RUN_VIEW_FIELDS, row, strict=True))
    for name in ("handoff", "engine_state"):
        values[name] = _json(values[name])
    values["retry_at"] = _utc(values["retry_at"])
    return _RunView(**values)


def _state(run: _RunView) -> RunState:
    if run.engine_state:
        try:
            return RunState.from_dict(run.engine_state)
        except (TypeError, ValueError, KeyError):
            pass  # run_process logs it and starts afresh; so does the check
    return RunState()


def _pending_interventions(run: _RunView, tool: str) -> list[dict[str, Any]]:
    """Interventions stored after the run's last tool_call that concern a call of `tool`.

    Not the corrections and handoffs a person has answered already (a resumed handoff): when the
    runtime did not trace the call it was refused, the detection that asked for the person is still
    after the last tool_call, and would send the run straight back to waiting. A terminate stored
    meanwhile still stops it.
    """
    last_call = ToolCall.objects.filter(run_id=run.pk).order_by("-seq").values("seq")[:1]
    answered_at_seq = int(((run.handoff or {}).get("resolved") or {}).get("seq") or 0)
    rows = (
        Detection.objects.filter(run_id=run.pk, action__in=ACTIONS[CORRECT - 1 :])
        .exclude(kind__in=TEXT_KINDS)
        .exclude(seq__lte=answered_at_seq, action__in=ACTIONS[CORRECT - 1 : HANDOFF])
        .alias(after=Coalesce(Subquery(last_call), 0))
        .filter(seq__gt=F("after"))
        .filter(Q(action__in=ACTIONS[HANDOFF - 1 :]) | Q(kind__in=RUN_WIDE_KINDS) | Q(tool=tool))
        .order_by("seq", "pk")
    )
    return [_detection_dict(row) for row in rows]


def _detection_dict(row: Detection) -> dict[str, Any]:
    return {
        "kind": row.kind,
        "action": row.action,
        "at_call": row.at_call,
        "at_round": row.at_round,
        "count": row.count,
        "signature": row.signature,
        "tool": row.tool,
        "evidence": row.evidence,
        "hint": row.hint,
    }


def _diagnosis(detection: dict[str, Any], state: RunState) -> dict[str, Any]:
    """{terminated_by, budget_type?, limit?, consumed?, last_progress_step, hint, ...}."""
    evidence = detection.get("evidence") or {}
    if detection["kind"] == "budget" and "terminated_by" in evidence:
        return {**evidence, "kind": "budget", "tool": detection.get("tool", "")}
    return {
        "terminated_by": "loop",
        "kind": detection["kind"],
        "tool": detection.get("tool", ""),
        "count": detection.get("count", 0),
        "at_call": detection.get("at_call", 0),
        "last_progress_step": state.last_progress_step,
        "hint": detection.get("hint", ""),
        "evidence": evidence,
    }


def _terminated(answer: GuardAnswer, run: _RunView, state: RunState) -> GuardAnswer:
    answer.decision = "terminate"
    stored = (
        Detection.objects.filter(run_id=run.pk, action=Detection.Action.TERMINATE).order_by("seq").first()
    )
    if state.terminated_by and stored is not None:
        answer.diagnosis = _diagnosis(_detection_dict(stored), state)
    else:
        answer.diagnosis = {
            "terminated_by": run.terminated_by or state.terminated_by or "run_finished",
            "status": run.status,
            "budget_type": run.budget_type or state.budget_type,
            "reason": run.reason,
            "last_progress_step": state.last_progress_step,
            "hint": f"The run is over ({run.status}): no more tool calls.",
        }
    answer.hint = str(answer.diagnosis.get("hint", ""))
    return answer


_CALLS_SQL = f"""
SELECT seq, tool, kind, args, result_seq IS NOT NULL, result_status, result_truncated, error_class,
       call_id, result, result_sha256, result_ts
FROM {ToolCall._meta.db_table}
WHERE run_id = %s AND (tool = %s OR kind = 'write')
ORDER BY seq DESC
LIMIT %s
"""


def _utc(value: datetime | str | None) -> datetime | None:
    """A timestamp of a raw row: aware from PostgreSQL; naive UTC (or text) from the embedded SQLite."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


_OUT_OF_TIME: dict[str, Any] = {}  # _reusable's answer when the deadline passed first


def _reusable(
    run: _RunView,
    engine: Engine,
    call: ProposedCall,
    identity: tuple[str, str],
    now: datetime,
    deadline: float,
) -> dict[str, Any] | None:
    """The result to give back instead of calling again, or None (_OUT_OF_TIME: the deadline came
    before the earlier calls were all compared; their arguments may be large).

    "Has not changed" means: the last two answered calls with the same identity (the engine's
    signature and cursor) both succeeded with the same result digest, no write of the run came
    since the earlier of them, neither result was cut short (the whole result is needed to give it
    back), and the latest is at most REUSE_MAX_AGE_S old.
    """
    with connection.cursor() as cursor:
        cursor.execute(_CALLS_SQL, [run.pk, call.tool, REUSE_WINDOW])
        rows = cursor.fetchall()
    same: list[tuple] = []
    for row in rows:
        if time.monotonic() >= deadline:
            return _OUT_OF_TIME
        tool, kind, args, answered, status, truncated, error_class = row[1:8]
        if kind == ToolCall.Kind.WRITE:
            return None
        if not answered or engine.identity(tool, _json(args)) != identity:
            continue
        if truncated or failed_result(status, error_class):
            return None
        same.append(row)
        if len(same) == 2:
            break
    if len(same) < 2:
        return None
    # Results stay JSON text until needed (jsonb arrives as text): only these two are decoded.
    latest, earlier = (
        {
            "seq": r[0],
            "call_id": r[8],
            "result": _json(r[9]),
            "result_sha256": r[10],
            "result_ts": _utc(r[11]),
        }
        for r in same
    )
    if result_digest_of(latest) != result_digest_of(earlier):
        return None
    if latest["result_ts"] is None or (now - latest["result_ts"]).total_seconds() > REUSE_MAX_AGE_S:
        return None
    return {
        "result": latest["result"],
        "call_id": latest["call_id"],
        "seq": latest["seq"],
        "at": latest["result_ts"].isoformat(),
        "identical_calls": 2,
    }


def _ledger_decide(answer: GuardAnswer, *, tenant: Tenant, run_id: str, call: ProposedCall) -> None:
    """The ledger's claim for a write the engine does not stop; its decision becomes the answer's."""
    key = operation_key_for(
        operation_key=call.operation_key or None, run_id=run_id, step_id=call.step_id or None
    )
    assert key is not None, "the interface checks that a write names operation_key or step_id"
    claim = operation_claim(
        tenant=tenant,
        key=key,
        tool=call.tool,
        args=call.args,
        worker_id=call.worker_id,
        lease_s=call.lease_s,
        step_id=call.step_id,
        attempt_id=call.attempt_id,
    )
    ledger = claim.as_dict(key=key)  # as the ledger API answers the same claim
    answer.decision, answer.ledger = claim.decision, ledger
    if claim.decision == "conflict" and not answer.hint:
        answer.hint = ledger["detail"]
