"""A generated run as an OpenTelemetry trace: what an agent instrumented with the GenAI semantic
conventions would export to `POST /v1/traces` (OTLP/JSON).

One trace per run (the server's default LOOPWATCH_OTLP_RUN_ID=trace_id makes it one run): an
`invoke_agent` root span that ends last, a `chat` span per model round and an `execute_tool` span
per tool call, with loopwatch's own attributes for what the conventions do not say (the task type,
a tool's kind, a write's operation key). Spans are stamped when they are sent, each starting after
the one before it (rounds are numbered by start time), so a run's spans may go in several exports.
What OTLP cannot carry is left out: user messages, budgets, cost (the server prices the tokens).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from demo.simulation import Event, SimRun

OTLP_PATH = "/v1/traces"
SCOPE = {"name": "loopwatch-demo", "version": "1"}
STATUS_ERROR = 2
MAX_LLM_MS = 30_000.0


@dataclass
class Span:
    """One span before it is stamped: what it says and how long it took."""

    span_id: str
    name: str
    attributes: dict[str, Any]
    duration_ms: float
    error: tuple[str, str] | None = None  # (exception.type, exception.message) of a failed span


@dataclass
class OtlpRun:
    """A generated run's spans in sending order (the root last) and the clock of their starts."""

    scenario: str
    trace_id: str
    root_id: str
    service: str
    spans: list[Span]
    first_start_ns: int = 0
    last_start_ns: int = 0
    stamped: int = field(default=0)

    @property
    def run_id(self) -> str:
        return self.trace_id


def _id(seed: str, n: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def _json(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def otlp_run(sim: SimRun) -> OtlpRun:
    """The spans of a generated run (pure: the same run gives the same spans and ids)."""
    started = sim.events[0]
    agent, backend, model = started["agent"], started["backend"], started["model"]
    common = {"gen_ai.agent.name": agent, "loopwatch.task_type": started["task_type"]}
    results: dict[str, deque[Event]] = defaultdict(deque)
    for event in sim.events:
        if event["type"] == "tool_result":
            results[event["call_id"]].append(event)
    spans: list[Span] = []
    finished: Event = sim.events[-1]
    for event in sim.events:
        n = len(spans) + 1
        span_id = _id(f"{sim.run_id}:{n}", 16)
        if event["type"] == "model_round":
            attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": backend,
                "gen_ai.request.model": model,
                "gen_ai.usage.input_tokens": event["input_tokens"],
                "gen_ai.usage.output_tokens": event["output_tokens"],
                **common,
            }
            if event.get("text"):
                message = [{"role": "assistant", "parts": [{"type": "text", "content": event["text"]}]}]
                attributes["gen_ai.output.messages"] = _json(message)
            duration = min(MAX_LLM_MS, 300.0 + event["output_tokens"] * 8.0)
            spans.append(Span(span_id, f"chat {model}", attributes, duration))
        elif event["type"] == "tool_call":
            result = results[event["call_id"]].popleft()
            spans.append(_tool_span(span_id, event, result, common))
        elif event["type"] == "run_finished":
            finished = event
    root_attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": backend,
        "gen_ai.request.model": model,
        **common,
    }
    root_id = _id(f"{sim.run_id}:root", 16)
    error = None
    if finished.get("status") == "failed":
        error = ("AgentError", str(finished.get("reason") or "the run failed"))
    spans.append(Span(root_id, f"invoke_agent {agent}", root_attributes, 0.0, error))
    return OtlpRun(sim.scenario, _id(sim.run_id, 32), root_id, agent, spans)


def _tool_span(span_id: str, call: Event, result: Event, common: dict[str, Any]) -> Span:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call["tool"],
        "gen_ai.tool.call.id": call["call_id"],
        "gen_ai.tool.call.arguments": _json(call["args"]),
        "loopwatch.tool.kind": call["kind"],
        **common,
    }
    for key in ("operation_key", "step_id"):
        if call.get(key):
            attributes[f"loopwatch.{key}"] = call[key]
    if "result" in result:
        attributes["gen_ai.tool.call.result"] = _json(result["result"])
    error = None
    if result["status"] == "timeout":
        error = ("TimeoutError", f"{call['tool']} timed out")
    elif result["status"] == "error":
        attributes["loopwatch.error_class"] = result.get("error_class") or "other"
        error = ("ToolError", _json(result.get("result", "")))
    return Span(
        span_id, f"execute_tool {call['tool']}", attributes, float(result.get("latency_ms") or 1.0), error
    )


def span_stamp(run: OtlpRun, span: Span, now_ns: int) -> dict[str, Any]:
    """The span in OTLP/JSON, ending now: it starts its duration ago, but never before the run's
    previous span started (the order of starts is the order of rounds and calls)."""
    if span.span_id == run.root_id:
        start = run.first_start_ns - 1_000_000 if run.first_start_ns else now_ns - 1_000_000
    else:
        start = max(run.last_start_ns + 1_000, now_ns - int(span.duration_ms * 1e6))
        run.first_start_ns = run.first_start_ns or start
        run.last_start_ns = start
    end = max(now_ns, start + 1_000)
    out: dict[str, Any] = {
        "traceId": run.trace_id,
        "spanId": span.span_id,
        "name": span.name,
        "kind": 1,  # INTERNAL
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": _attributes(span.attributes),
    }
    if span.span_id != run.root_id:
        out["parentSpanId"] = run.root_id
    if span.error is not None:
        kind, message = span.error
        out["status"] = {"code": STATUS_ERROR, "message": message[:500]}
        out["events"] = [
            {
                "name": "exception",
                "timeUnixNano": str(end),
                "attributes": _attributes({"exception.type": kind, "exception.message": message[:2000]}),
            }
        ]
    run.stamped += 1
    return out


def export_body(spans: list[tuple[OtlpRun, dict[str, Any]]]) -> dict[str, Any]:
    """An ExportTraceServiceRequest in OTLP/JSON: the stamped spans, one resource per agent."""
    by_service: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run, span in spans:
        by_service[run.service].append(span)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes({"service.name": service})},
                "scopeSpans": [{"scope": SCOPE, "spans": items}],
            }
            for service, items in by_service.items()
        ]
    }


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            wrapped: dict[str, Any] = {"boolValue": value}
        elif isinstance(value, int):
            wrapped = {"intValue": str(value)}
        elif isinstance(value, float):
            wrapped = {"doubleValue": value}
        else:
            wrapped = {"stringValue": str(value)}
        out.append({"key": key, "value": wrapped})
    return out
