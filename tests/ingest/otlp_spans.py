"""Spans made with the real opentelemetry-sdk, on a clock of our own, for the OTLP tests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

T0 = 1_795_950_000 * 10**9  # 2026-11-29T...Z in Unix nanoseconds
MS = 10**6


class Agent:
    """Writes one agent's spans with a tracer; each step moves the clock on by a millisecond, so
    the order of spans is the order of the calls below, whatever the machine's clock does."""

    def __init__(self, tracer: trace.Tracer, start_ns: int = T0) -> None:
        self.tracer = tracer
        self.clock = itertools.count(start_ns, MS)

    @contextmanager
    def span(self, name: str, attributes: dict[str, Any] | None = None) -> Iterator[trace.Span]:
        span = self.tracer.start_span(name, attributes=attributes or {}, start_time=next(self.clock))
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            try:
                yield span
            finally:
                span.end(end_time=next(self.clock))

    def leaf(self, name: str, attributes: dict[str, Any] | None = None, **kwargs: Any) -> None:
        with self.span(name, attributes) as span:
            if kwargs.get("error"):
                exc = kwargs["error"]
                span.record_exception(exc, timestamp=next(self.clock))
                span.set_status(Status(StatusCode.ERROR, str(exc)))


def provider(*exporters: SpanExporter, resource: dict[str, Any] | None = None) -> TracerProvider:
    # No atexit hook per provider: a test's provider is done with when the test is.
    tracer_provider = TracerProvider(
        resource=Resource.create(resource or {"service.name": "shop-agent"}), shutdown_on_exit=False
    )
    for exporter in exporters:
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider


def recorded(resource: dict[str, Any] | None = None) -> tuple[Agent, InMemorySpanExporter]:
    """An agent whose spans are kept in memory (to export them in one batch, or encode them)."""
    memory = InMemorySpanExporter()
    return Agent(provider(memory, resource=resource).get_tracer("tests")), memory


def request_bytes(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> bytes:
    """The ExportTraceServiceRequest the OTLP exporter sends for these spans."""
    return encode_spans(spans).SerializeToString()


# --- the three dialects -------------------------------------------------------------------------


def genai_chat(input_tokens: int = 900, output_tokens: int = 40, **extra: Any) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        **extra,
    }


def genai_tool(name: str, args: str | None = None, result: str | None = None, **extra: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.type": "function",
        **extra,
    }
    if args is not None:
        attributes["gen_ai.tool.call.arguments"] = args
    if result is not None:
        attributes["gen_ai.tool.call.result"] = result
    return attributes


def genai_agent(name: str = "shop", **extra: Any) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": name,
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        **extra,
    }
