"""Model rounds of OTLP spans numbered by start time, whatever order their spans arrived in.

Ingest numbers an export's new model spans after the run's stored rounds, in the order they
arrived (exports from several exporters interleave): those numbers are unique, count the rounds
(the run's `rounds` figure) and are what detection reads, event after event, as it runs. The
detection pass, which materialises each run's rounds and calls once and in order, then numbers
them by start time (docs/otlp.md): a model span that arrives after later ones takes its place,
the rounds and tool calls that started after it move up by one, in the ModelRound and ToolCall
rows and in the stored events' bodies. Once every span has arrived, the numbers are the same for
any order of arrival. Detection already done is not redone: a detection's `at_round` is the
number the round had when it fired.

Rounds sent over REST (no start time) keep their numbers and count as earlier than any OTLP
round of the same run.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ingest.bulk import Statement, postgres_statements, update_statement
from ingest.models import Event, ModelRound, ToolCall
from ingest.schema import parse_ts

START = "otel_start"  # the model_round field with the span's start (ingest.otlp.mapping)
OTLP_EVENT_PREFIX = "otel:"


@dataclass(slots=True)
class _Round:
    start: datetime
    ts: datetime
    seq: int
    round: int
    pk: int | None = None  # None: new in this pass


@dataclass(slots=True)
class _Call:
    ts: datetime
    seq: int
    round: int
    pk: int | None = None


@dataclass
class Numbering:
    """The pass's numbers by (run pk, seq), and the writes that move what was stored before."""

    rounds: dict[tuple[int, int], int] = field(default_factory=dict)
    moved_rounds: list[ModelRound] = field(default_factory=list)
    moved_calls: list[ToolCall] = field(default_factory=list)
    bodies: list[tuple[int, int, int]] = field(default_factory=list)  # (run pk, seq, round) to rewrite
    highest: dict[int, int] = field(default_factory=dict)  # run pk -> its greatest round number given

    def of(self, run_pk: int, seq: int, body: dict[str, Any]) -> int:
        return self.rounds.get((run_pk, seq), body["round"])

    def rows_statements(self) -> list[Statement]:
        """The UPDATEs of the moved ModelRound and ToolCall rows (PostgreSQL, for statements_run)."""
        return [
            update_statement(ModelRound, self.moved_rounds, ["round"]),
            update_statement(ToolCall, self.moved_calls, ["round"]),
        ]

    def bodies_statement(self) -> Statement:
        """The UPDATE of the events whose round changed (PostgreSQL). Run once the pass holds its
        runs' rows: ingest holds them while it inserts, and an insert of an event_id that is being
        rewritten waits for the rewrite; with the run's lock taken first, neither waits for the
        other while holding what the other needs."""
        if not self.bodies:
            return None
        run_pks, seqs, numbers = (list(column) for column in zip(*self.bodies, strict=True))
        return _BODIES_SQL, [run_pks, seqs, numbers]

    def rows_save(self) -> None:
        """rows_statements(), elsewhere than PostgreSQL."""
        ModelRound.objects.bulk_update(self.moved_rounds, ["round"])
        ToolCall.objects.bulk_update(self.moved_calls, ["round"])

    def bodies_save(self) -> None:
        """bodies_statement(), elsewhere than PostgreSQL."""
        for run_pk, seq, number in self.bodies:
            event = Event.objects.get(run_id=run_pk, seq=seq)
            event.body["round"] = number
            event.save(update_fields=["body"])


_BODIES_SQL = f"""
UPDATE {Event._meta.db_table} AS e SET body = jsonb_set(e.body, '{{round}}', to_jsonb(v.round))
FROM unnest(%s::bigint[], %s::integer[], %s::integer[]) AS v(run_id, seq, round)
WHERE e.run_id = v.run_id AND e.seq = v.seq
"""


