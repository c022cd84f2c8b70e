"""Detectors over call signatures: repeats, oscillation, interval loops, perturbation, polls, writes."""

from __future__ import annotations

from typing import Any

from rapidfuzz import fuzz

from ingest.detection.config import Thresholds
from ingest.detection.normalize import fuzzy_view
from ingest.detection.policy import CORRECT, HANDOFF, Detection, action_name, level_for, short
from ingest.detection.state import MAX_GOALS, MAX_SIGS, Call, RunState, SigRecord, remember

_ID_CHARS = frozenset("0123456789/:@\\")


def detect_on_call(t: Thresholds, state: RunState, call: Call, ts: float | None) -> list[Detection]:
    """Before the call runs: is it a write already done, or a read repeating itself?"""
    rec = state.sigs.get(call.sig)
    if rec is None:
        rec = SigRecord(first_call=call.index, world=call.world)
        call.fresh = True
    else:
        # Sent in the same round as the previous identical call and before that one's result came
        # (a parallel batch: the model saw neither result): not a reaction to it, so not a repeat.
        # Rounds alone do not say it: a runtime that numbers no rounds sends everything in one.
        call.reaction = not (rec.last_round == call.round and rec.answered_call < rec.last_call)
    call.adjacent = rec.last_call == call.index - 1 or (t.count_by_round and rec.last_round == call.round)
    rec.last_call = call.index
    rec.last_round = call.round
    remember(state.sigs, call.sig, rec, MAX_SIGS)
    if call.kind == "write" and call.write_key:
        return _duplicate_write(t, state, call)  # keyed: the key says whether it is the same write
    if call.kind == "poll" or rec.last_digest is None or rec.streak < 1 or not call.reaction:
        return []
    if rec.world != call.world:
        return []  # the world changed since: asking again is a new question
    return _repeat(t, state, call, rec)


def _repeat(t: Thresholds, state: RunState, call: Call, rec: SigRecord) -> list[Detection]:
    occurrence = rec.streak + 1  # if its result is the same again
    recent = [c for c in state.recent if c.world == call.world]  # cycles within this stretch
    period, cycles, members = _periodic_suffix(recent)
    if period >= 2 and call.sig in members:
        if any(c.kind == "poll" for c in recent[-period:]):
            return []  # polling between other calls: the poll budget's business
        if not all(state.sigs[s].streak >= cycles - 1 for s in members if s in state.sigs):
            return []
        kind, count, level = "oscillation", cycles, level_for(cycles, t.oscillation_cycles, t.escalate_every)
        if level < CORRECT:
            return []
        targets = [state.sigs[s] for s in members if s in state.sigs]
    else:
        adjacent = rec.adjacent and call.adjacent
        kind = "exact_repeat" if adjacent else "interval_loop"
        # A read's answer is its result: the same again is waste. A call that acts may be re-sent
        # because its effect could not be confirmed, so it gets one more.
        tolerance = t.repeat_tolerance if call.kind == "read" else t.action_repeat_tolerance
        count, level = occurrence, level_for(occurrence, tolerance, t.escalate_every)
        targets = [rec]
    if level <= rec.fired:
        return []
    for target in targets:
        target.fired = max(target.fired, level)
    if kind == "oscillation":
        tools = " → ".join(c.tool for c in recent[-period:])
        hint = (
            f"You are alternating {tools} and the results have not changed for {cycles} cycles. "
            "Stop alternating: use what you have, try a different approach, or finish."
        )
        evidence = {"period": period, "cycles": cycles, "sequence": [c.tool for c in recent[-period:]]}
    elif kind == "exact_repeat":
        hint = (
            f"You have called {call.tool} {count} times with identical arguments {short(call.args)} and the "
            "result has not changed. Use the result you have, change the query, or finish."
        )
        evidence = {"args": call.args, "first_call": rec.first_call, "result": rec.last_digest}
    else:
        hint = (
            f"You already called {call.tool} with {short(call.args)} {count - 1} times in this run "
            f"(first at call {rec.first_call}) and got the same result each time. Reuse it instead of "
            "calling again."
        )
        evidence = {"args": call.args, "first_call": rec.first_call, "result": rec.last_digest}
    return [
        Detection(
            kind=kind,
            action=action_name(level),
            at_call=call.index,
            at_round=call.round,
            count=count,
            signature=call.sig,
            tool=call.tool,
            hint=hint,
            evidence=evidence,
        )
    ]


def _periodic_suffix(recent: list[Call]) -> tuple[int, int, set[str]]:
    """(period, full cycles, signatures in the cycle) of the longest periodic tail, period 2..4."""
    sigs = [c.sig for c in recent]
    best: tuple[int, int, set[str]] = (0, 0, set())
    period: int
    for period in (2, 3, 4):
        if len(sigs) < 2 * period:
            continue
        head = sigs[-period:]
        if len(set(head)) != period:
            continue
        length = period
        while length < len(sigs) and sigs[-length - 1] == sigs[-length - 1 + period]:
            length += 1
        cycles = length // period
        if cycles >= 2 and cycles > best[1]:
            best = (period, cycles, set(head))
    return best


