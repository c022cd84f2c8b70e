"""Trace events to loopwatch from a background thread, without ever holding up the agent.

    tracer = Tracer("http://127.0.0.1:8000", api_key)
    run = tracer.start_run(agent="shop", backend="openai", model="gpt-4o")
    run.model_round(input_tokens=900, output_tokens=40)
    call_id = run.tool_call("search_orders", {"customer": "42"}, kind="read")
    run.tool_result(call_id, "ok", {"orders": []})
    run.finish("succeeded")
    tracer.close()

`emit` stamps each event with an `event_id` (and a `ts` when it has none) and puts it in a bounded
buffer; a daemon thread sends the buffer in batches to POST /api/v1/events. A batch whose answer is
lost is sent again: the server counts an (run_id, event_id) pair once, so redelivery is harmless.
When loopwatch is down the thread retries with exponential backoff and jitter while the buffer
fills; once it is full new events are dropped, counted in `stats` and logged, and `emit` still
returns at once.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import random
import threading
import time
import uuid
import weakref
from collections import deque
from datetime import UTC, datetime
from typing import Any

from loopwatch_client._http import Transport, TransportError

__all__ = ["RunTrace", "Tracer"]

logger = logging.getLogger(__name__)

# Answers after which the same batch is sent again (the server or a proxy could not take it now).
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
DROP_LOG_EVERY_S = 10.0  # a warning about drops at most this often (the count is in stats)
FIRST_BACKOFF_S = 0.2


def now_ts() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Tracer:
    """Batches trace events to loopwatch in a background thread (API key with the `ingest` scope).

    batch_size events (or max_batch_bytes) per POST, sent when that many are waiting or every
    flush_interval seconds; at most max_buffer events wait (those being sent included); timeout is
    per request; backoff after a failure doubles from 0.2 s up to max_backoff_s, with full jitter.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        batch_size: int = 200,
        max_batch_bytes: int = 1 << 20,
        flush_interval: float = 0.5,
        max_buffer: int = 10_000,
        timeout: float = 5.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        if batch_size < 1 or max_buffer < batch_size:
            raise ValueError("batch_size: must be at least 1 and at most max_buffer")
        self._transport = Transport(base_url, api_key, timeout=timeout)
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self.max_backoff_s = max_backoff_s
        # event_id = this tracer's random prefix + a counter: unique without a uuid per event.
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count(1)
        self._buffer: deque[bytes] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._sending = 0  # events of the batch in flight (still in the buffer)
        self._flush_requested = False
        self._closed = False
        self._stop = threading.Event()  # set by close(): cuts a backoff short
        self._stats = dict.fromkeys(
            ("emitted", "sent", "duplicate", "rejected", "dropped", "retries", "batches"), 0
        )
        self._last_error = ""
        self._healthy = True  # the last request got an answer
        self._dropped_since_log = 0
        self._last_drop_log = 0.0
        self._thread = threading.Thread(target=self._run, name="loopwatch-tracer", daemon=True)
        self._thread.start()
        # Deliver what is left when the interpreter exits (briefly: never hold up an exit for long).
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- the agent's side: never blocks ----------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> bool:
        """Queue one trace event (stamped with event_id and ts when missing). False when dropped."""
        if not isinstance(event, dict):
            self._drop(1, f"event not a dict: {type(event).__name__}")
            return False
        event = dict(event)
        event.setdefault("event_id", f"{self._id_prefix}-{next(self._ids)}")
        event.setdefault("ts", now_ts())
        try:
            data = json.dumps(event, default=str, allow_nan=False, separators=(",", ":")).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            self._drop(1, f"event not JSON: {exc}")
            return False
        with self._lock:
            if self._closed or len(self._buffer) >= self.max_buffer:
                reason = "tracer closed" if self._closed else f"buffer full ({self.max_buffer} events)"
                self._drop_locked(1, reason)
                return False
            self._buffer.append(data)
            self._stats["emitted"] += 1
            if len(self._buffer) - self._sending >= self.batch_size:
                self._wake.notify()
        return True

    def start_run(self, run_id: str | None = None, **fields: Any) -> RunTrace:
        """Emit run_started (fields: agent, task_type, backend, model, budgets, labels) and return
        the run's helper."""
        return RunTrace(self, run_id or uuid.uuid4().hex, **fields)

    @property
    def stats(self) -> dict[str, Any]:
        """emitted, sent (accepted), duplicate, rejected (invalid, by the server), dropped (buffer
        full, not JSON, refused for good, left at close), retries, batches, buffered, last_error."""
        with self._lock:
            return {**self._stats, "buffered": len(self._buffer), "last_error": self._last_error}

    @property
    def healthy(self) -> bool:
        """Whether the last request to loopwatch was answered (a flush is then worth waiting for)."""
        return self._healthy

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything emitted so far was sent (or dropped); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._flush_requested = True
            self._wake.notify()
            while self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._idle.wait(left)
            return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered, then stop, all within `timeout` seconds; what is left is counted
        as dropped (a batch still in flight then is the sender thread's, a daemon)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return
        self.flush(timeout)
        with self._lock:
            self._closed = True
            left = len(self._buffer) - self._sending
            if left:
                for _ in range(left):
                    self._buffer.pop()
                self._drop_locked(left, "tracer closed before they were sent")
            self._stop.set()
            self._wake.notify()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._transport.close()

    # --- the sender thread -------------------------------------------------------------------------

    def _run(self) -> None:
        """1. Wait for a full batch, a flush, the interval or close.
        2. Send the oldest events (they stay in the buffer while in flight).
        3. Delivered, or refused for good: take them out. No answer, or 5xx/429: wait (backoff with
           jitter) and send the same batch again.
        """
        backoff = FIRST_BACKOFF_S
        while True:
            with self._lock:
                deadline = time.monotonic() + self.flush_interval
                while not self._closed and not self._flush_requested and len(self._buffer) < self.batch_size:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                if not self._buffer:
                    self._flush_requested = False
                    self._idle.notify_all()
                    if self._closed:
                        return
                    continue
                batch = self._take()
                self._sending = len(batch)
            delivered = self._send(batch)
            with self._lock:
                self._sending = 0
                if delivered:
                    for _ in range(len(batch)):
                        self._buffer.popleft()
                    backoff = FIRST_BACKOFF_S
                    if not self._buffer:
                        self._flush_requested = False
                        self._idle.notify_all()
                    continue
                self._stats["retries"] += 1
                if self._closed:
                    if self._buffer:
                        self._drop_locked(len(self._buffer), "tracer closed before they were sent")
                        self._buffer.clear()
                    self._idle.notify_all()
                    return
                pause = random.uniform(0, backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
            # Not on _wake: new events must not cut a backoff short (that would hammer a server
            # that is down); only close() does.
            self._stop.wait(pause)

    def _take(self) -> list[bytes]:
        batch, size = [], 2
        for data in itertools.islice(self._buffer, self.batch_size):
            if batch and size + len(data) + 1 > self.max_batch_bytes:
                break
            batch.append(data)
            size += len(data) + 1
        return batch

    def _send(self, batch: list[bytes]) -> bool:
        """True when the batch is done with (delivered, or refused in a way retrying cannot fix)."""
        body = b"[" + b",".join(batch) + b"]"
        try:
            status, answer = self._transport.request("POST", "/events", body)
        except TransportError as exc:
            self._healthy = False
            self._note_error(str(exc))
            return False
        self._healthy = status < 500
        self._stats["batches"] += 1
        if status in (200, 207, 422):
            self._count_verdicts(answer, len(batch))
            return True
        if status == 413 and len(batch) > 1:
            # Too big together: send the halves one after the other (the first half goes now).
            half = len(batch) // 2
            return self._send(batch[:half]) and self._send(batch[half:])
        if status in RETRY_STATUSES:
            self._note_error(f"HTTP {status}: {answer.get('detail', '')}")
            return False
        # 400/401/403/413 of one event...: sending it again cannot succeed.
        with self._lock:
            self._drop_locked(len(batch), f"refused: HTTP {status}: {answer.get('detail', '')}")
        return True

    def _count_verdicts(self, answer: dict[str, Any], size: int) -> None:
        accepted = int(answer.get("accepted", 0))
        duplicate = int(answer.get("duplicate", 0))
        rejected = int(answer.get("rejected", 0))
        with self._lock:
            self._stats["sent"] += accepted
            self._stats["duplicate"] += duplicate
            self._stats["rejected"] += rejected
            if accepted + duplicate + rejected != size:
                self._last_error = (
                    f"the server answered for {accepted + duplicate + rejected} of {size} events"
                )
        if rejected:
            for verdict in answer.get("results", []):
                if verdict.get("status") == "rejected":
                    logger.warning("loopwatch rejected an event: %s", verdict.get("error"))
                    break

    def _note_error(self, message: str) -> None:
        with self._lock:
            self._last_error = message
        logger.debug("loopwatch tracer: %s (will retry)", message)

    def _drop(self, count: int, reason: str) -> None:
        with self._lock:
            self._drop_locked(count, reason)

    def _drop_locked(self, count: int, reason: str) -> None:
        self._stats["dropped"] += count
        self._last_error = reason
        self._dropped_since_log += count
        now = time.monotonic()
        if now - self._last_drop_log >= DROP_LOG_EVERY_S:
            logger.warning(
                "loopwatch tracer dropped %d event(s): %s (%d dropped in all)",
                self._dropped_since_log,
                reason,
                self._stats["dropped"],
            )
            self._dropped_since_log, self._last_drop_log = 0, now


def _close_at_exit(ref: weakref.ref[Tracer]) -> None:
    tracer = ref()
    if tracer is not None:
        tracer.close(timeout=2.0)


class RunTrace:
    """One run's events, with its run_id and current round filled in."""

    def __init__(self, tracer: Tracer, run_id: str, **fields: Any) -> None:
        self.tracer = tracer
        self.run_id = run_id
        self.round = 0
        self.finished = False
        self._calls = itertools.count(1)
        self.emit("run_started", **fields)

    def emit(self, event_type: str, **fields: Any) -> bool:
        event = {"type": event_type, "run_id": self.run_id}
        event.update((k, v) for k, v in fields.items() if v is not None)
        return self.tracer.emit(event)

    def user_message(self, text: str, **extra: Any) -> None:
        self.emit("user_message", text=text, **extra)

    def model_round(
        self,
        round: int | None = None,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float | None = None,
        text: str | None = None,
        **extra: Any,
    ) -> int:
        """A model response; round defaults to the next one. Returns the round."""
        self.round = round if round is not None else self.round + 1
        self.emit(
            "model_round",
            round=self.round,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=cost_usd,
            text=text,
            **extra,
        )
        return self.round

    def tool_call(
        self,
        tool: str,
        args: dict[str, Any],
        *,
        kind: str | None = None,
        call_id: str | None = None,
        round: int | None = None,
        step_id: str | None = None,
        operation_key: str | None = None,
        **extra: Any,
    ) -> str:
        """Emit a tool_call; returns its call_id (generated when not given)."""
        call_id = call_id or f"{self.run_id[:40]}-c{next(self._calls)}"
        self.emit(
            "tool_call",
            round=round or max(self.round, 1),
            call_id=call_id,
            tool=tool,
            kind=kind,
            args=args,
            step_id=step_id,
            operation_key=operation_key,
            **extra,
        )
        return call_id

    def tool_result(
        self,
        call_id: str,
        status: str = "ok",
        result: Any = None,
        *,
        error_class: str | None = None,
        latency_ms: float | None = None,
        external_request_id: str | None = None,
        **extra: Any,
    ) -> None:
        self.emit(
            "tool_result",
            call_id=call_id,
            status=status,
            result=result,
            error_class=error_class,
            latency_ms=latency_ms,
            external_request_id=external_request_id,
            **extra,
        )

    def finish(
        self,
        status: str = "succeeded",
        *,
        terminated_by: str | None = None,
        budget_type: str | None = None,
        reason: str | None = None,
    ) -> None:
        if self.finished:
            return
        self.finished = True
        self.emit(
            "run_finished", status=status, terminated_by=terminated_by, budget_type=budget_type, reason=reason
        )
