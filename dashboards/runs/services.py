"""A person's answer to a run waiting for one, through the guard (which owns the run's states)."""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.runs.selectors import handoff_time
from ingest.guard import HandoffRefused
from ingest.guard import run_handoff_answer as guard_answer
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
    try:
        # A handoff without its "at" (none the guard writes) is answered whatever it says.
        run = guard_answer(
            run=run, resume=resume, by=user.get_username(), note=note.strip(), shown_at=shown_at or None
        )
    except HandoffRefused as refused:
        raise HandoffNotWaiting(refused.describe(handoff_time_text)) from None
    if resume:
        return HandoffAnswered(run, f"{run.run_id}: resumed — checks decide again.")
    return HandoffAnswered(run, f"{run.run_id}: stopped — every check now answers terminate.")