def note_result(
    t: Thresholds, state: RunState, call: Call, ts: float | None, failed: bool
) -> tuple[bool | None, list[Detection]]:
    """Update the signature's streak with this result.

    Returns (progress, detections): progress True when a polled status changed or a cursor advanced
    to a new result, False when nothing changed, None for a poll still within its budget (waiting
    is not a lack of progress).
    """
    rec = state.sigs.get(call.sig)
    if rec is None:
        rec = SigRecord(first_call=call.index, last_call=call.index, last_round=call.round, world=call.world)
        remember(state.sigs, call.sig, rec, MAX_SIGS)
    rec.answered_call = max(rec.answered_call, call.index)
    if rec.world != call.world:
        # The first answer since the world changed (a user's turn, a write): a new question.
        rec.streak, rec.last_digest, rec.fired, rec.world = 0, None, 0, call.world
    unchanged = rec.last_digest == call.digest
    # The next call of this tool is a retry when this one failed.
    state.retry_tool = call.tool if failed else ""
    advanced = bool(call.cursor) and call.cursor not in rec.cursors
    if call.cursor and advanced:
        rec.cursors = [*rec.cursors[-15:], call.cursor]
    if failed:
        rec.streak, rec.last_digest, rec.fired = 0, None, 0
        return False, []
    if unchanged and not call.reaction:
        return False, []  # the same answer to a call sent before the first answer came
    if unchanged:
        rec.streak += 1
        rec.adjacent = rec.adjacent and call.adjacent
        if call.kind == "poll":
            return _poll(t, state, call, rec, ts)
        return False, []
    first = rec.last_digest is None
    rec.streak, rec.adjacent, rec.first_call, rec.fired = 1, True, call.index, 0
    rec.last_digest = call.digest
    if call.kind == "poll":
        rec.polls_unchanged, rec.poll_since_ts = 0, ts or 0.0
        return (None if first else True), []
    return advanced and not first, []


def _poll(
    t: Thresholds, state: RunState, call: Call, rec: SigRecord, ts: float | None
) -> tuple[bool | None, list[Detection]]:
    rec.polls_unchanged += 1
    waited = (ts - rec.poll_since_ts) if ts is not None and rec.poll_since_ts else 0.0
    over_count = rec.polls_unchanged - t.poll_max_unchanged
    over_time = waited >= t.poll_max_wall_s
    if over_count < 0 and not over_time:
        return None, []
    occurrence = max(over_count, 0) + 1
    level = level_for(occurrence, 1, t.escalate_every)
    if level <= rec.fired:
        return False, []
    rec.fired = level
    return False, [
        Detection(
            kind="poll_budget",
            action=action_name(level),
            at_call=call.index,
            at_round=call.round,
            count=rec.polls_unchanged,
            signature=call.sig,
            tool=call.tool,
            hint=(
                f"{call.tool} has returned the same status {rec.polls_unchanged} times over {waited:.0f} s. "
                "Stop polling: tell the user the job is still pending, or wait much longer before checking again."
            ),
            evidence={
                "polls_unchanged": rec.polls_unchanged,
                "waited_s": round(waited, 1),
                "args": call.args,
            },
        )
    ]


def detect_perturbation(t: Thresholds, state: RunState, call: Call) -> list[Detection]:
    """Near-identical calls of one tool whose results bring nothing new."""
    if call.kind in ("poll", "write") or call.new_info:
        call.cluster = 1
        return []
    previous = None
    for entry in reversed(state.recent):
        if entry.index >= call.index or entry.tool != call.tool or entry.digest is None:
            continue
        if entry.sig == call.sig and entry.cursor == call.cursor:
            continue  # identical: the repeat detector's business
        if entry.world != call.world:
            break  # asked before the world changed: this one is a new question
        same_target = bool(targets(call.args)) and targets(entry.args) == targets(call.args)
        if similar(entry.args, call.args, t.similarity) or (same_target and entry.digest == call.digest):
            # Nearly the same request, or the same thing asked about in other words (status "open",
            # "pending", "in progress") with the very same answer.
            previous = entry
        break
    if previous is None or (previous.digest or "").split(":", 1)[0] != "ok":
        call.cluster = 1
        return []
    call.cluster = previous.cluster + 1
    for entry in state.recent:
        if entry.index == call.index:
            entry.cluster = call.cluster
    level = level_for(call.cluster, t.perturbation_calls, t.escalate_every)
    fired = state.perturbed.get(call.goal, 0)
    if level < CORRECT or level <= fired:
        return []
    remember(state.perturbed, call.goal, level, MAX_GOALS)
    return [
        Detection(
            kind="perturbation",
            action=action_name(level),
            at_call=call.index,
            at_round=call.round,
            count=call.cluster,
            signature=call.sig,
            tool=call.tool,
            hint=(
                f"You have called {call.tool} {call.cluster} times with slightly different arguments "
                f"(now {short(call.args)}) and none of the results brought anything new. Changing the "
                "wording or the offset will not help: use what you have or try a different approach."
            ),
            evidence={"args": call.args, "previous_args": previous.args, "cluster": call.cluster},
        )
    ]


