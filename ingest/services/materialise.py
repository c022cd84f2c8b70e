"""Materialising a pass's events: model rounds and tool calls (each result joined to its call),
and the traced writes fed to the ledger."""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from django.db import connection

from ingest.bulk import insert_statement, statements_run, update_statement
from ingest.ledger import TRACE_FINISHED, TRACE_STARTED, trace_writes_record
from ingest.models import (
    Detection,
    ModelRound,
    PendingResult,
    Run,
    ToolCall,
)
from ingest.otlp.rounds import START as ROUND_START
from ingest.otlp.rounds import Numbering
from ingest.schema import MAX_COST_USD, parse_ts
from ingest.services.postgres import _PENDING_DELETE_SQL

if TYPE_CHECKING:
    from ingest.services.pipeline import _Events, _PassCache


def round_cost(value: Any) -> float:
    """A round's cost as the figures count it: within the cap the way in checks (MAX_COST_USD), so
    that no sum of them overflows (math.fsum raised on two rounds of 1e308 stored before the cap)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return 0.0
    return float(min(value, MAX_COST_USD))


def _materialize(
    runs: list[Run], events: dict[int, _Events], cache: _PassCache, numbering: Numbering
) -> dict[int, list[Detection]]:
    """Model rounds and tool calls of a pass's events, every run's together. Returns the duplicate
    side effects the ledger found, by run pk."""
    result_ids: dict[int, set[str]] = defaultdict(set)
    call_ids: dict[int, set[str]] = defaultdict(set)
    for run in runs:
        for _, kind, _, body in events[run.pk]:
            if kind == "tool_result":
                result_ids[run.pk].add(body["call_id"])
            elif kind == "tool_call":
                call_ids[run.pk].add(body["call_id"])
    # Unanswered calls stored earlier, oldest first: a stack per (run, call_id) (the newest answers
    # first). Read for all the runs' call_ids at once, then kept for the run that asks.
    open_calls: dict[tuple[int, str], list[ToolCall]] = defaultdict(list)
    if result_ids:
        for call in ToolCall.objects.filter(
            run_id__in=list(result_ids),
            call_id__in=sorted(set().union(*result_ids.values())),
            result_seq__isnull=True,
        ).order_by("run_id", "seq"):
            if call.call_id in result_ids[call.run_id]:
                open_calls[(call.run_id, call.call_id)].append(call)
    # Results that came before their call, oldest first: a queue per (run, call_id).
    waiting: dict[tuple[int, str], list[PendingResult]] = defaultdict(list)
    if call_ids:
        for pending in PendingResult.objects.filter(
            run_id__in=list(call_ids), call_id__in=sorted(set().union(*call_ids.values()))
        ).order_by("run_id", "seq"):
            if pending.call_id in call_ids[pending.run_id]:
                waiting[(pending.run_id, pending.call_id)].append(pending)

    new_rounds: list[ModelRound] = []
    new_calls: list[ToolCall] = []
    answered: list[ToolCall] = []
    new_pending: list[PendingResult] = []
    consumed: list[int] = []
    writes: list[tuple[Run, list[ToolCall], list[ToolCall]]] = []  # per run: new calls, answered
    for run in runs:
        run_pk = run.pk
        run_calls: list[ToolCall] = []
        run_answered: list[ToolCall] = []
        for seq, kind, ts, body in events[run_pk]:
            if kind == "model_round":
                cost = body.get("cost_usd")
                if cost is None:
                    cost = cache.price(run.backend, run.model).cost(
                        body.get("input_tokens", 0), body.get("output_tokens", 0)
                    )
                cost = round_cost(cost)
                new_rounds.append(
                    ModelRound(
                        run_id=run_pk,
                        seq=seq,
                        round=numbering.of(run_pk, seq, body),
                        ts=ts,
                        started_at=parse_ts(body[ROUND_START]) if ROUND_START in body else None,
                        input_tokens=body.get("input_tokens", 0),
                        output_tokens=body.get("output_tokens", 0),
                        cost_usd=cost,
                        cost_computed="cost_usd" not in body,
                        text=body.get("text", ""),
                    )
                )
                body.setdefault("cost_usd", cost)  # detection counts the cost budget with it
            elif kind == "tool_call":
                call = ToolCall(
                    run_id=run_pk,
                    seq=seq,
                    round=numbering.of(run_pk, seq, body),
                    call_id=body["call_id"],
                    tool=body["tool"],
                    kind=body.get("kind", ToolCall.Kind.OTHER),
                    args=body["args"],
                    step_id=body.get("step_id", ""),
                    operation_key=body.get("operation_key", ""),
                    ts=ts,
                )
                run_calls.append(call)
                queue = waiting.get((run_pk, call.call_id))
                if queue:
                    pending = queue.pop(0)
                    if pending.pk is not None:
                        consumed.append(pending.pk)
                    else:
                        new_pending.remove(pending)
                    _result_join(call, pending.seq, pending.body)
                else:
                    open_calls[(run_pk, call.call_id)].append(call)
            elif kind == "tool_result":
                stack = open_calls.get((run_pk, body["call_id"]))
                if stack:
                    call = stack.pop()
                    _result_join(call, seq, body)
                    if call.pk is not None:
                        run_answered.append(call)
                else:
                    pending = PendingResult(run_id=run_pk, seq=seq, call_id=body["call_id"], body=body)
                    new_pending.append(pending)
                    waiting[(run_pk, pending.call_id)].append(pending)
        new_calls += run_calls
        answered += run_answered
        writes.append((run, run_calls, run_answered))
    if connection.vendor == "postgresql":
        statements_run(
            [
                insert_statement(ModelRound, new_rounds),
                insert_statement(ToolCall, new_calls),
                update_statement(ToolCall, answered, RESULT_FIELDS),
                (_PENDING_DELETE_SQL, [consumed]) if consumed else None,
                insert_statement(PendingResult, new_pending),
                *numbering.rows_statements(),
            ]
        )
    else:
        numbering.rows_save()
        ModelRound.objects.bulk_create(new_rounds)
        ToolCall.objects.bulk_create(new_calls)
        ToolCall.objects.bulk_update(answered, RESULT_FIELDS)
        PendingResult.objects.filter(pk__in=consumed).delete()
        PendingResult.objects.bulk_create(new_pending)
    return _ledger_feed(writes)


def _ledger_feed(writes: list[tuple[Run, list[ToolCall], list[ToolCall]]]) -> dict[int, list[Detection]]:
    """Traced writes go into the ledger; a key executed a second time is a duplicate side effect.

    writes: per run, in the pass's order, its new calls and the earlier calls answered now. The
    ledger gets every run's steps in one call, each run's in the order of its events, as they would
    have come one at a time: a retry after a 503 comes after that 503's result, whatever the
    batching. A result stored before its call (joined when the call came) counts from the call on.
    """
    steps: list[tuple[str, Run, ToolCall]] = []
    for run, new_calls, answered in writes:
        ordered: list[tuple[int, int, str, ToolCall]] = [
            (call.seq, 0, TRACE_STARTED, call) for call in new_calls if call.kind == ToolCall.Kind.WRITE
        ]
        ordered += [
            (max(call.seq, call.result_seq), 1, TRACE_FINISHED, call)
            for call in [*new_calls, *answered]
            if call.kind == ToolCall.Kind.WRITE and call.result_seq is not None
        ]
        ordered.sort(key=operator.itemgetter(0, 1))
        steps += [(kind, run, call) for _, _, kind, call in ordered]
    duplicates: dict[int, list[Detection]] = defaultdict(list)
    if not steps:
        return duplicates
    for (kind, run, call), evidence in zip(steps, trace_writes_record(steps=steps), strict=True):
        if kind != TRACE_STARTED or evidence is None:
            continue
        duplicates[run.pk].append(
            _run_detection(
                run,
                seq=call.seq,
                kind="duplicate_side_effect",
                action=Detection.Action.HANDOFF,
                signature=evidence["operation_key"][:64],
                tool=call.tool,
                count=evidence["executions"],
                at_round=call.round,
                evidence=evidence,
                hint=(
                    f"{call.tool} ran again for operation {evidence['operation_key']} "
                    f"(it was {evidence['previous_status']}): the effect may now exist twice. "
                    "Check it downstream and compensate if needed."
                ),
                ts=call.ts,
            )
        )
    return duplicates


def _run_detection(run: Run, **fields: Any) -> Detection:
    """A detection of `run`, with the run's dimensions copied (the overview filters on them)."""
    return Detection(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        backend=run.backend,
        model=run.model,
        task_type=run.task_type,
        agent=run.agent,
        **fields,
    )


RESULT_FIELDS = [
    "result_seq",
    "result_status",
    "result",
    "result_truncated",
    "result_sha256",
    "error_class",
    "latency_ms",
    "external_request_id",
    "result_ts",
]


def _result_join(call: ToolCall, seq: int, body: dict[str, Any]) -> None:
    call.result_seq = seq
    call.result_status = body["status"]
    call.result = body.get("result")
    call.result_truncated = body.get("result_truncated", False)
    call.result_sha256 = body.get("result_sha256", "")
    call.error_class = body.get("error_class", "")
    call.latency_ms = body.get("latency_ms")
    call.external_request_id = body.get("external_request_id", "")
    call.result_ts = parse_ts(body["ts"])
