"""The idempotency ledger's client: claim, complete, look up, and invoke_once.

    from loopwatch_client import LedgerClient, OutcomeUnknown

    ledger = LedgerClient("http://127.0.0.1:8000", api_key)
    receipt = ledger.invoke_once("order-42:refund:v1", refund, {"order": "42", "amount": 10}, tool="refund")

`invoke_once` claims the operation, runs the tool only when the ledger says `execute`, and reports
the outcome; a repeat gets the first result back without the tool running again. A timeout is
not a failure: the effect may have happened, the operation becomes UNKNOWN and nothing runs it
again until the ledger's reconciler (or a person) has found out what happened.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from loopwatch_client._http import Transport, TransportError

logger = logging.getLogger(__name__)

# The error classes the ledger accepts on a failed completion (anything else is sent as "other").
# Only transient and rate_limited with no_side_effect=True let the operation run again; the
# definitive ones (invalid_argument, ...) make it FAILED; the rest leave it UNKNOWN.
ERROR_CLASSES = frozenset(
    {
        "transient",
        "rate_limited",
        "invalid_argument",
        "permission",
        "not_found",
        "parse_error",
        "empty_result",
        "other",
    }
)
FIRST_POLL_S = 0.05  # the first pause after a `wait`; it doubles up to max_poll_s
COMPLETE_ATTEMPTS = 3  # a completion whose answer was lost is sent again this many times in all


# --- errors ------------------------------------------------------------------------------------


class LoopwatchError(Exception):
    """Base of everything this client raises."""


class LedgerError(LoopwatchError):
    """The ledger refused a request (4xx/5xx) or could not be reached.

    `status` is the HTTP status (None when there was no answer), `error` the server's error code
    (e.g. "not_lease_holder"), `detail` its message, `body` the whole answer.
    """

    def __init__(
        self, message: str, *, status: int | None = None, body: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {}
        self.error: str = str(self.body.get("error", ""))
        self.detail: str = str(self.body.get("detail", message))


class LedgerUnavailable(LedgerError):
    """No answer from the ledger (connection refused, reset, timed out)."""


class PayloadConflict(LedgerError):
    """422: the key was claimed before with other arguments. Nothing was executed."""


class CompletionFailed(LedgerError):
    """The tool succeeded but the ledger did not take the outcome; `result` is the tool's result.

    Do not run the tool again: the operation stays RUNNING until its lease expires, then becomes
    UNKNOWN and is reconciled.
    """

    def __init__(self, message: str, *, result: Any, cause: LedgerError) -> None:
        super().__init__(message, status=cause.status, body=cause.body)
        self.result = result


class OperationOutcome(LoopwatchError):
    """The operation was not executed by this call, and there is no result to give back."""

    def __init__(self, message: str, *, key: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.body = body or {}


class OutcomeUnknown(OperationOutcome):
    """The effect may or may not have happened (a timeout, an executor that died).

    The ledger holds the operation as UNKNOWN; it is not executed again until reconciled.
    """


class StillRunning(OperationOutcome):
    """Another worker holds a live lease on the operation and did not finish within wait_timeout."""

    def __init__(
        self, message: str, *, key: str, retry_after: float, body: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, key=key, body=body)
        self.retry_after = retry_after


class OperationFailed(OperationOutcome):
    """The operation failed definitively before; `error_class` and `error` are what was reported."""

    def __init__(self, message: str, *, key: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message, key=key, body=body)
        error = self.body.get("error") or {}
        self.error_class: str = str(error.get("error_class", ""))
        self.error: Any = error.get("detail")


class OperationCompensated(OperationOutcome):
    """The operation's effect was undone by an operator; it is not executed again."""


# --- answers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """The ledger's answer to a claim.

    decision: execute | reuse | failed | wait | reconcile | compensated. `result` is set for
    reuse, `error` for failed, `retry_after` (seconds) for wait, `lease` for execute.
    """

    decision: str
    operation_key: str
    status: str
    http_status: int
    lease: dict[str, Any] | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    retry_after: float = 0.0
    body: dict[str, Any] = field(default_factory=dict, repr=False)


def _is_timeout(exc: BaseException) -> bool:
    """A timeout of the tool's own call (socket.timeout is TimeoutError; urllib may wrap it)."""
    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, TimeoutError)


def _describe(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:500]}


# --- the client --------------------------------------------------------------------------------


