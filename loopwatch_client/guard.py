"""Ask loopwatch before a tool runs: decorators for an agent's tools.

    guard = Guard("http://127.0.0.1:8000", api_key)          # key scopes: ingest (+ ledger for writes)

    @guard.tool(kind="read")
    def search_orders(customer: str, status: str = "open") -> dict: ...

    @guard.tool(kind="write", key=lambda args: f"order-{args['order']}:refund")
    def refund(order: str, amount: int, idempotency_key: str | None = None) -> dict: ...

    with guard.run(agent="shop", backend="openai", model="gpt-4o") as run:
        run.model_round(input_tokens=900, output_tokens=40)
        try:
            search_orders("42")
        except LoopDetected as stop:
            ...  # give stop.hint to the model (correct), ask a person (handoff), end (terminate)

Each call of a decorated tool inside `guard.run(...)` is checked first (POST /runs/{id}/check):
allow → it runs; reuse → the cached result is returned and the tool does not run; correct,
handoff, terminate → LoopDetected (HandoffRequested, RunTerminated) with the hint and the
diagnosis. A write goes through the ledger (LedgerClient.invoke_once, the check being its claim):
executed at most once per key. Every call is traced (a call that was stopped without a result, a
reused one with the result given back) through the guard's Tracer.

When loopwatch cannot answer the check (down, slow past `timeout`, or refusing it), a read (poll,
other) runs anyway — the agent must not stop because its watcher is down — and
`stats["unavailable"]` counts it (with a warning in the log); after no answer, reads run unchecked
for RETRY_CHECKS_AFTER_S without asking. A write raises LedgerUnavailable instead: without the
ledger it could happen twice (and a claim that landed anyway is given back: nobody is left
wondering whether it ran).

`timeout` is the one deadline of a check, the flush of the run's buffered events included
(docs/client.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from loopwatch_client._http import Transport, TransportError
from loopwatch_client.ledger import (
    ERROR_CLASSES,
    Claim,
    LedgerClient,
    LedgerUnavailable,
    LoopwatchError,
    PayloadConflict,
)
from loopwatch_client.tracer import RunTrace, Tracer, now_ts

__all__ = ["Decision", "Guard", "HandoffRequested", "LoopDetected", "RunTerminated"]

logger = logging.getLogger(__name__)

UNAVAILABLE_LOG_EVERY_S = 10.0
# After a check that got no answer, reads run unchecked this long without asking: an agent must
# not pay a timeout per tool call while loopwatch is down.
RETRY_CHECKS_AFTER_S = 5.0
# The share of a check's deadline the flush of the run's buffered events may take: the check
# itself keeps the rest.
FLUSH_SHARE = 0.5
KINDS = ("read", "write", "poll", "other")


class LoopDetected(LoopwatchError):
    """loopwatch said not to run the call: `decision` is correct, handoff or terminate.

    `hint` is what to tell the model; `diagnosis` (terminate) is the structured reason, like
    {"terminated_by": "budget", "budget_type": "max_tool_calls", "limit": 50, "consumed": 50, ...};
    `handoff` (handoff) what happened and what was tried; `detections` the engine's findings;
    `tool` and `tool_args` the call that was not run (`args` is the exception's own: its message).
    """

    def __init__(self, decision: Decision, *, tool: str, args: dict[str, Any]) -> None:
        super().__init__(f"{tool}: {decision.decision}: {decision.hint}")
        self.decision = decision.decision
        self.hint = decision.hint
        self.diagnosis = decision.diagnosis
        self.handoff = decision.handoff
        self.detections = decision.detections
        self.tool = tool
        self.tool_args = args


class HandoffRequested(LoopDetected):
    """The run waits for a person (loopwatch marked it so); every further call is refused too."""


class RunTerminated(LoopDetected):
    """The run must end; `diagnosis` says why."""


@dataclass(frozen=True)
class Decision:
    """loopwatch's answer to a check (see POST /api/v1/runs/{run_id}/check)."""

    decision: str
    hint: str = ""
    run_known: bool = False
    detections: list[dict[str, Any]] = field(default_factory=list)
    diagnosis: dict[str, Any] | None = None
    handoff: dict[str, Any] | None = None
    reuse: dict[str, Any] | None = None
    ledger: dict[str, Any] | None = None

    @classmethod
    def from_answer(cls, body: dict[str, Any]) -> Decision:
        return cls(
            decision=str(body.get("decision", "")),
            hint=str(body.get("hint", "")),
            run_known=bool(body.get("run_known", False)),
            detections=list(body.get("detections") or []),
            diagnosis=body.get("diagnosis"),
            handoff=body.get("handoff"),
            reuse=body.get("reuse"),
            ledger=body.get("ledger"),
        )


_STOPS = {"correct": LoopDetected, "handoff": HandoffRequested, "terminate": RunTerminated}


class Guard:
    """Checks and traces the calls of decorated tools, for the run opened with `run()`.

    tracer: the Tracer to send events through (one is made for base_url/api_key when not given);
    ledger: the LedgerClient for writes (likewise); timeout: the deadline of a check in seconds,
    the flush of the run's buffered events included, before the call goes on unchecked (reads)
    or fails (writes); on_decision(tool, decision) sees every answer (for logs and metrics).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        tracer: Tracer | None = None,
        ledger: LedgerClient | None = None,
        timeout: float = 2.0,
        lease_s: float = 60.0,
        on_decision: Callable[[str, Decision], None] | None = None,
    ) -> None:
        self.on_decision = on_decision
        self._transport = Transport(base_url, api_key, timeout=timeout)
        self.tracer = tracer or Tracer(base_url, api_key)
        self.ledger = ledger or LedgerClient(base_url, api_key)
        self.lease_s = lease_s
        self._run: contextvars.ContextVar[RunTrace | None] = contextvars.ContextVar(
            "loopwatch_run", default=None
        )
        self._stats = dict.fromkeys(
            (
                "checks",
                "allow",
                "reuse",
                "correct",
                "handoff",
                "terminate",
                "write",
                "unavailable",
                "unguarded",
            ),
            0,
        )
        self._last_unavailable_log = 0.0
        self._skip_until = 0.0

    @property
    def stats(self) -> dict[str, int]:
        """Checks made, decisions by name (write: decided by the ledger), unavailable (a read run
        unchecked: loopwatch did not answer, or the check could not be sent), unguarded (a call
        outside any run)."""
        return dict(self._stats)

    # --- runs -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def run(self, run_id: str | None = None, **fields: Any) -> Iterator[RunTrace]:
        """Open a run (run_started with fields) for the decorated tools called inside.

        On leaving: run_finished succeeded, or truncated after RunTerminated, or failed after
        another exception — unless the body called run.finish() itself. A HandoffRequested leaves
        the run open: it waits for a person.
        """
        trace = self.tracer.start_run(run_id, **fields)
        token = self._run.set(trace)
        try:
            yield trace
        except HandoffRequested:
            raise
        except RunTerminated as stop:
            diagnosis = stop.diagnosis or {}
            terminated_by = diagnosis.get("terminated_by")
            trace.finish(
                "truncated",
                terminated_by=terminated_by if terminated_by in ("budget", "loop") else "loop",
                budget_type=diagnosis.get("budget_type") or None,
                reason=stop.hint[:500],
            )
            raise
        except BaseException as exc:
            trace.finish("failed", terminated_by="error", reason=f"{type(exc).__name__}: {exc}"[:500])
            raise
        else:
            trace.finish("succeeded")
        finally:
            self._run.reset(token)

    @property
    def current_run(self) -> RunTrace | None:
        return self._run.get()

    # --- the check ----------------------------------------------------------------------------------

    def check(
        self,
        run: RunTrace,
        tool: str,
        args: dict[str, Any],
        *,
        kind: str,
        ts: str | None = None,
        operation_key: str | None = None,
        lease_s: float | None = None,
        attempt_id: str | None = None,
        deadline: float | None = None,
    ) -> Decision:
        """loopwatch's decision about a call; raises LoopwatchError when there is no answer.

        The run's events still in the tracer's buffer are sent first (when loopwatch is answering):
        the decision must see the result of the call before this one. All of it by `deadline` (a
        time.monotonic() value; default: `timeout` from now), the flush taking at most half.
        attempt_id: a write's attempt (see LedgerClient.invoke_once).
        """
        deadline = time.monotonic() + self._transport.timeout if deadline is None else deadline
        if self.tracer.healthy:
            self.tracer.flush(timeout=max(0.0, (deadline - time.monotonic()) * FLUSH_SHARE))
        body: dict[str, Any] = {"tool": tool, "kind": kind, "args": args, "ts": ts or now_ts()}
        if run.round:
            body["round"] = run.round
        if kind == "write":
            body.update(
                operation_key=operation_key, worker_id=self.ledger.worker_id, lease_s=lease_s or self.lease_s
            )
            if attempt_id:
                body["attempt_id"] = attempt_id
        try:
            data = json.dumps(body, default=str, allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise LoopwatchError(f"check {tool}: the arguments are not JSON: {exc}") from exc
        self._stats["checks"] += 1
        left = deadline - time.monotonic()
        if left <= 0:
            raise LedgerUnavailable(f"check {tool}: no time left before the deadline")
        try:
            status, answer = self._transport.request(
                "POST", f"/runs/{quote(run.run_id, safe='')}/check", data, timeout=left
            )
        except TransportError as exc:
            unavailable = LedgerUnavailable(f"check {tool}: {exc}")
            unavailable.may_have_landed = exc.may_have_landed
            raise unavailable from exc
        if status != 200:
            detail = answer.get("detail") or answer.get("error") or "no detail"
            error = LedgerUnavailable if status >= 500 else LoopwatchError
            raise error(f"check {tool}: HTTP {status}: {detail}")
        decision = Decision.from_answer(answer)
        if self.on_decision is not None:
            self.on_decision(tool, decision)
        return decision

    # --- decorators -------------------------------------------------------------------------------

    def tool(
        self,
        name: str | None = None,
        *,
        kind: str = "read",
        key: str | Callable[[dict[str, Any]], str] | None = None,
        lease_s: float | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate a tool: checked before it runs, traced, and for a write run through the ledger.

        name: the tool's name (default: the function's); kind: read, write, poll or other;
        key (writes, required): the idempotency key, a format string over the arguments
        ("order-{order}:refund") or a function of the arguments' dict. A write's function gets
        the key as `idempotency_key` when it has such a parameter (pass it on downstream).
        The arguments are the call's, by parameter name (defaults not filled in); they must be
        JSON (anything else is sent as its str()).
        """
        if kind not in KINDS:
            raise ValueError(f"kind: must be one of {', '.join(KINDS)}")
        if kind == "write" and key is None:
            raise ValueError(
                "key: a write needs its idempotency key (a format string or a function of the args)"
            )

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            tool_name = name or fn.__name__
            signature = inspect.signature(fn)
            takes_key = "idempotency_key" in signature.parameters

            @functools.wraps(fn)
            def guarded(*a: Any, **kw: Any) -> Any:
                run = self._run.get()
                if run is None:
                    self._stats["unguarded"] += 1
                    return fn(*a, **kw)
                bound = signature.bind(*a, **kw)
                args = {k: v for k, v in bound.arguments.items() if k != "idempotency_key"}
                if kind == "write":
                    return self._write(run, tool_name, fn, a, kw, args, key, lease_s, takes_key)
                return self._read(run, tool_name, kind, fn, a, kw, args)

            guarded.__wrapped__ = fn
            return guarded

        return decorate

    def _read(
        self,
        run: RunTrace,
        tool: str,
        kind: str,
        fn: Callable[..., Any],
        a: tuple,
        kw: dict[str, Any],
        args: dict[str, Any],
    ) -> Any:
        ts = now_ts()
        if time.monotonic() < self._skip_until:
            self._stats["unavailable"] += 1
            return self._execute(run, tool, kind, fn, a, kw, args, ts=ts)
        try:
            decision = self.check(run, tool, args, kind=kind, ts=ts)
        except LoopwatchError as exc:
            if isinstance(exc, LedgerUnavailable):
                self._skip_until = time.monotonic() + RETRY_CHECKS_AFTER_S
            self._unavailable(tool, exc)
            return self._execute(run, tool, kind, fn, a, kw, args, ts=ts)
        self._stats[decision.decision] = self._stats.get(decision.decision, 0) + 1
        stop = _STOPS.get(decision.decision)
        if stop is not None:
            # The model did propose it: traced without a result, so the engine counts the attempt.
            run.tool_call(tool, args, kind=kind, ts=ts, guard=decision.decision)
            raise stop(decision, tool=tool, args=args)
        if decision.decision == "reuse" and decision.reuse is not None:
            result = decision.reuse.get("result")
            call_id = run.tool_call(tool, args, kind=kind, ts=ts, guard="reuse")
            run.tool_result(call_id, "ok", result, reused_from=decision.reuse.get("call_id"))
            return result
        return self._execute(run, tool, kind, fn, a, kw, args, ts=ts)

    def _execute(
        self,
        run: RunTrace,
        tool: str,
        kind: str,
        fn: Callable[..., Any],
        a: tuple,
        kw: dict[str, Any],
        args: dict[str, Any],
        *,
        ts: str,
        operation_key: str | None = None,
    ) -> Any:
        call_id = run.tool_call(tool, args, kind=kind, ts=ts, operation_key=operation_key)
        started = time.perf_counter()
        try:
            result = fn(*a, **kw)
        except BaseException as exc:
            latency = round((time.perf_counter() - started) * 1000, 3)
            if isinstance(exc, TimeoutError):
                run.tool_result(call_id, "timeout", _describe(exc), latency_ms=latency)
            elif isinstance(exc, Exception):
                error_class = getattr(exc, "error_class", None)
                run.tool_result(
                    call_id,
                    "error",
                    _describe(exc),
                    error_class=error_class if error_class in ERROR_CLASSES else "other",
                    latency_ms=latency,
                )
            raise
        run.tool_result(call_id, "ok", result, latency_ms=round((time.perf_counter() - started) * 1000, 3))
        return result

    def _write(
        self,
        run: RunTrace,
        tool: str,
        fn: Callable[..., Any],
        a: tuple,
        kw: dict[str, Any],
        args: dict[str, Any],
        key: str | Callable[[dict[str, Any]], str] | None,
        lease_s: float | None,
        takes_key: bool,
    ) -> Any:
        operation_key = key.format(**args) if isinstance(key, str) else key(args)  # type: ignore[misc]
        ts = now_ts()

        def claim(attempt_id: str, deadline: float) -> Claim:
            # The check is the claim: the engine may stop the write, else the ledger decides.
            decision = self.check(
                run,
                tool,
                args,
                kind="write",
                ts=ts,
                operation_key=operation_key,
                lease_s=lease_s,
                attempt_id=attempt_id,
                deadline=deadline,
            )
            self._stats["write"] += 1
            stop = _STOPS.get(decision.decision)
            if stop is not None:
                # Not traced: a traced write is an execution in the ledger's account, and this one
                # did not happen.
                self._stats[decision.decision] += 1
                raise stop(decision, tool=tool, args=args)
            ledger = decision.ledger or {}
            if decision.decision == "conflict":
                raise PayloadConflict(f"{operation_key}: {decision.hint}", status=422, body=ledger)
            return Claim(
                decision=decision.decision,
                operation_key=operation_key,
                status=str(ledger.get("status", "")),
                http_status=200,
                lease=ledger.get("lease"),
                result=ledger.get("result"),
                error=ledger.get("error"),
                retry_after=float(ledger.get("retry_after") or 0.0),
                body=ledger,
            )

        def execute(_args: dict[str, Any], idempotency_key: str) -> Any:
            call_kw = {**kw, "idempotency_key": idempotency_key} if takes_key else kw
            return self._execute(
                run, tool, "write", fn, a, call_kw, args, ts=now_ts(), operation_key=operation_key
            )

        return self.ledger.invoke_once(
            operation_key,
            execute,
            args,
            tool=tool,
            lease_s=lease_s or self.lease_s,
            claim=claim,
            claim_timeout=self._transport.timeout,
        )

    def _unavailable(self, tool: str, exc: Exception) -> None:
        self._stats["unavailable"] += 1
        now = time.monotonic()
        if now - self._last_unavailable_log >= UNAVAILABLE_LOG_EVERY_S:
            self._last_unavailable_log = now
            logger.warning(
                "loopwatch did not answer the check of %s (%s): running it unchecked (%d so far)",
                tool,
                exc,
                self._stats["unavailable"],
            )


def _describe(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:500]}
