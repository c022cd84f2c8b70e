"""Agents that ask the guard before each tool call: generated runs played through
loopwatch_client's Guard against a running server.

A generated run is a script: its model rounds, its tool calls with the results they will get, how
it ends. `GuardedAgent` plays it as an agent runtime with the client would: each tool is a function
decorated with `guard.tool(...)`, so every call is checked first (POST /api/v1/runs/{id}/check) and
traced by the guard's Tracer; writes go through the ledger (claimed, executed once, completed).
What the guard says changes the run: `reuse` gives the last result back without calling the tool,
`correct` skips the call (the hint would go to the model), `handoff` leaves the run waiting for a
person (the "runs waiting" queue), `terminate` ends it. A write that times out stays UNKNOWN in
the ledger for the reconciler or a person.
"""

from __future__ import annotations

import inspect
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from demo.simulation import Event, SimRun
from loopwatch_client import (
    Guard,
    HandoffRequested,
    LedgerClient,
    LoopDetected,
    LoopwatchError,
    RunTerminated,
    Tracer,
)

CHECK_TIMEOUT_S = 10.0  # the demo server may be busy ingesting: a check waits, rather than runs unchecked
THINK_S = (0.2, 0.9)  # a model round's wait, at a set rate (none at --rate 0)
RUN_FIELDS = ("agent", "task_type", "backend", "model", "labels", "budgets")


class ToolFailed(Exception):
    """A tool that answered with an error (what the generated result says)."""

    def __init__(self, error_class: str, result: Any) -> None:
        super().__init__(f"{error_class}: {result}")
        self.error_class = error_class


def _tool_function(result: Event, args: dict[str, Any]) -> Callable[..., Any]:
    """A tool taking exactly these arguments (the guard reads them by parameter name) whose call
    gives the generated result: its value, a ToolFailed, or a TimeoutError."""

    def tool(**kwargs: Any) -> Any:
        if result["status"] == "timeout":
            raise TimeoutError("the downstream did not answer in time")
        if result["status"] == "error":
            raise ToolFailed(result.get("error_class") or "other", result.get("result"))
        return result.get("result")

    parameters = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in args]
    parameters.append(inspect.Parameter("idempotency_key", inspect.Parameter.KEYWORD_ONLY, default=None))
    tool.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return tool


def script_of(sim: SimRun) -> list[tuple[str, Event, Event | None]]:
    """The run's steps in order: ("round", model_round), ("user", user_message), ("call",
    tool_call, its tool_result), ("finish", run_finished). A result is the next one of its call id."""
    pending: dict[str, list[Event]] = {}
    steps: list[tuple[str, Event, Event | None]] = []
    for event in sim.events[1:]:
        kind = event["type"]
        if kind == "tool_call":
            entry: tuple[str, Event, Event | None] = ("call", event, None)
            steps.append(entry)
            pending.setdefault(event["call_id"], []).append(event)
        elif kind == "tool_result":
            call = pending[event["call_id"]].pop(0)
            index = next(i for i, step in enumerate(steps) if step[1] is call)
            steps[index] = ("call", call, event)
        elif kind == "model_round":
            steps.append(("round", event, None))
        elif kind == "user_message":
            steps.append(("user", event, None))
        elif kind == "run_finished":
            steps.append(("finish", event, None))
    return steps


class GuardedAgent(threading.Thread):
    """Takes generated runs from `runs` and plays each through the guard until `stop` is set and
    the queue is empty; `outcomes` counts how runs ended (shared by the agents, under `lock`)."""

    def __init__(
        self,
        url: str,
        key: str,
        runs: queue.Queue[SimRun],
        *,
        name: str,
        paced: bool,
        seed: int,
        outcomes: Counter[str],
        lock: threading.Lock,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.runs = runs
        self.paced = paced
        self.rng = random.Random(seed)
        self.outcomes = outcomes
        self.lock = lock
        self.stop = stop
        self.tracer = Tracer(url, key, flush_interval=0.2)
        ledger = LedgerClient(url, key, worker_id=name, timeout=CHECK_TIMEOUT_S)
        self.guard = Guard(url, key, tracer=self.tracer, ledger=ledger, timeout=CHECK_TIMEOUT_S)
        self.error: BaseException | None = None
        self.aborted = threading.Event()  # simulate was interrupted: leave the run where it is

    def run(self) -> None:
        try:
            while not (self.stop.is_set() and self.runs.empty()):
                try:
                    sim = self.runs.get(timeout=0.2)
                except queue.Empty:
                    continue
                try:
                    outcome = self.play(sim)
                finally:
                    self.runs.task_done()
                with self.lock:
                    self.outcomes[outcome] += 1
                    self.outcomes[f"scenario:{sim.scenario}"] += 1
        except BaseException as exc:  # shown by simulate; the thread must not die silently
            self.error = exc
        finally:
            self.tracer.close()

    def play(self, sim: SimRun) -> str:
        """Play one run; returns how it ended: finished, handoff or terminated."""
        started = sim.events[0]
        fields = {k: started[k] for k in RUN_FIELDS if k in started}
        fields["labels"] = {**fields.get("labels", {}), "sim_via": "guard"}
        try:
            with self.guard.run(sim.run_id, **fields) as trace:
                for kind, event, result in script_of(sim):
                    if self.aborted.is_set():
                        # Unfinished, as a runtime that was stopped leaves it: marked finished here
                        # so that leaving guard.run() sends no run_finished (it would say succeeded).
                        trace.finished = True
                        return "interrupted"
                    if kind == "round":
                        self._think()
                        trace.model_round(
                            input_tokens=event["input_tokens"],
                            output_tokens=event["output_tokens"],
                            cost_usd=event.get("cost_usd"),
                            text=event.get("text"),
                        )
                    elif kind == "user":
                        trace.user_message(event["text"])
                    elif kind == "call" and result is not None:
                        self._call(sim, event, result)
                    elif kind == "finish":
                        reason = event.get("reason")
                        trace.finish(
                            event["status"],
                            terminated_by=event.get("terminated_by"),
                            budget_type=event.get("budget_type"),
                            reason=reason,
                        )
        except HandoffRequested:
            return "handoff"  # the run waits for a person: nothing more is sent for it
        except RunTerminated:
            return "terminated"
        return "finished"

    def _call(self, sim: SimRun, call: Event, result: Event) -> None:
        args = call["args"]
        key = call.get("operation_key") or f"{sim.run_id}:{call.get('step_id') or call['tool']}"
        tool = self.guard.tool(call["tool"], kind=call["kind"], key=lambda _args: key)(
            _tool_function(result, args)
        )
        try:
            tool(**args)
        except (HandoffRequested, RunTerminated):
            raise
        except LoopDetected:
            pass  # correct: the hint goes to the model instead of a result; the script goes on
        except (ToolFailed, TimeoutError, LoopwatchError):
            pass  # the model sees the error (or the ledger's answer) and goes on

    def _think(self) -> None:
        if self.paced and not self.stop.is_set():
            time.sleep(self.rng.uniform(*THINK_S))