class LedgerClient:
    """Claim, complete and look up operations in loopwatch's ledger (API key with scope `ledger`).

    base_url is the server's root (http://host:port, or with /api/v1). worker_id names this
    executor in leases and history; by default host:pid:random, made afresh in a forked child.
    One keep-alive connection per thread; the client may be shared between threads.
    """

    def __init__(
        self, base_url: str, api_key: str, worker_id: str | None = None, timeout: float = 10
    ) -> None:
        self._transport = Transport(base_url, api_key, timeout=timeout)
        self._prefix = "/operations"
        self.timeout = timeout
        self._worker_id = worker_id
        self._auto_worker: tuple[int, str] | None = None

    @property
    def worker_id(self) -> str:
        """The executor's name in leases; generated per process unless given."""
        if self._worker_id:
            return self._worker_id
        pid = os.getpid()
        if self._auto_worker is None or self._auto_worker[0] != pid:
            self._auto_worker = (pid, f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}")
        return self._auto_worker[1]

    # --- the three calls -----------------------------------------------------------------------

    def claim(
        self,
        *,
        tool: str,
        args: dict[str, Any],
        operation_key: str | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        lease_s: float = 60,
        worker_id: str | None = None,
    ) -> Claim:
        """Claim the operation (by operation_key, or run_id + step_id) to execute it, or learn its fate.

        Returns every decision, wait and reconcile included; raises PayloadConflict on 422 and
        LedgerError on any other refusal.
        """
        body: dict[str, Any] = {
            "tool": tool,
            "args": args,
            "worker_id": worker_id or self.worker_id,
            "lease_s": lease_s,
        }
        for name, value in (("operation_key", operation_key), ("run_id", run_id), ("step_id", step_id)):
            if value is not None:
                body[name] = value
        status, answer = self._request("POST", "/claim", body)
        if status == 422:
            raise PayloadConflict(
                f"claim {operation_key or (run_id, step_id)}: {answer.get('detail', 'payload conflict')}",
                status=status,
                body=answer,
            )
        if status not in (200, 409) or "decision" not in answer:
            raise self._refused("claim", status, answer)
        return Claim(
            decision=answer["decision"],
            operation_key=answer.get("operation_key", operation_key or ""),
            status=answer.get("status", ""),
            http_status=status,
            lease=answer.get("lease"),
            result=answer.get("result"),
            error=answer.get("error"),
            retry_after=float(answer.get("retry_after") or 0.0),
            body=answer,
        )

    def complete(
        self,
        key: str,
        *,
        outcome: str,
        result: Any = None,
        error_class: str | None = None,
        external_request_id: str | None = None,
        no_side_effect: bool = False,
        worker_id: str | None = None,
    ) -> dict[str, Any]:
        """Report the outcome (succeeded | failed | timeout) as the lease holder; returns the state."""
        body: dict[str, Any] = {
            "worker_id": worker_id or self.worker_id,
            "outcome": outcome,
            "no_side_effect": no_side_effect,
        }
        if result is not None:
            body["result"] = result
        if error_class is not None:
            body["error_class"] = error_class
        if external_request_id:
            body["external_request_id"] = external_request_id
        status, answer = self._request("POST", f"/{quote(key, safe='')}/complete", body)
        if status != 200:
            raise self._refused(f"complete {key}", status, answer)
        return answer

    def get(self, key: str) -> dict[str, Any]:
        """The operation's state, result and history (LedgerError with status 404 when unknown)."""
        status, answer = self._request("GET", f"/{quote(key, safe='')}")
        if status != 200:
            raise self._refused(f"get {key}", status, answer)
        return answer

    # --- claim -> execute -> complete --------------------------------------------------------------

    def invoke_once(
        self,
        key: str,
        fn: Callable[..., Any],
        args: dict[str, Any],
        *,
        tool: str,
        lease_s: float = 60,
        wait_timeout: float = 60,
        no_side_effect_on: Iterable[type[BaseException]] = (),
        max_poll_s: float = 2.0,
        external_request_id_of: Callable[[Any], str | None] | None = None,
        on_decision: Callable[[Claim], None] | None = None,
        claim: Callable[[], Claim] | None = None,
    ) -> Any:
        """Run `fn(args, idempotency_key=key)` at most once for `key`, and return its result.

        - execute: calls fn (the key goes on to the tool, for a downstream that honours
          idempotency keys) and completes `succeeded` with its return value, which it returns;
        - a TimeoutError from fn (the effect may have happened): completes `timeout` (UNKNOWN)
          and raises OutcomeUnknown;
        - another exception: completes `failed` with the exception's `.error_class` (default
          "other"; the ledger's classes are ERROR_CLASSES) and `no_side_effect=True` when its type
          is in no_side_effect_on, then re-raises it;
        - reuse: returns the stored result without calling fn;
        - wait: another worker holds the lease; sleeps (retry_after, capped by a backoff from
          50 ms up to max_poll_s, with jitter) and claims again, until wait_timeout: StillRunning;
        - reconcile: raises OutcomeUnknown, never executes; failed: OperationFailed;
          compensated: OperationCompensated; 422: PayloadConflict; other refusals: LedgerError.

        external_request_id_of(result) may name the downstream's id of the effect, stored for
        reconcilers; on_decision(claim) sees every answer of the ledger (for logs and tests).
        claim() replaces the plain claim (the guard's check claims a write as it decides on it).
        """
        no_side_effect_types = tuple(no_side_effect_on)
        deadline = time.monotonic() + wait_timeout
        backoff = FIRST_POLL_S
        while True:
            answer = (
                claim()
                if claim is not None
                else self.claim(operation_key=key, tool=tool, args=args, lease_s=lease_s)
            )
            if on_decision is not None:
                on_decision(answer)
            if answer.decision == "execute":
                return self._execute(key, fn, args, no_side_effect_types, external_request_id_of)
            if answer.decision == "reuse":
                return answer.result
            if answer.decision == "wait":
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StillRunning(
                        f"{key}: still running under another worker's lease after {wait_timeout:g} s",
                        key=key,
                        retry_after=answer.retry_after,
                        body=answer.body,
                    )
                pause = min(answer.retry_after or backoff, backoff) * random.uniform(0.5, 1.0)
                time.sleep(min(max(pause, 0.005), left))
                backoff = min(backoff * 2, max_poll_s)
                continue
            if answer.decision == "reconcile":
                raise OutcomeUnknown(
                    f"{key}: outcome UNKNOWN ({answer.status}); not executed again until reconciled",
                    key=key,
                    body=answer.body,
                )
            if answer.decision == "failed":
                raise OperationFailed(f"{key}: failed before: {answer.error}", key=key, body=answer.body)
            if answer.decision == "compensated":
                raise OperationCompensated(f"{key}: compensated", key=key, body=answer.body)
            raise LedgerError(
                f"{key}: unexpected decision {answer.decision!r}", status=answer.http_status, body=answer.body
            )

    def _execute(
        self,
        key: str,
        fn: Callable[..., Any],
        args: dict[str, Any],
        no_side_effect_types: tuple[type[BaseException], ...],
        external_request_id_of: Callable[[Any], str | None] | None,
    ) -> Any:
        try:
            result = fn(args, idempotency_key=key)
        except Exception as exc:
            external_id = str(getattr(exc, "external_request_id", None) or "") or None
            if _is_timeout(exc):
                try:
                    self._complete_reliably(
                        key, {"UNKNOWN"}, outcome="timeout", external_request_id=external_id
                    )
                except LedgerError as ledger_exc:
                    logger.warning("%s: the ledger did not take the timeout: %s", key, ledger_exc)
                raise OutcomeUnknown(
                    f"{key}: the tool timed out; the effect may have happened (UNKNOWN)", key=key
                ) from exc
            error_class = getattr(exc, "error_class", None) or "other"
            if error_class not in ERROR_CLASSES:
                error_class = "other"
            try:
                self._complete_reliably(
                    key,
                    {"FAILED", "RETRYABLE_FAILED", "UNKNOWN"},
                    outcome="failed",
                    result=_describe(exc),
                    error_class=error_class,
                    external_request_id=external_id,
                    no_side_effect=isinstance(exc, no_side_effect_types),
                )
            except LedgerError as ledger_exc:
                exc.add_note(f"loopwatch: the ledger did not take this failure of {key}: {ledger_exc}")
            raise
        # KeyboardInterrupt and the like go through untouched: the lease expires and the operation
        # becomes UNKNOWN, which is the truth (the effect may have happened).
        external_id = external_request_id_of(result) if external_request_id_of else None
        try:
            self._complete_reliably(
                key, {"SUCCEEDED"}, outcome="succeeded", result=result, external_request_id=external_id
            )
        except LedgerError as exc:
            raise CompletionFailed(
                f"{key}: the tool succeeded but the ledger did not take it: {exc}", result=result, cause=exc
            ) from exc
        return result

    def _complete_reliably(self, key: str, landed: set[str], **body: Any) -> dict[str, Any]:
        """complete(), sent again when its answer was lost; a refusal after a lost answer is checked
        against the stored state (the first attempt may have landed: then the status is in `landed`)."""
        lost: LedgerUnavailable | None = None
        for attempt in range(COMPLETE_ATTEMPTS):
            try:
                return self.complete(key, **body)
            except LedgerUnavailable as exc:
                lost = exc
                time.sleep(0.1 * 2**attempt)
            except LedgerError as exc:
                if lost is None or exc.status != 409:
                    raise
                state = self.get(key)
                if state.get("status") in landed and state.get("lease_owner") == self.worker_id:
                    return state
                raise
        assert lost is not None
        raise lost

    # --- HTTP ------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict]:
        try:
            data = json.dumps(body, allow_nan=False).encode() if body is not None else None
        except (TypeError, ValueError) as exc:  # a result the ledger cannot store: say so, send nothing
            raise LedgerError(f"{method} {self._prefix}{path}: body is not JSON: {exc}") from exc
        try:
            return self._transport.request(method, self._prefix + path, data)
        except TransportError as exc:
            raise LedgerUnavailable(str(exc)) from exc

    @staticmethod
    def _refused(what: str, status: int, answer: dict[str, Any]) -> LedgerError:
        detail = answer.get("detail") or answer.get("error") or "no detail"
        return LedgerError(f"{what}: HTTP {status}: {detail}", status=status, body=answer)
