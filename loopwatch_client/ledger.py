"""The idempotency ledger's client: claim, renew, complete, release, look up, and invoke_once.

    from loopwatch_client import LedgerClient, OutcomeUnknown

    ledger = LedgerClient("http://127.0.0.1:8000", api_key)
    receipt = ledger.invoke_once("order-42:refund:v1", refund, {"order": "42", "amount": 10}, tool="refund")

`invoke_once` claims the operation (a new attempt, with its own attempt id and fencing token),
runs the tool only when the ledger says `execute`, renews the attempt's lease from a heartbeat
thread while the tool runs, and reports the outcome with the token; a repeat gets the first result
back without the tool running again. A timeout is not a failure: the effect may have happened, the
operation becomes UNKNOWN and nothing runs it again until the ledger's reconciler (or a person)
has found out what happened.

Deadlines (docs/client.md): no call blocks its caller longer than the client's `timeout`, retries
included. What missed its deadline and must still reach the ledger (a completion, the release of
a claim whose answer never came) is sent later from a daemon thread.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import socket
import threading
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
FIRST_RETRY_S = 0.05  # the first pause before a request whose answer was lost is sent again
# 5xx a proxy answers when the ledger itself did not: the request may or may not have landed.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
# A report that missed its caller's deadline is sent later for the lease plus this long at most:
# past it the ledger's reconciler (or a person) has the question.
LATE_REPORT_HORIZON_S = 300.0
MAX_LATE_REPORTS = 1000  # waiting at once; the oldest is dropped (and logged) past it


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
    """No answer from the ledger (connection refused, reset, timed out, or a 502/503/504).

    `may_have_landed`: False only when the request cannot have reached the ledger.
    """

    may_have_landed = True


class PayloadConflict(LedgerError):
    """422: the key was claimed before with other arguments. Nothing was executed."""


class CompletionFailed(LedgerError):
    """The tool succeeded but the ledger did not take the outcome; `result` is the tool's result.

    Do not run the tool again. The completion is sent again from a daemon thread until it lands
    (a late completion of the attempt is accepted); if it never does, the lease runs out, the
    operation becomes UNKNOWN and is reconciled.
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
    reuse, `error` for failed, `retry_after` (seconds) for wait, `lease` for execute (owner,
    expires_at, attempt = the fencing token, attempt_id).
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

    @property
    def attempt(self) -> int | None:
        """The fencing token of an `execute` (None for other decisions, or an older server)."""
        value = (self.lease or {}).get("attempt")
        return value if isinstance(value, int) else None


def _is_timeout(exc: BaseException) -> bool:
    """A timeout of the tool's own call (socket.timeout is TimeoutError; urllib may wrap it)."""
    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, TimeoutError)


def _describe(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:500]}


# --- the client --------------------------------------------------------------------------------

_WORKER_ID_LOCK = threading.Lock()


