"""loopwatch's client for agent runtimes: stdlib only, importable without Django.

- `Tracer` sends trace events in batches from a background thread, never holding up the agent;
- `Guard` checks each call of a decorated tool before it runs (`@guard.tool(kind=...)`) and
  raises `LoopDetected` when loopwatch says not to run it;
- `LedgerClient.invoke_once` runs a write at most once per idempotency key.

    from loopwatch_client import Guard, LoopDetected

    guard = Guard("http://127.0.0.1:8000", api_key)

    @guard.tool(kind="read")
    def search_orders(customer: str) -> dict: ...

    with guard.run(agent="shop", backend="openai", model="gpt-4o") as run:
        run.model_round(input_tokens=900, output_tokens=40)
        search_orders("42")
"""

from loopwatch_client.guard import Decision, Guard, HandoffRequested, LoopDetected, RunTerminated
from loopwatch_client.ledger import (
    ERROR_CLASSES,
    Claim,
    CompletionFailed,
    LedgerClient,
    LedgerError,
    LedgerUnavailable,
    LoopwatchError,
    OperationCompensated,
    OperationFailed,
    OutcomeUnknown,
    PayloadConflict,
    StillRunning,
)
from loopwatch_client.tracer import RunTrace, Tracer

__all__ = [
    "ERROR_CLASSES",
    "Claim",
    "CompletionFailed",
    "Decision",
    "Guard",
    "HandoffRequested",
    "LedgerClient",
    "LedgerError",
    "LedgerUnavailable",
    "LoopDetected",
    "LoopwatchError",
    "OperationCompensated",
    "OperationFailed",
    "OutcomeUnknown",
    "PayloadConflict",
    "RunTerminated",
    "RunTrace",
    "StillRunning",
    "Tracer",
]
