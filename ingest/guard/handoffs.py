"""Handoffs: a run marked WAITING for a person with what was tried, and the person's answer
(resume or stop)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ingest.models import Run, ToolCall

if TYPE_CHECKING:
    from ingest.guard.check import ProposedCall, _RunView


# Calls listed in a handoff's summary of what was tried.
TRIED_CALLS = 10


EARLIER_HANDOFFS = 10  # answered handoffs a run keeps (the row stays small)


def _handoff_mark(
    run: _RunView, detection: dict[str, Any], call: ProposedCall, kind: str, now: datetime
) -> dict[str, Any]:
    """Mark the run WAITING for a person, with what happened and what was tried."""
    tried = [
        {
            "seq": c["seq"],
            "round": c["round"],
            "tool": c["tool"],
            "kind": c["kind"],
            "args": c["args"],
            "status": c["result_status"] or "no result",
            "error_class": c["error_class"],
        }
        for c in ToolCall.objects.filter(run_id=run.pk)
        .order_by("-seq")
        .values("seq", "round", "tool", "kind", "args", "result_status", "error_class")[:TRIED_CALLS]
    ][::-1]
    summary = {
        "at": now.isoformat(),
        "by": "guard",
        "kind": detection["kind"],
        "tool": detection.get("tool", ""),
        "count": detection.get("count", 0),
        "hint": detection["hint"],
        "evidence": detection.get("evidence") or {},
        "proposed": {"tool": call.tool, "kind": kind, "args": call.args, "round": call.round},
        "tried": tried,
        "figures": {
            "rounds": run.rounds,
            "tool_calls": run.tool_calls,
            "tool_errors": run.tool_errors,
            "cost_usd": run.cost_usd,
            "last_progress_step": run.last_progress_step,
        },
    }
    if run.handoff:  # asked before and answered: that handoff and its answer stay, newest first
        previous = {key: value for key, value in run.handoff.items() if key != "earlier"}
        summary["earlier"] = [previous, *run.handoff.get("earlier", [])][:EARLIER_HANDOFFS]
    Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(
        status=Run.Status.WAITING, handoff=summary
    )
    return summary


def run_handoff_resolve(
    *, run: Run, resume: bool, by: str, note: str = "", expected_at: str | None = None
) -> bool:
    """A person's answer to a handoff. resume: the run goes on (checks decide again; the engine's
    counts carry on, so the same loop soon asks again). Otherwise it is stopped: status abandoned,
    terminated_by user, and every check answers terminate. The answer is kept in Run.handoff, with
    the seq it was given at: interventions stored up to it were answered (_pending_interventions).

    expected_at: the handoff's "at" the person was shown; a newer handoff of the run is not answered.
    False when the run was not waiting (already answered, or finished meanwhile), or waits for
    another handoff than expected_at.
    """
    answered = {
        **(run.handoff or {}),
        "resolved": {
            "at": timezone.now().isoformat(),
            "by": by,
            "resume": resume,
            "note": note,
            "seq": run.events_count,
        },
    }
    changes: dict[str, Any] = {"handoff": answered}
    if resume:
        changes["status"] = Run.Status.RUNNING
    else:
        changes.update(
            status=Run.Status.ABANDONED,
            terminated_by="user",
            reason=note or f"stopped by {by}",
            finished_at=timezone.now(),
        )
    waiting = Run.objects.filter(pk=run.pk, status=Run.Status.WAITING)
    if expected_at is not None:
        waiting = waiting.filter(handoff__at=expected_at)
    return bool(waiting.update(**changes))


class HandoffRefused(Exception):
    """An answer that changed nothing, and why: `reason` is already_answered (with who, when and
    whether they resumed), asked_again (a newer handoff than the one shown, asked at `at`) or
    not_waiting (the run is `status` now)."""

    def __init__(self, reason: str, *, status: str, by: str = "", at: str = "", resumed: bool = False):
        super().__init__(reason)
        self.reason, self.status, self.by, self.at, self.resumed = reason, status, by, at, resumed

    def describe(self, time_text: Callable[[str], str] = str) -> str:
        """Why, in words (for the run's page and the API); time_text renders the ISO times."""
        status = Run.Status(self.status).label.lower()
        if self.reason == "already_answered":
            what = "resumed" if self.resumed else "stopped"
            return f"already answered by {self.by or '?'} at {time_text(self.at)} ({what}); the run is now {status}"
        if self.reason == "asked_again":
            return (
                f"the run asked for a person again at {time_text(self.at)}, after the handoff answered "
                "here: read the new summary, then answer"
            )
        return f"the run is no longer waiting (now {status})"


def run_handoff_answer(*, run: Run, resume: bool, by: str, note: str, shown_at: str | None) -> Run:
    """A person's answer to the handoff shown at `shown_at` (its "at"; None: whichever the run
    waits for): run_handoff_resolve, then the run as it is now. Raises HandoffRefused, saying why,
    when nothing changed: answered already (a second click, a colleague), the run finished
    meanwhile, or it waits for a newer handoff than the one shown."""
    if run_handoff_resolve(run=run, resume=resume, by=by, note=note, expected_at=shown_at):
        run.refresh_from_db()
        return run
    run.refresh_from_db()
    handoff = run.handoff or {}
    resolved = handoff.get("resolved") or {}
    if resolved and (shown_at is None or (handoff.get("at") or "") == shown_at):
        raise HandoffRefused(
            "already_answered",
            status=run.status,
            by=str(resolved.get("by", "")),
            at=str(resolved.get("at", "")),
            resumed=bool(resolved.get("resume")),
        )
    if run.status == Run.Status.WAITING:
        raise HandoffRefused("asked_again", status=run.status, at=str(handoff.get("at", "")))
    raise HandoffRefused("not_waiting", status=run.status)