class LedgerClient:
    """Claim, renew, complete and look up operations in loopwatch's ledger (API key with scope
    `ledger`).

    base_url is the server's root (http://host:port, or with /api/v1). worker_id names this
    executor in leases and history; by default host:pid:random, made afresh in a forked child.
    Ownership of a claim is an attempt's, not the worker's: threads sharing a client (and its
    worker_id) never both execute one key. One keep-alive connection per thread; the client may
    be shared between threads.

    timeout: the most any one call (claim, renew, complete, release, get) blocks its caller, in
    seconds, retries of a lost answer included. renew: whether invoke_once renews the lease from
    a heartbeat thread while the tool runs (every lease_s / 3).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        worker_id: str | None = None,
        timeout: float = 10,
        *,
        renew: bool = True,
    ) -> None:
        self._transport = Transport(base_url, api_key, timeout=timeout)
        self._prefix = "/operations"
        self.timeout = timeout
        self.renew_leases = renew
        self._worker_id = worker_id
        self._auto_worker: tuple[int, str] | None = None
        self._late = _LateReports(self)

    @property
    def worker_id(self) -> str:
        """The executor's name in leases; generated per process unless given (under a lock: two
        threads asking first must not make two names, one of which would then not be the holder)."""
        if self._worker_id:
            return self._worker_id
        pid = os.getpid()
        auto = self._auto_worker
        if auto is None or auto[0] != pid:
            with _WORKER_ID_LOCK:
                auto = self._auto_worker
                if auto is None or auto[0] != pid:
                    auto = self._auto_worker = (pid, f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}")
        return auto[1]

    @property
    def late_reports(self) -> int:
        """Reports (completions, releases) that missed their deadline and are still being sent."""
        return self._late.pending

    # --- the calls -------------------------------------------------------------------------------

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
        attempt_id: str | None = None,
        timeout: float | None = None,
    ) -> Claim:
        """Claim the operation (by operation_key, or run_id + step_id) to execute it, or learn its fate.

        attempt_id: this attempt's id (one per attempt, never shared); sent again after a lost
        answer, it gets the same lease back instead of a `wait`. One request, at most `timeout`
        (default: the client's). Returns every decision, wait and reconcile included; raises
        PayloadConflict on 422, LedgerUnavailable without an answer, LedgerError on any other
        refusal.
        """
        body: dict[str, Any] = {
            "tool": tool,
            "args": args,
            "worker_id": worker_id or self.worker_id,
            "lease_s": lease_s,
        }
        for name, value in (
            ("operation_key", operation_key),
            ("run_id", run_id),
            ("step_id", step_id),
            ("attempt_id", attempt_id),
        ):
            if value is not None:
                body[name] = value
        status, answer = self._request("POST", "/claim", body, timeout=timeout)
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
        attempt: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Report the outcome (succeeded | failed | timeout) as the holder of `attempt` (the claim's
        fencing token; a stale one is refused with 409 stale_attempt); returns the state. One
        request, at most `timeout`."""
        body: dict[str, Any] = {
            "worker_id": worker_id or self.worker_id,
            "outcome": outcome,
            "no_side_effect": no_side_effect,
        }
        if attempt is not None:
            body["attempt"] = attempt
        if result is not None:
            body["result"] = result
        if error_class is not None:
            body["error_class"] = error_class
        if external_request_id:
            body["external_request_id"] = external_request_id
        status, answer = self._request("POST", f"/{quote(key, safe='')}/complete", body, timeout=timeout)
        if status != 200:
            raise self._refused(f"complete {key}", status, answer)
        return answer

    def renew(
        self,
        key: str,
        *,
        attempt: int,
        lease_s: float = 60,
        worker_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """The holder of `attempt` is still at work: its lease runs lease_s from now. Returns the
        lease; 409 (LedgerError, error stale_attempt or not_lease_holder) when it holds it no more."""
        body = {"worker_id": worker_id or self.worker_id, "attempt": attempt, "lease_s": lease_s}
        status, answer = self._request("POST", f"/{quote(key, safe='')}/renew", body, timeout=timeout)
        if status != 200:
            raise self._refused(f"renew {key}", status, answer)
        return answer

    def release(
        self,
        key: str,
        *,
        attempt_id: str | None = None,
        attempt: int | None = None,
        worker_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Give a claim back without having run the tool: the operation may run again (no person
        needed). By attempt_id (all that is known of a claim whose answer never came) or attempt."""
        body: dict[str, Any] = {"worker_id": worker_id or self.worker_id}
        if attempt_id is not None:
            body["attempt_id"] = attempt_id
        if attempt is not None:
            body["attempt"] = attempt
        status, answer = self._request("POST", f"/{quote(key, safe='')}/release", body, timeout=timeout)
        if status != 200:
            raise self._refused(f"release {key}", status, answer)
        return answer

    def get(self, key: str, *, timeout: float | None = None) -> dict[str, Any]:
        """The operation's state, result and history (LedgerError with status 404 when unknown)."""
        status, answer = self._request("GET", f"/{quote(key, safe='')}", timeout=timeout)
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
        claim: Callable[[str, float], Claim] | None = None,
        claim_timeout: float | None = None,
    ) -> Any:
        """Run `fn(args, idempotency_key=key)` at most once for `key`, and return its result.

        - execute: calls fn (the key goes on to the tool, for a downstream that honours
          idempotency keys) while a heartbeat thread renews the lease every lease_s / 3, and
          completes `succeeded` with its return value and the attempt's fencing token;
        - a TimeoutError from fn (the effect may have happened): completes `timeout` (UNKNOWN)
          and raises OutcomeUnknown;
        - another exception: completes `failed` with the exception's `.error_class` (default
          "other"; the ledger's classes are ERROR_CLASSES) and `no_side_effect=True` when its type
          is in no_side_effect_on, then re-raises it;
        - reuse: returns the stored result without calling fn;
        - wait: another attempt holds the lease (another worker, or another thread of this one);
          sleeps (retry_after, capped by a backoff from 50 ms up to max_poll_s, with jitter) and
          claims again, until wait_timeout: StillRunning;
        - reconcile: raises OutcomeUnknown, never executes; failed: OperationFailed;
          compensated: OperationCompensated; 422: PayloadConflict; other refusals: LedgerError.

        Deadlines: each claim within claim_timeout (default: the client's timeout; a lost answer
        is asked again by the same attempt within it; when it runs out, LedgerUnavailable, and a
        claim that may have landed is given back from a daemon thread so that no UNKNOWN is left
        for a person); waiting on another attempt within wait_timeout; the completion within
        timeout (then CompletionFailed, or the tool's own exception, while the report is sent
        later). So: at most claim_timeout + wait_timeout before fn runs, and timeout after.

        external_request_id_of(result) may name the downstream's id of the effect, stored for
        reconcilers; on_decision(claim) sees every answer of the ledger (for logs and tests).
        claim(attempt_id, deadline) replaces the plain claim (the guard's check claims a write as
        it decides on it).
        """
        no_side_effect_types = tuple(no_side_effect_on)
        attempt_id = uuid.uuid4().hex  # this attempt's, for every claim it sends (lost answers too)
        deadline = time.monotonic() + wait_timeout
        backoff = FIRST_POLL_S

        def plain(attempt: str, before: float) -> Claim:
            return self.claim(
                operation_key=key,
                tool=tool,
                args=args,
                lease_s=lease_s,
                attempt_id=attempt,
                timeout=before - time.monotonic(),
            )

        while True:
            answer = self._claim_within(
                key,
                attempt_id,
                claim or plain,
                self.timeout if claim_timeout is None else claim_timeout,
                lease_s,
            )
            if on_decision is not None:
                on_decision(answer)
            if answer.decision == "execute":
                return self._execute(
                    key, fn, args, answer.attempt, lease_s, no_side_effect_types, external_request_id_of
                )
            if answer.decision == "reuse":
                return answer.result
            if answer.decision == "wait":
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StillRunning(
                        f"{key}: still running under another attempt's lease after {wait_timeout:g} s",
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

    def _claim_within(
        self,
        key: str,
        attempt_id: str,
        send: Callable[[str, float], Claim],
        budget_s: float,
        lease_s: float,
    ) -> Claim:
        """send(attempt_id, deadline) until it is answered or the budget is spent. An answer that
        was lost is asked for again by the same attempt (the ledger gives its lease back). Out of
        time after a claim that may have landed: it is released later, and LedgerUnavailable."""
        deadline = time.monotonic() + budget_s
        pause = FIRST_RETRY_S
        while True:
            try:
                return send(attempt_id, deadline)
            except LedgerUnavailable as exc:
                if time.monotonic() + pause < deadline:
                    time.sleep(pause * random.uniform(0.5, 1.0))
                    pause *= 2
                    continue
                if exc.may_have_landed:
                    self._late.add(
                        f"release of {key} (attempt {attempt_id})",
                        functools.partial(self.release, key, attempt_id=attempt_id, worker_id=self.worker_id),
                        horizon_s=lease_s + LATE_REPORT_HORIZON_S,
                        gone_is_done=True,
                    )
                raise

    def _execute(
        self,
        key: str,
        fn: Callable[..., Any],
        args: dict[str, Any],
        attempt: int | None,
        lease_s: float,
        no_side_effect_types: tuple[type[BaseException], ...],
        external_request_id_of: Callable[[Any], str | None] | None,
    ) -> Any:
        heartbeat = (
            _Heartbeat(self, key, attempt, lease_s) if self.renew_leases and attempt is not None else None
        )
        try:
            result = fn(args, idempotency_key=key)
        except Exception as exc:
            if heartbeat is not None:
                heartbeat.stop()
            external_id = str(getattr(exc, "external_request_id", None) or "") or None
            if _is_timeout(exc):
                try:
                    self._complete_reliably(
                        key,
                        {"UNKNOWN"},
                        attempt,
                        lease_s,
                        outcome="timeout",
                        external_request_id=external_id,
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
                    attempt,
                    lease_s,
                    outcome="failed",
                    result=_describe(exc),
                    error_class=error_class,
                    external_request_id=external_id,
                    no_side_effect=isinstance(exc, no_side_effect_types),
                )
            except LedgerError as ledger_exc:
                exc.add_note(f"loopwatch: the ledger did not take this failure of {key}: {ledger_exc}")
            raise
        except BaseException:
            # KeyboardInterrupt and the like go through untouched: the lease expires and the
            # operation becomes UNKNOWN, which is the truth (the effect may have happened).
            if heartbeat is not None:
                heartbeat.stop()
            raise
        if heartbeat is not None:
            heartbeat.stop()
        external_id = external_request_id_of(result) if external_request_id_of else None
        try:
            self._complete_reliably(
                key,
                {"SUCCEEDED"},
                attempt,
                lease_s,
                outcome="succeeded",
                result=result,
                external_request_id=external_id,
            )
        except LedgerError as exc:
            raise CompletionFailed(
                f"{key}: the tool succeeded but the ledger did not take it: {exc}", result=result, cause=exc
            ) from exc
        return result

    def _complete_reliably(
        self, key: str, landed: set[str], attempt: int | None, lease_s: float, **body: Any
    ) -> dict[str, Any]:
        """complete() within the client's timeout, sent again when its answer was lost; a refusal
        after a lost answer is checked against the stored state (the first one may have landed:
        then the status is in `landed`). Out of time: it is sent later, and LedgerUnavailable."""
        deadline = time.monotonic() + self.timeout
        worker_id = self.worker_id
        pause = FIRST_RETRY_S
        lost: LedgerUnavailable | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                return self.complete(key, attempt=attempt, worker_id=worker_id, timeout=left, **body)
            except LedgerUnavailable as exc:
                lost = exc
                time.sleep(max(0.0, min(pause * random.uniform(0.5, 1.0), deadline - time.monotonic())))
                pause *= 2
            except LedgerError as exc:
                if lost is None or exc.status != 409:
                    raise
                state = self.get(key, timeout=max(0.0, deadline - time.monotonic()))
                mine = state.get("lease_owner") == worker_id and attempt in (None, state.get("attempts"))
                if state.get("status") in landed and mine:
                    return state
                raise
        assert lost is not None
        self._late.add(
            f"completion of {key} ({body.get('outcome')})",
            functools.partial(self.complete, key, attempt=attempt, worker_id=worker_id, **body),
            horizon_s=lease_s + LATE_REPORT_HORIZON_S,
        )
        raise lost

    # --- HTTP ------------------------------------------------------------------------------------

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> tuple[int, dict]:
        try:
            data = json.dumps(body, allow_nan=False).encode() if body is not None else None
        except (TypeError, ValueError) as exc:  # a result the ledger cannot store: say so, send nothing
            raise LedgerError(f"{method} {self._prefix}{path}: body is not JSON: {exc}") from exc
        if timeout is not None and timeout <= 0:
            raise LedgerUnavailable(f"{method} {self._prefix}{path}: no time left before the deadline")
        try:
            status, answer = self._transport.request(method, self._prefix + path, data, timeout=timeout)
        except TransportError as exc:
            error = LedgerUnavailable(str(exc))
            error.may_have_landed = exc.may_have_landed
            raise error from exc
        if status in UNAVAILABLE_STATUSES:
            detail = answer.get("detail") or answer.get("error") or "no detail"
            raise LedgerUnavailable(
                f"{method} {self._prefix}{path}: HTTP {status}: {detail}", status=status, body=answer
            )
        return status, answer

    @staticmethod
    def _refused(what: str, status: int, answer: dict[str, Any]) -> LedgerError:
        detail = answer.get("detail") or answer.get("error") or "no detail"
        return LedgerError(f"{what}: HTTP {status}: {detail}", status=status, body=answer)


class _Heartbeat:
    """Renews an attempt's lease every lease_s / 3 from a daemon thread while its tool runs. A
    renewal without an answer is tried again at the next beat (the lease outlasts two of them);
    one the ledger refuses (the attempt no longer holds the operation) stops the heartbeat."""

    def __init__(self, client: LedgerClient, key: str, attempt: int, lease_s: float) -> None:
        self.client, self.key, self.attempt, self.lease_s = client, key, attempt, lease_s
        self.lost = ""
        self._stop = threading.Event()
        self._worker_id = client.worker_id
        threading.Thread(target=self._run, name="loopwatch-lease", daemon=True).start()

    def _run(self) -> None:
        every = max(self.lease_s / 3, 0.2)
        while not self._stop.wait(every):
            try:
                self.client.renew(
                    self.key,
                    attempt=self.attempt,
                    lease_s=self.lease_s,
                    worker_id=self._worker_id,
                    timeout=min(self.client.timeout, every),
                )
            except LedgerUnavailable:
                continue
            except LedgerError as exc:
                if not self._stop.is_set():
                    self.lost = exc.detail
                    logger.warning(
                        "%s: the lease of attempt %s was not renewed: %s", self.key, self.attempt, exc.detail
                    )
                return

    def stop(self) -> None:
        # Not joined: a renewal in flight must not hold up the agent (one landing after the
        # completion is refused by the ledger, harmlessly).
        self._stop.set()


@dataclass
class _Report:
    what: str
    send: Callable[..., Any]  # send(timeout=...)
    give_up_at: float
    gone_is_done: bool
    due: float = 0.0
    pause: float = FIRST_RETRY_S


class _LateReports:
    """Reports that missed their caller's deadline (a completion, the release of a claim whose
    answer never came), sent from one daemon thread per process until they land, the ledger
    refuses them, or their horizon passes: the ledger hears the truth late rather than never."""

    def __init__(self, client: LedgerClient) -> None:
        self._client = client
        self._reports: list[_Report] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._reports)

    def add(
        self, what: str, send: Callable[..., Any], *, horizon_s: float, gone_is_done: bool = False
    ) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._reports.clear()  # a forked child: the parent sends its own reports
                self._thread = None
            if len(self._reports) >= MAX_LATE_REPORTS:
                dropped = self._reports.pop(0)
                logger.warning("loopwatch: too many late reports; %s is dropped", dropped.what)
            self._reports.append(_Report(what, send, time.monotonic() + horizon_s, gone_is_done))
            if self._thread is None or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="loopwatch-late", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._reports:
                    self._thread = None
                    return
                now = time.monotonic()
                due = [r for r in self._reports if r.due <= now]
                next_due = min(r.due for r in self._reports)
            for report in due:
                self._send(report)
            self._wake.clear()
            self._wake.wait(max(0.0, next_due - time.monotonic()) if not due else 0.0)

    def _send(self, report: _Report) -> None:
        done = True
        try:
            report.send(timeout=self._client.timeout)
            logger.info("loopwatch: %s landed late", report.what)
        except LedgerUnavailable:
            done = time.monotonic() >= report.give_up_at
            if done:
                logger.warning("loopwatch: %s never reached the ledger; gave up", report.what)
        except LedgerError as exc:
            if not (report.gone_is_done and exc.status in (404, 409)):
                logger.warning("loopwatch: the ledger refused the late %s: %s", report.what, exc.detail)
        with self._lock:
            if done:
                self._reports.remove(report)
            else:
                report.due = time.monotonic() + report.pause * random.uniform(0.5, 1.0)
                report.pause = min(report.pause * 2, 10.0)
