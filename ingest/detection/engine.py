"""The engine: one run's events in, detections out.

    engine = Engine(config)
    state = RunState()
    for event in events:
        for detection in engine.feed(state, event):
            ...

`feed` reads no clock and does no I/O; everything it knows is in `state`, which serialises to
JSON so that another worker can go on where this one stopped.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from ingest.detection import bounds, calls, errors, kinds, text
from ingest.detection.budgets import check_budgets, run_budgets
from ingest.detection.config import DEFAULT_CONFIG, Config
from ingest.detection.normalize import (
    CURSOR_KEYS,
    canonical,
    digest,
    result_facts,
    split_cursor,
)
from ingest.detection.policy import CORRECT, TERMINATE, Detection, action_name, level_for
from ingest.detection.state import (
    MAX_FACTS,
    MAX_GOALS,
    MAX_INFERRED,
    MAX_PENDING,
    RECENT_CALLS,
    Call,
    RunState,
    remember,
)


def parse_ts(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def result_digest_of(result_event: dict[str, Any]) -> str:
    """What detection compares results on: the sender's sha256 of a cut result, else the result's."""
    if result_event.get("result_sha256"):
        return str(result_event["result_sha256"])[:16]
    return digest(canonical(result_event.get("result")))


def failed_result(status: str, error_class: str) -> bool:
    """A result that brings no answer: not ok, or ok with a definitive error class (empty, not found…)."""
    return status != "ok" or error_class in errors.NON_RETRYABLE_SET


class Engine:
    def __init__(self, config: Config = DEFAULT_CONFIG) -> None:
        self.config = config
        self.t = config.thresholds

    def feed(self, state: RunState, event: dict[str, Any]) -> list[Detection]:
        """Fold one event into the state; the detections it causes, in order."""
        state.events += 1
        ts = parse_ts(event.get("ts"))
        if ts is not None:
            # The run's clock starts with its first event and only moves forward: an event (or a
            # guard check) stamped before the start, by a skewed or replaying caller, does not
            # stretch the run back in time and so cannot exhaust its wall-clock budget.
            if state.start_ts is None:
                state.start_ts = ts
            state.last_ts = max(ts, state.start_ts) if state.last_ts is None else max(state.last_ts, ts)
        kind = event.get("type")
        found: list[Detection] = []
        if kind == "run_started":
            state.budgets = run_budgets(self.t, event.get("budgets") or {})
        elif kind == "model_round":
            found += self._model_round(state, event)
        elif kind == "tool_call":
            found += self._tool_call(state, event, ts)
        elif kind == "tool_result":
            found += self._tool_result(state, event, ts)
        elif kind == "user_message":
            from_user, news, fired = text.user_message(self.t, state, event)
            found += fired
            if from_user:
                # What the agent reads or retries after a user's turn answers a new question (the
                # user may have asked for it); only news is progress.
                state.world += 1
                if news:
                    self._progress(state)
        elif kind == "run_finished":
            pass
        if not state.budgets:
            state.budgets = run_budgets(self.t, {})
        found += check_budgets(self.t, state)
        return self._admit(state, found)

    # --- events ---------------------------------------------------------------------------

    def _model_round(self, state: RunState, event: dict[str, Any]) -> list[Detection]:
        number = bounds.count(event.get("round", state.round))
        previous_calls = state.round_calls
        if number != state.round:
            state.round_calls = 0
        state.round = max(state.round, number)
        state.tokens = bounds.total(state.tokens, event.get("input_tokens", 0))
        state.tokens = bounds.total(state.tokens, event.get("output_tokens", 0))
        state.cost_usd = bounds.amount_add(state.cost_usd, event.get("cost_usd"))
        return text.detect_text(self.t, state, event, previous_calls)

    def _tool_call(self, state: RunState, event: dict[str, Any], ts: float | None) -> list[Detection]:
        state.calls += 1
        state.round_calls += 1
        number = bounds.count(event.get("round", state.round))
        state.round = max(state.round, number)
        name = str(event.get("tool", ""))
        spec = self.config.tool(name)
        kind, kind_from = kinds.kind_resolve(event.get("kind"), spec.kind, name)
        if kind_from not in kinds.DECLARED and name in state.inferred:
            kind, kind_from = state.inferred[name], "result"
        args = event["args"] if isinstance(event.get("args"), dict) else {}
        clean, rest, cursor = self._normalise(name, args)
        core = {k: v for k, v in rest.items() if k in spec.core_args} if spec.core_args else rest
        sig = digest([name, rest])
        # A step is a call, or a round of calls when the backend batches them in parallel.
        if not self.t.count_by_round or state.step_round != number:
            state.step += 1
            state.step_round = number
        call = Call(
            index=state.calls,
            round=number,
            tool=name,
            kind=kind,
            sig=sig,
            goal=digest([name, core]),
            args=clean,
            cursor=digest(cursor) if cursor else "",
            write_key=str(event.get("operation_key") or event.get("step_id") or "")
            if kind == "write"
            else "",
            step=state.step,
            kind_from=kind_from,
            world=state.world,
        )
        stack = state.pending.setdefault(str(event.get("call_id", "")), [])
        stack.append(call)
        if sum(len(v) for v in state.pending.values()) > MAX_PENDING:
            oldest = next(iter(state.pending))
            state.pending[oldest].pop(0)
            if not state.pending[oldest]:
                del state.pending[oldest]
        state.recent.append(call)
        del state.recent[:-RECENT_CALLS]
        goals = state.goals.get(call.goal, 0) + 1
        remember(state.goals, call.goal, goals, MAX_GOALS)
        errors.note_call(state, call)
        text.note_tool_call(state)
        found = calls.detect_on_call(self.t, state, call, ts)
        found += calls.detect_goal_budget(self.t, state, call, goals)
        return kinds.with_kind(found, call)

    def _normalise(
        self, name: str, args: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(canonical arguments, those without the cursor, the cursor) of a call of `name`."""
        spec = self.config.tool(name)
        clean = canonical(args, casefold=spec.casefold, noise=spec.noise_args)
        rest, cursor = split_cursor(clean, CURSOR_KEYS | {c.lower() for c in spec.cursor_args})
        return clean, rest, cursor

    def identity(self, name: str, args: dict[str, Any]) -> tuple[str, str]:
        """(signature, cursor digest) of a call, as the detectors compare calls: two calls with
        both equal ask for the very same thing (used by the guard to find a reusable result)."""
        _, rest, cursor = self._normalise(name, args)
        return digest([name, rest]), digest(cursor) if cursor else ""

    def _tool_result(self, state: RunState, event: dict[str, Any], ts: float | None) -> list[Detection]:
        stack = state.pending.get(str(event.get("call_id", "")))
        if not stack:
            return []  # a result for a call the engine never saw: nothing to compare it with
        call = stack.pop()  # the most recent unanswered call with this id
        if not stack:
            del state.pending[str(event.get("call_id", ""))]
        status = event.get("status", "ok")
        error_class = event.get("error_class", "") or ""
        result_digest = result_digest_of(event)
        failed = failed_result(status, error_class)
        result = event.get("result")
        facts = [] if failed else result_facts(result)
        fresh = [f for f in facts if f not in state.facts]
        for fact in facts:
            remember(state.facts, fact, None, MAX_FACTS)
        call.digest = f"{status}:{error_class}:{result_digest}"
        if not failed and call.kind_from not in kinds.DECLARED:
            self._kind_from_result(state, call, result)
        # A new id, path or url looked at, answered with something other than the previous answer, is
        # news about that thing even when the same content was seen elsewhere (identical folders).
        named = calls.targets(call.args)
        new_target = any(v not in state.targets for v in named)
        for value in named:
            remember(state.targets, value, None, MAX_FACTS)
        answered = bool(facts) and call.digest != state.last_result
        state.last_result = call.digest
        call.new_info = bool(fresh) or (new_target and answered)
        for entry in state.recent:
            if entry.index == call.index:
                entry.digest, entry.new_info = call.digest, call.new_info
                entry.kind, entry.kind_from = call.kind, call.kind_from
        record_progress, found = calls.note_result(self.t, state, call, ts, failed)
        if failed and call.fresh:
            state.tried = True  # something new was tried (an answer the user gave, say) and failed
        rec = state.sigs.get(call.sig)
        if call.kind == "write" and not failed and rec is not None and rec.streak == 1:
            # A write that did something (its first answer, or another than last time) changes the
            # world; the same write answered the same way did nothing new.
            state.world += 1
            rec.world = state.world
            state.stalled, state.stalled_fired = 0, 0  # the task moved on: earlier requests are done
        found += errors.detect_repeated_error(self.t, state, call, status, error_class, result_digest, failed)
        if not failed:
            found += calls.detect_perturbation(self.t, state, call)
        if call.kind == "write":
            remember(
                state.writes, call.write_key, "ok" if status == "ok" and not failed else status, MAX_GOALS
            )
        progress = (
            record_progress is True or (call.new_info and not failed) or (call.kind == "write" and not failed)
        )
        if progress:
            self._progress(state)
        elif record_progress is not None or call.kind != "poll":
            found += self._no_progress(state, call)
        return kinds.with_kind(found, call)

    def _kind_from_result(self, state: RunState, call: Call, result: Any) -> None:
        """An undeclared read or other whose result says "still working", or whose status changed
        between identical calls, is a poll: from now on for this tool."""
        status = kinds.status_of(result)
        rec = state.sigs.get(call.sig)
        previous = rec.status if rec is not None else ""
        if rec is not None:
            rec.status = status
        if call.kind not in ("read", "other") or not status:
            return
        if kinds.pending(status) or (previous and previous != status and rec and rec.last_digest):
            call.kind, call.kind_from = "poll", "result"
            remember(state.inferred, call.tool, "poll", MAX_INFERRED)

    # --- progress ---------------------------------------------------------------------------

    def _progress(self, state: RunState) -> None:
        state.last_progress_step = state.step
        state.steps_without_progress = 0
        state.no_progress_fired = 0

    def _no_progress(self, state: RunState, call: Call) -> list[Detection]:
        # Parallel calls of one round are one step when counting by round.
        if state.steps_without_progress and call.step == state.np_step:
            return []
        state.steps_without_progress += 1
        state.np_step = call.step
        k = self.t.no_progress_steps
        level = level_for(state.steps_without_progress, k, max(1, k // 2))
        if level < CORRECT or level <= state.no_progress_fired:
            return []
        state.no_progress_fired = level
        return [
            Detection(
                kind="no_progress",
                action=action_name(level),
                at_call=state.calls,
                at_round=state.round,
                count=state.steps_without_progress,
                tool=call.tool,
                hint=(
                    f"No progress in the last {state.steps_without_progress} steps: no result brought new "
                    f"information since step {state.last_progress_step}. Summarise what you know and "
                    "finish, or ask the user."
                ),
                evidence={
                    "last_progress_step": state.last_progress_step,
                    "steps": state.steps_without_progress,
                },
            )
        ]

    # --- policy -------------------------------------------------------------------------------

    def _admit(self, state: RunState, found: list[Detection]) -> list[Detection]:
        """Apply each kind's rollout mode; nothing more after the run was terminated; remember the
        strongest action and the end. One event fires a problem once: two findings of the same kind
        and signature (two rules seeing one repeated question, say) are one, the stronger — the
        pipeline stores one detection per event, kind and signature, and replay must say the same."""
        admitted = []
        for detection in _strongest_each(found):
            if state.max_action >= TERMINATE:
                break
            detection = self._mode(detection)
            admitted.append(detection)
            state.max_action = max(state.max_action, detection.level)
            if detection.action == "terminate" and not state.terminated_by:
                state.terminated_by = "budget" if detection.kind == "budget" else "loop"
                state.budget_type = (
                    detection.evidence.get("budget_type", "") if detection.kind == "budget" else ""
                )
        return admitted

    def _mode(self, detection: Detection) -> Detection:
        """shadow: recorded as observe with the action it would have taken; correct-only: never
        more than a correction. The detectors' own escalation is unchanged (it is what full would do)."""
        if detection.level < CORRECT:
            return detection
        mode = self.t.mode(detection.kind)
        if mode == "shadow":
            return replace(
                detection, action="observe", evidence={**detection.evidence, "shadow": detection.action}
            )
        if mode == "correct-only" and detection.level > CORRECT:
            return replace(
                detection, action="correct", evidence={**detection.evidence, "capped": detection.action}
            )
        return detection


def _strongest_each(found: list[Detection]) -> list[Detection]:
    """The findings with one per (kind, signature): the strongest, in the first one's place."""
    kept: list[Detection] = []
    place: dict[tuple[str, str], int] = {}
    for detection in found:
        key = (detection.kind, detection.signature)
        if key not in place:
            place[key] = len(kept)
            kept.append(detection)
        elif detection.level > kept[place[key]].level:
            kept[place[key]] = detection
    return kept


def replay_run(
    events: list[dict[str, Any]], config: Config = DEFAULT_CONFIG
) -> tuple[RunState, list[Detection]]:
    """Every detection of one run's events, in order."""
    engine = Engine(config)
    state = RunState()
    found: list[Detection] = []
    for event in events:
        found += engine.feed(state, event)
    return state, found
