"""Repeated errors: the same failure from the same call, by error class."""

from __future__ import annotations

from ingest.detection.config import NON_RETRYABLE, RETRYABLE, Thresholds
from ingest.detection.policy import CORRECT, Detection, action_name, level_for
from ingest.detection.state import MAX_SIGS, Call, RunState, remember

NON_RETRYABLE_SET = frozenset(NON_RETRYABLE)


def note_call(state: RunState, call: Call) -> None:
    """Same-tool retries: the same call again right away, or a call of a tool whose last call failed."""
    if call.sig == state.prev_sig or state.retry_tool == call.tool:
        state.retries += 1
    else:
        state.retries = 0
    state.prev_sig = call.sig


def detect_repeated_error(
    t: Thresholds,
    state: RunState,
    call: Call,
    status: str,
    error_class: str,
    result_digest: str,
    failed: bool,
) -> list[Detection]:
    if not failed:
        state.errors.pop(call.sig, None)
        return []
    if call.kind == "write" and status == "timeout":
        return []  # an UNKNOWN write: the duplicate-write detector and the ledger own it
    klass = error_class or ("transient" if status == "timeout" else "other")
    previous = state.errors.get(call.sig) or []  # stored entries are never empty
    same = bool(previous) and previous[0] == klass and previous[1] == result_digest
    step = 1 if call.reaction else 0  # sent before the failure was seen: not a retry of it
    # `count`: the same failure in a row since the world last changed — after a user's turn the
    # retry may be what the user asked for (or the cause changed). `stubborn`: in a row whatever
    # came between, with one retry more: the user saying "try again" does not make it work.
    if same and len(previous) > 5 and previous[4] == call.world:
        count, fired = previous[2] + step, previous[3]
    else:
        count, fired = 1, 0 if not same else previous[3]
    stubborn = previous[5] + step if same and len(previous) > 5 else 1
    if klass in NON_RETRYABLE_SET:
        first = t.error_repeats
    elif klass in RETRYABLE:
        first = t.transient_retries + 1
    else:
        first = t.other_error_repeats
    level = max(level_for(count, first, t.escalate_every), level_for(stubborn, first + 1, t.escalate_every))
    emit = level >= CORRECT and level > fired
    remember(
        state.errors,
        call.sig,
        [klass, result_digest, count, max(fired, level if emit else fired), call.world, stubborn],
        MAX_SIGS,
    )
    count = max(count, stubborn)
    if not emit:
        return []
    if klass in RETRYABLE:
        hint = (
            f"{call.tool} failed {count} times in a row ({klass}). Back off with jitter (for example "
            "2 s, 4 s, 8 s, each ± 50 %) before retrying, or give up and report the failure."
        )
    else:
        hint = (
            f"{call.tool} failed {count} times with the same {klass} error. Retrying it unchanged will "
            "fail again: fix the arguments, use another tool, or tell the user."
        )
    return [
        Detection(
            kind="repeated_error",
            action=action_name(level),
            at_call=call.index,
            at_round=call.round,
            count=count,
            signature=call.sig,
            tool=call.tool,
            hint=hint,
            evidence={"error_class": klass, "args": call.args, "failures": count},
        )
    ]
