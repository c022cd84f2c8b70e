"""The guard: decide about a tool call before it runs (check: `call_check`), and a person's answer
to a run that asked for one (handoffs: `run_handoff_answer`). The check's docstring walks
through how it decides.
"""

from ingest.guard.check import (
    CHECK_CALL_ID,
    CONFIG_CACHE_SIZE,
    CONFIG_TTL_S,
    FINISHED,
    GUARD_BUDGET_S,
    GUARD_CHUNK,
    REUSE_MAX_AGE_S,
    REUSE_WINDOW,
    RUN_WIDE_KINDS,
    TEXT_KINDS,
    CallRefused,
    GuardAnswer,
    ProposedCall,
    RunNotKnown,
    call_check,
    config_cache_clear,
)
from ingest.guard.handoffs import (
    EARLIER_HANDOFFS,
    TRIED_CALLS,
    HandoffRefused,
    run_handoff_answer,
    run_handoff_resolve,
)

__all__ = [
    "CHECK_CALL_ID",
    "CONFIG_CACHE_SIZE",
    "CONFIG_TTL_S",
    "EARLIER_HANDOFFS",
    "FINISHED",
    "GUARD_BUDGET_S",
    "GUARD_CHUNK",
    "REUSE_MAX_AGE_S",
    "REUSE_WINDOW",
    "RUN_WIDE_KINDS",
    "TEXT_KINDS",
    "TRIED_CALLS",
    "CallRefused",
    "GuardAnswer",
    "HandoffRefused",
    "ProposedCall",
    "RunNotKnown",
    "call_check",
    "config_cache_clear",
    "run_handoff_answer",
    "run_handoff_resolve",
]