def similar(a: dict[str, Any], b: dict[str, Any], threshold: float) -> bool:
    """Two argument sets that ask for nearly the same thing."""
    shared = a.keys() & b.keys()
    if not shared:
        return False
    for key in a.keys() ^ b.keys():
        value = a.get(key, b.get(key))
        if not _trivial(value):
            return False
    scores = [_value_similarity(a[k], b[k]) for k in shared]
    return min(scores) >= 0.5 and sum(scores) / len(scores) >= threshold


def _trivial(value: Any) -> bool:
    """An extra argument that does not change what is asked (a flag, a small number, a short word)."""
    return (
        value is None
        or isinstance(value, bool | int | float)
        or (isinstance(value, str) and len(value) <= 12 and " " not in value)
    )


def _value_similarity(x: Any, y: Any) -> float:
    if x == y:
        return 1.0
    if isinstance(x, bool) or isinstance(y, bool):
        return 0.0
    if isinstance(x, int | float) and isinstance(y, int | float):
        return 0.9 if abs(x - y) <= max(1, 0.05 * max(abs(x), abs(y))) else 0.0
    if isinstance(x, str) and isinstance(y, str):
        x, y = fuzzy_view(x), fuzzy_view(y)  # long values: bounded work (issue 11)
        if x.casefold() == y.casefold():
            return 0.95
        if _id_like(x) or _id_like(y):
            return 0.0  # ids, paths, urls: another value is another thing
        return (
            max(fuzz.ratio(x.casefold(), y.casefold()), fuzz.token_set_ratio(x.casefold(), y.casefold()))
            / 100
        )
    if isinstance(x, dict) and isinstance(y, dict):
        return 1.0 if similar(x, y, 0.9) else 0.0
    return 0.0


def _id_like(value: str) -> bool:
    """One token with digits or separators: an id, a path, a url (free text has spaces)."""
    return " " not in value.strip() and bool(_ID_CHARS & set(value))


def targets(args: dict[str, Any]) -> list[str]:
    """The ids, paths and urls a call names: a new one is something not looked at before."""
    return [v for v in args.values() if isinstance(v, str) and _id_like(v)]


def _duplicate_write(t: Thresholds, state: RunState, call: Call) -> list[Detection]:
    if not call.write_key:
        return []
    previous = state.writes.get(call.write_key)
    remember(state.writes, call.write_key, "pending", MAX_GOALS)
    if previous is None:
        return []
    attempts = state.write_attempts.get(call.write_key, 1) + 1
    remember(state.write_attempts, call.write_key, attempts, MAX_GOALS)
    level = level_for(attempts, 2, t.escalate_every)
    if previous == "timeout":
        hint = (
            f"The previous {call.tool} with key {call.write_key} timed out: it may have happened. Do not "
            "retry it blindly; check its status (by its external request id) first."
        )
        level = max(level, HANDOFF) if attempts > 2 else level
    elif previous == "ok":
        hint = f"{call.tool} with key {call.write_key} already succeeded; reuse its result instead of repeating it."
    elif previous == "pending":
        hint = f"{call.tool} with key {call.write_key} is still running; wait for its result instead of sending it again."
    else:
        return []
    return [
        Detection(
            kind="duplicate_write",
            action=action_name(level),
            at_call=call.index,
            at_round=call.round,
            count=attempts,
            signature=call.sig,
            tool=call.tool,
            hint=hint,
            evidence={"operation": call.write_key, "previous_status": previous, "attempts": attempts},
        )
    ]


def detect_goal_budget(t: Thresholds, state: RunState, call: Call, goals: int) -> list[Detection]:
    """The per-goal budget: calls of one tool for one set of core arguments (cursors left out)."""
    if call.kind in ("poll", "write") or goals != t.max_goal_calls:
        return []
    return [
        Detection(
            kind="budget",
            action="handoff",
            at_call=call.index,
            at_round=call.round,
            count=goals,
            signature=call.goal,
            tool=call.tool,
            hint=f"{goals} calls of {call.tool} for the same goal ({short(call.args)}). A person should look.",
            evidence={"budget_type": "per_goal", "limit": t.max_goal_calls, "consumed": goals},
        )
    ]