def rounds_number(
    events: dict[int, list[tuple[int, str, datetime, dict]]], *, fresh: AbstractSet[int] = frozenset()
) -> Numbering:
    """Number by start time the OTLP rounds and calls of a pass (`events`: per run pk, its new
    events as (seq, type, ts, body)), moving the ones stored before when a span started earlier
    than they did. Reads the runs' stored rounds and calls from their earliest new start on, but
    for the `fresh` runs (none of their events processed yet: nothing stored to move)."""
    numbering = Numbering()
    new_rounds: dict[int, list[_Round]] = defaultdict(list)
    new_calls: dict[int, list[_Call]] = defaultdict(list)
    for run_pk, run_events in events.items():
        for seq, kind, ts, body in run_events:
            if kind == "model_round" and START in body:
                start = parse_ts(body[START])
                if start is not None:
                    new_rounds[run_pk].append(_Round(start, ts, seq, body["round"]))
            elif kind == "tool_call" and str(body.get("event_id", "")).startswith(OTLP_EVENT_PREFIX):
                new_calls[run_pk].append(_Call(ts, seq, body["round"]))
    since = {
        run_pk: min([r.start for r in new_rounds[run_pk]] + [c.ts for c in new_calls[run_pk]])
        for run_pk in set(new_rounds) | set(new_calls)
    }
    if not since:
        return numbering
    before, stored_rounds, stored_calls = _stored_read(
        {pk: at for pk, at in since.items() if pk not in fresh}
    )
    for run_pk in since:
        rounds = sorted(stored_rounds[run_pk] + new_rounds[run_pk], key=lambda r: (r.start, r.ts, r.seq))
        first = before.get(run_pk, 0)
        for number, item in enumerate(rounds, start=first + 1):
            _renumber(numbering, run_pk, item, number, ModelRound)
        starts = [r.start for r in rounds]
        for call in stored_calls[run_pk] + new_calls[run_pk]:
            # The rounds that started before the call did, or at the same moment.
            number = first + bisect.bisect_right(starts, call.ts)
            _renumber(numbering, run_pk, call, max(number, 1), ToolCall)
    return numbering


def _renumber(numbering: Numbering, run_pk: int, item: _Round | _Call, number: int, model) -> None:
    if model is ModelRound and number > numbering.highest.get(run_pk, 0):
        numbering.highest[run_pk] = number
    if item.pk is None:
        numbering.rounds[(run_pk, item.seq)] = number
    elif item.round != number:
        moved = numbering.moved_rounds if model is ModelRound else numbering.moved_calls
        moved.append(model(pk=item.pk, round=number))
    if item.round != number:
        numbering.bodies.append((run_pk, item.seq, number))


# Per run and its earliest new start: how many of its rounds are earlier (or have no start: sent
# over REST), the rounds from that start on, and the OTLP tool calls from then on.
_BEFORE_SQL = f"""
SELECT v.run_id, count(m.id) FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(run_id, since)
JOIN {ModelRound._meta.db_table} AS m ON m.run_id = v.run_id AND (m.started_at < v.since OR m.started_at IS NULL)
GROUP BY v.run_id
"""
_ROUNDS_SQL = f"""
SELECT m.run_id, m.id, m.seq, m.round, m.started_at, m.ts
FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(run_id, since)
JOIN {ModelRound._meta.db_table} AS m ON m.run_id = v.run_id AND m.started_at >= v.since
"""
_CALLS_SQL = f"""
SELECT c.run_id, c.id, c.seq, c.round, c.ts
FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(run_id, since)
JOIN {ToolCall._meta.db_table} AS c ON c.run_id = v.run_id AND c.ts >= v.since
JOIN {Event._meta.db_table} AS e ON e.run_id = c.run_id AND e.seq = c.seq AND e.event_id LIKE 'otel:%%'
"""


def _stored_read(
    since: dict[int, datetime],
) -> tuple[dict[int, int], dict[int, list[_Round]], dict[int, list[_Call]]]:
    rounds: dict[int, list[_Round]] = defaultdict(list)
    calls: dict[int, list[_Call]] = defaultdict(list)
    if not since:
        return {}, rounds, calls
    if postgres_statements():
        from ingest.bulk import statements_run

        params = [list(since), list(since.values())]
        counted, round_rows, call_rows = statements_run(
            [(_BEFORE_SQL, params), (_ROUNDS_SQL, params), (_CALLS_SQL, params)]
        )
        before = dict(counted or ())
        for run_pk, pk, seq, number, start, ts in round_rows or ():
            rounds[run_pk].append(_Round(start, ts, seq, number, pk))
        for run_pk, pk, seq, number, ts in call_rows or ():
            calls[run_pk].append(_Call(ts, seq, number, pk))
        return before, rounds, calls
    before = {}
    for run_pk, start in since.items():
        stored = ModelRound.objects.filter(run_id=run_pk)
        before[run_pk] = stored.filter(started_at__lt=start).count() + stored.filter(started_at=None).count()
        for pk, seq, number, started_at, ts in stored.filter(started_at__gte=start).values_list(
            "pk", "seq", "round", "started_at", "ts"
        ):
            assert started_at is not None  # started_at__gte leaves NULL out
            rounds[run_pk].append(_Round(started_at, ts, seq, number, pk))
        otlp = set(
            Event.objects.filter(run_id=run_pk, event_id__startswith=OTLP_EVENT_PREFIX).values_list(
                "seq", flat=True
            )
        )
        for pk, seq, number, ts in ToolCall.objects.filter(run_id=run_pk, ts__gte=start).values_list(
            "pk", "seq", "round", "ts"
        ):
            if seq in otlp:
                calls[run_pk].append(_Call(ts, seq, number, pk))
    return before, rounds, calls
