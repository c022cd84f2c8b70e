"""A person's answer to a run waiting for one, through the guard (which owns the run's states)."""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.runs.selectors import handoff_time
from ingest.guard import run_handoff_resolve
from ingest.models import Run


class HandoffNotWaiting(Exception):
    """The run no longer waits for the handoff the person was shown; nothing was changed."""


@dataclass(frozen=True)
class HandoffAnswered:
    run: Run
    message: str


def handoff_time_text(value: str | None) -> str:
    """An ISO timestamp of Run.handoff as the pages show times ("2026-01-02 10:00:00 UTC")."""
    when = handoff_time(value)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC") if when else (value or "?")


def run_handoff_answer(*, run: Run, user, resume: bool, note: str, shown_at: str) -> HandoffAnswered:
    """Answer the handoff shown at `shown_at`: resume or stop the run.

    Raises HandoffNotWaiting, saying why, when it was answered already (a second click, a
    colleague), the run finished meanwhile, or it waits for a newer handoff than the one shown.
    """
    who = user.get_username()
    # A handoff without its "at" (none the guard writes) is answered whatever it says.
    expected_at = shown_at or None
    if run_handoff_resolve(run=run, resume=resume, by=who, note=note.strip(), expected_at=expected_at):
        run.refresh_from_db()
        if resume:
            return HandoffAnswered(run, f"{run.run_id}: resumed — checks decide again.")
        return HandoffAnswered(run, f"{run.run_id}: stopped — every check now answers terminate.")
    run.refresh_from_db()
    handoff = run.handoff or {}
    resolved = handoff.get("resolved") or {}
    if (handoff.get("at") or "") == shown_at and resolved:
        what = "resumed" if resolved.get("resume") else "stopped"
        raise HandoffNotWaiting(
            f"already answered by {resolved.get('by', '?')} at {handoff_time_text(resolved.get('at'))} "
            f"({what}); the run is now {run.get_status_display().lower()}"
        )
    if run.status == Run.Status.WAITING:
        raise HandoffNotWaiting(
            f"the run asked for a person again at {handoff_time_text(handoff.get('at'))}, after this "
            "page was shown: read the new summary, then answer"
        )
    raise HandoffNotWaiting(f"the run is no longer waiting (now {run.get_status_display().lower()})")
