"""OpenTelemetry spans to trace events v1. Pure Python: no Django, no clock, no I/O.

Three steps, so that the service can look the database up in between:

1. `spans_read(request)`: the export's spans as plain `SpanIn` values, attributes decoded.
2. `spans_plan(spans, sources)`: each span's role (tool, llm, agent or none) and run id, or why
   it is refused.
3. `events_build(plans, runs=…, tool_kinds=…)`: the events of each run in time order, each
   tagged with the span it came from, the spans refused while building them and the spans that
   must wait for their run (a root span exported before the trace's model and tool spans).

`span_dump` / `span_load` keep a waiting span as JSON (ingest.models.ParkedSpan).

The table of attributes read is in docs/otlp.md; keep the two together.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from ingest.schema import ERROR_CLASSES, TOOL_KINDS, EventError, check_nesting

TOOL, LLM, AGENT = "tool", "llm", "agent"

# LOOPWATCH_OTLP_RUN_ID=conversation stands for these, in this order.
CONVERSATION_ATTRIBUTES = (
    "gen_ai.conversation.id",
    "session.id",
    "traceloop.association.properties.session_id",
)
TRACE_ID = "trace_id"
_ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-/:]{0,199}$")

# A tool's result is cut at this many characters of its JSON text (result_truncated, with the sha256
# of the whole so detection still compares results): a tool that returns a page of HTML must not
# make the span's event too large to store.
RESULT_MAX_CHARS = 32 * 1024
# Run descriptions longer than the columns are cut: a name is not worth refusing a span for.
DESCRIPTION_LIMITS = {"agent": 200, "backend": 100, "model": 200, "task_type": 100}

# Which attribute says what, first present wins (docs/otlp.md has the same table).
OPERATION = "gen_ai.operation.name"
TOOL_OPERATIONS = frozenset({"execute_tool"})
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion"})
AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent", "invoke_workflow"})
OPENINFERENCE_ROLES = {"TOOL": TOOL, "LLM": LLM, "AGENT": AGENT, "CHAIN": AGENT}
TRACELOOP_ROLES = {"tool": TOOL, "agent": AGENT, "workflow": AGENT}
TOOL_NAME = ("gen_ai.tool.name", "tool.name")
TOOL_ARGS = ("gen_ai.tool.call.arguments", "tool_call.function.arguments", "input.value", "tool.parameters")
TOOL_RESULT = ("gen_ai.tool.call.result", "output.value")
TOOL_CALL_ID = ("gen_ai.tool.call.id", "tool_call.id", "tool.id")
PROVIDER = ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")
MODEL = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name", "llm.request.model")
INPUT_TOKENS = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.token_count.prompt",
    "llm.usage.prompt_tokens",
)
OUTPUT_TOKENS = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
    "llm.usage.completion_tokens",
)
AGENT_NAME = ("gen_ai.agent.name", "agent.name", "traceloop.workflow.name")
MAX_INT = 2**31 - 1

_TIMEOUT = re.compile(r"time[ _.-]?out|timed[ _-]?out|deadline", re.IGNORECASE)
# error.type / exception.type / HTTP status to error_class, first match wins.
_ERROR_CLASSES = (
    ("rate_limited", re.compile(r"rate.?limit|too.?many.?requests|throttl|\b429\b", re.I)),
    ("permission", re.compile(r"permission|forbidden|unauthori[sz]ed|access.?denied|\b40[13]\b", re.I)),
    ("not_found", re.compile(r"not.?found|no.?such|does.?not.?exist|\b404\b|\b410\b", re.I)),
    ("parse_error", re.compile(r"json|pars(e|ing)|decod|syntax", re.I)),
    (
        "invalid_argument",
        re.compile(r"invalid|validation|value.?error|type.?error|bad.?request|argument|\b4(00|22)\b", re.I),
    ),
    (
        "transient",
        re.compile(r"connection|unavailable|temporar|transient|reset|refused|overloaded|\b50[0234]\b", re.I),
    ),
)


class SpanRefused(Exception):
    """One span cannot become events; `field` names the attribute (or span field) at fault."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(slots=True)
class SpanIn:
    """One span of an export, decoded. `path` locates it in the request (for messages)."""

    path: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root span
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    resource: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    exceptions: list[dict[str, Any]]
    problem: SpanRefused | None = None
    wire_size: int = 0  # the span's protobuf size: bounds its events' size

    def first(self, keys: Iterable[str]) -> tuple[str, Any] | None:
        """(attribute, value) of the first of keys set on the span, or None."""
        attrs = self.attrs
        for key in keys:
            value = attrs.get(key)
            if value is not None and value != "":
                return key, value
        return None

    def label(self) -> str:
        return f"{self.path} (span {self.span_id or '?'} {self.name!r})"


@dataclass(slots=True)
class SpanPlan:
    """A span's role and run; `run_from_trace`: the run id is the trace id (a root span ends it)."""

    span: SpanIn
    index: int
    role: str | None = None
    run_id: str = ""
    run_from_trace: bool = False
    tool: str = ""
    problem: SpanRefused | None = None


@dataclass(frozen=True, slots=True)
class KnownRun:
    """What is stored of a run the export continues (read while the run is locked)."""

    agent: str
    backend: str
    model: str
    rounds: int  # model rounds stored: the export's new ones are numbered after them
    service: str = ""  # its service.name label: the agent's name until a span names the agent
    from_otlp: bool = True  # started by this bridge (its source label): only such runs are renamed
    started_us: int | None = None  # its started_at in Unix microseconds
    stored_rounds: frozenset[str] = frozenset()  # ids of the export's model spans already stored


@dataclass(slots=True)
class Built:
    """Events in order, each with the index of its span (None: synthesised for the run)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    span_of: list[int | None] = field(default_factory=list)
    refused: dict[int, SpanRefused] = field(default_factory=dict)
    waiting: list[int] = field(default_factory=list)  # spans whose run does not exist yet: to park
    repeated: list[int] = field(default_factory=list)  # a span already earlier in the same export


# --- the run id setting -----------------------------------------------------------------------


def run_id_sources(raw: str) -> tuple[str, ...]:
    """LOOPWATCH_OTLP_RUN_ID as attribute names in order, always ending with trace_id.

    `trace_id` (the default), `conversation` (CONVERSATION_ATTRIBUTES) or attribute names,
    comma-separated. Raises ValueError naming what is wrong.
    """
    if not raw.strip():
        raise ValueError("must not be empty (trace_id, conversation or attribute names)")
    sources: list[str] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            raise ValueError("holds an empty item")
        if item == "conversation":
            sources.extend(CONVERSATION_ATTRIBUTES)
        elif _ATTRIBUTE_NAME.match(item):
            sources.append(item)
        else:
            raise ValueError(f"{item!r} is not an attribute name")
    if TRACE_ID in sources[:-1]:
        raise ValueError(
            "trace_id must come last: the trace id is always present, what follows is never used"
        )
    if sources[-1] != TRACE_ID:
        sources.append(TRACE_ID)
    return tuple(dict.fromkeys(sources))


# --- 1. reading ---------------------------------------------------------------------------------


def _clean(text: str) -> str:
    # PostgreSQL's jsonb cannot store U+0000; a tool's output with a NUL in it is still worth keeping.
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def any_value(value: Any) -> Any:
    """An OTLP AnyValue as plain JSON: arrays as lists, key-value lists as objects, bytes as base64."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return _clean(value.string_value)
    if kind == "int_value":
        return value.int_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "double_value":
        return value.double_value
    if kind == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {_clean(kv.key): any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return None


def attributes(key_values: Iterable[Any]) -> dict[str, Any]:
    # any_value() inlined for strings, most attributes: this loop is a third of the mapping's time.
    out: dict[str, Any] = {}
    for kv in key_values:
        key, value = kv.key, kv.value
        if "\x00" in key:
            key = _clean(key)
        if value.WhichOneof("value") == "string_value":
            text = value.string_value
            out[key] = text.replace("\x00", "\ufffd") if "\x00" in text else text
        else:
            out[key] = any_value(value)
    return out


def spans_read(request: Any) -> list[SpanIn]:
    """The spans of an ExportTraceServiceRequest, in request order.

    Each protobuf field is read once: an attribute access on a message costs more than the rest
    of what is done with the value, and this loop is a third of the mapping's time."""
    spans: list[SpanIn] = []
    for r, resource_spans in enumerate(request.resource_spans):
        resource = attributes(resource_spans.resource.attributes)
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            for i, span in enumerate(scope_spans.spans):
                trace_id, span_id, parent_id = span.trace_id, span.span_id, span.parent_span_id
                start_ns, end_ns = span.start_time_unix_nano, span.end_time_unix_nano
                status = span.status
                name = span.name
                events = span.events
                exceptions = [
                    attributes(event.attributes)
                    for event in events
                    if event.name == "exception" or event.name.endswith(".exception")
                ]
                item = SpanIn(
                    path=f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]",
                    trace_id=trace_id.hex(),
                    span_id=span_id.hex(),
                    parent_id=parent_id.hex(),
                    name=_clean(name),
                    start_ns=start_ns,
                    end_ns=end_ns,
                    attrs=attributes(span.attributes),
                    resource=resource,
                    status_code=status.code,
                    status_message=_clean(status.message),
                    exceptions=exceptions,
                    problem=_span_problem(trace_id, span_id, parent_id, start_ns, end_ns),
                    wire_size=span.ByteSize(),
                )
                spans.append(item)
    return spans


def _span_problem(
    trace_id: bytes, span_id: bytes, parent_id: bytes, start_ns: int, end_ns: int
) -> SpanRefused | None:
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        return SpanRefused("traceId", f"must be 16 bytes, not all zero (got {len(trace_id)} bytes)")
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return SpanRefused("spanId", f"must be 8 bytes, not all zero (got {len(span_id)} bytes)")
    if parent_id and len(parent_id) != 8:
        return SpanRefused("parentSpanId", f"must be 8 bytes or empty (got {len(parent_id)})")
    if not start_ns:
        return SpanRefused("startTimeUnixNano", "must be set")
    if end_ns < start_ns:
        return SpanRefused("endTimeUnixNano", "must not be before startTimeUnixNano")
    if end_ns >= 253402300800 * 10**9:  # year 10000
        return SpanRefused("endTimeUnixNano", "is past the year 9999")
    return None


_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)

# The SpanIn fields a waiting span keeps (its `problem` is None: only valid spans wait).
_DUMPED = (
    *("path", "trace_id", "span_id", "parent_id", "name", "start_ns", "end_ns", "attrs", "resource"),
    *("status_code", "status_message", "exceptions", "wire_size"),
)


def span_dump(span: SpanIn) -> dict[str, Any]:
    """A span as JSON, to wait for its run (ingest.models.ParkedSpan)."""
    return {name: getattr(span, name) for name in _DUMPED}


def span_load(value: dict[str, Any]) -> SpanIn:
    return SpanIn(**{name: value[name] for name in _DUMPED})


# --- 2. planning ---------------------------------------------------------------------------------


def span_role(span: SpanIn) -> str | None:
    """tool, llm, agent or None (a span loopwatch has no use for: HTTP, database, embeddings…)."""
    attrs = span.attrs
    operation = attrs.get(OPERATION)
    if not isinstance(operation, str):
        operation = None  # a list or a number here is no operation name (and cannot be hashed)
    if operation in TOOL_OPERATIONS:
        return TOOL
    if operation in LLM_OPERATIONS:
        return LLM
    if operation in AGENT_OPERATIONS:
        return AGENT
    kind = attrs.get("openinference.span.kind")
    if isinstance(kind, str) and kind.upper() in OPENINFERENCE_ROLES:
        return OPENINFERENCE_ROLES[kind.upper()]
    kind = attrs.get("traceloop.span.kind")
    if isinstance(kind, str) and kind.lower() in TRACELOOP_ROLES:
        return TRACELOOP_ROLES[kind.lower()]
    if operation is None and (
        attrs.get("llm.request.type") in ("chat", "completion")
        or any(key in attrs for key in INPUT_TOKENS[:2] + OUTPUT_TOKENS[:2])
    ):
        return LLM  # OpenLLMetry's and older GenAI LLM spans, without gen_ai.operation.name
    return None


def tool_name(span: SpanIn) -> str:
    found = span.first(TOOL_NAME)
    if found is None and span.attrs.get("traceloop.span.kind") == "tool":
        found = span.first(("traceloop.entity.name",))
    if found is not None:
        name = found[1]
        if not isinstance(name, str):
            raise SpanRefused(found[0], f"must be a string, not {type(name).__name__}")
        field_name = found[0]
    else:
        name, field_name = span.name, "name"
        for prefix in ("execute_tool ", "gen_ai.execute_tool "):
            if name.startswith(prefix):
                name = name[len(prefix) :]
        name = name.removesuffix(".tool")
    name = name.strip()
    if not name:
        raise SpanRefused("gen_ai.tool.name", "is required on a tool span (or a span name to take it from)")
    if len(name) > 200:
        raise SpanRefused(field_name, f"must be at most 200 characters (got {len(name)})")
    return name


def spans_plan(spans: list[SpanIn], sources: tuple[str, ...]) -> list[SpanPlan]:
    """Each span's role and run id. All spans of a trace go to one run: the first source found on
    any of them (the earliest span first) names it, else the trace id."""
    plans = [SpanPlan(span=span, index=i, problem=span.problem) for i, span in enumerate(spans)]
    traces: dict[str, list[SpanPlan]] = defaultdict(list)
    for plan in plans:
        if plan.problem is None:
            traces[plan.span.trace_id].append(plan)
    for trace_id, members in traces.items():
        run_id, from_trace, problem = _run_id(trace_id, members, sources)
        for plan in members:
            plan.run_id, plan.run_from_trace, plan.problem = run_id, from_trace, problem
            if problem is not None:
                continue
            plan.role = span_role(plan.span)
            if plan.role == TOOL:
                try:
                    plan.tool = tool_name(plan.span)
                except SpanRefused as exc:
                    plan.problem = exc
    return plans


def _run_id(trace_id: str, members: list[SpanPlan], sources: tuple[str, ...]):
    ordered = sorted(members, key=lambda p: p.span.start_ns)
    for source in sources:
        if source == TRACE_ID:
            return trace_id, True, None
        for plan in ordered:
            value = plan.span.attrs.get(source)
            if value is None:
                value = plan.span.resource.get(source)
            if value is None or value == "":
                continue
            if isinstance(value, bool) or not isinstance(value, str | int):
                return (
                    "",
                    False,
                    SpanRefused(source, f"must be a string to be a run id, not {type(value).__name__}"),
                )
            run_id = str(value)
            if len(run_id) > 200:
                return (
                    "",
                    False,
                    SpanRefused(source, f"must be at most 200 characters to be a run id (got {len(run_id)})"),
                )
            return run_id, False, None
    return trace_id, True, None  # unreachable: sources end with trace_id


# --- 3. building -----------------------------------------------------------------------------------


def ts_text(ns: int) -> str:
    """Unix nanoseconds as RFC 3339 with microseconds, UTC."""
    seconds, rest = divmod(ns, 10**9)
    return f"{_second_text(seconds)}.{rest // 1000:06d}Z"


@functools.lru_cache(maxsize=4096)
def _second_text(seconds: int) -> str:
    # The spans of an export share a few seconds; formatting a datetime is most of ts_text's cost.
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _json_or_text(value: Any, key: str) -> Any:
    """An attribute holding JSON (as most instrumentations record arguments and results) parsed;
    anything else as it is. SpanRefused naming the attribute `key` when the JSON nests deeper than
    trace events may (MAX_DEPTH)."""
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "[", '"') or text in ("true", "false", "null"):
            try:
                parsed = orjson.loads(text)
            except orjson.JSONDecodeError:
                return value
            try:
                check_nesting(parsed, key)
            except EventError as exc:
                raise SpanRefused(exc.field, exc.reason) from None
            # An escaped NUL (\u0000) decodes to the character jsonb cannot store.
            return _clean_json(parsed) if "\\u0000" in text else parsed
    return value


def _clean_json(value: Any) -> Any:
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, list):
        return [_clean_json(item) for item in value]
    if isinstance(value, dict):
        return {_clean(key): _clean_json(item) for key, item in value.items()}
    return value


def _looks_like_schema(value: Any) -> bool:
    # OpenInference's tool.parameters is usually the tool's JSON Schema, not the call's arguments.
    return isinstance(value, dict) and value.get("type") == "object" and "properties" in value


def tool_args(span: SpanIn) -> tuple[dict[str, Any] | None, str]:
    """(arguments, attribute) or (None, "") when the span did not capture them (they are opt-in)."""
    attrs = span.attrs
    for key in TOOL_ARGS:
        value = attrs.get(key)
        if value is None or value == "":
            continue
        parsed = _json_or_text(value, key)
        if key == "tool.parameters" and _looks_like_schema(parsed):
            continue
        return _as_object(parsed), key
    if attrs.get("traceloop.span.kind") == "tool" and attrs.get("traceloop.entity.input"):
        parsed = _json_or_text(attrs["traceloop.entity.input"], "traceloop.entity.input")
        # OpenLLMetry records a Python call as {"args": [...], "kwargs": {...}}.
        if isinstance(parsed, dict) and parsed and set(parsed) <= {"args", "kwargs", "inputs"}:
            merged = dict(parsed.get("kwargs") or parsed.get("inputs") or {})
            if parsed.get("args"):
                merged["args"] = parsed["args"]
            parsed = merged
        return _as_object(parsed), "traceloop.entity.input"
    return None, ""


def _as_object(value: Any) -> dict[str, Any]:
    # Events carry arguments as an object; anything else is kept whole under "input".
    return value if isinstance(value, dict) else {"input": value}


def tool_result_value(span: SpanIn) -> tuple[Any, str, Any] | None:
    """(result, attribute, the attribute's raw value) or None when the span captured none."""
    found = span.first(TOOL_RESULT)
    if found is None and span.attrs.get("traceloop.span.kind") == "tool":
        found = span.first(("traceloop.entity.output",))
    if found is None:
        return None
    return _json_or_text(found[1], found[0]), found[0], found[1]


def _count(span: SpanIn, keys: tuple[str, ...]) -> int | None:
    found = span.first(keys)
    if found is None:
        return None
    key, value = found
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpanRefused(key, f"must be an integer, not {type(value).__name__}")
    if not 0 <= value <= MAX_INT:
        raise SpanRefused(key, f"must be between 0 and {MAX_INT} (got {value})")
    return value


def _string_attr(span: SpanIn, key: str, limit: int) -> str | None:
    value = span.attrs.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SpanRefused(key, f"must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise SpanRefused(key, f"must be at most {limit} characters (got {len(value)})")
    return value


def _failure(span: SpanIn) -> tuple[str, str, str] | None:
    """(status, error_class, message) of a span that failed, or None. Status ERROR or an exception
    event (unless the status says OK) is a failure; a timeout is `timeout`, not an error."""
    error_type = span.attrs.get("error.type")
    if span.status_code == 1 or (span.status_code != 2 and not span.exceptions and error_type is None):
        return None
    exception = span.exceptions[-1] if span.exceptions else {}
    kind = str(exception.get("exception.type") or error_type or "")
    message = str(exception.get("exception.message") or span.status_message or "")
    status = "timeout" if _TIMEOUT.search(kind) or (not kind and _TIMEOUT.search(message)) else "error"
    explicit = span.attrs.get("loopwatch.error_class")
    if explicit is not None:
        if explicit not in ERROR_CLASSES:
            raise SpanRefused("loopwatch.error_class", f"must be one of {', '.join(ERROR_CLASSES)}")
        error_class = explicit
    else:
        status_code = span.attrs.get("http.response.status_code")
        haystack = f"{kind} {status_code or ''} {message}"
        error_class = next((name for name, pattern in _ERROR_CLASSES if pattern.search(haystack)), "other")
    text = f"{kind}: {message}" if kind and message else kind or message or "error"
    return status, error_class, text


def _result_fields(value: Any, source: Any) -> dict[str, Any]:
    if isinstance(source, str) and len(source) <= RESULT_MAX_CHARS // 6:
        return {"result": value}  # JSON text grows at most sixfold (a control character as \uXXXX)
    text = orjson.dumps(value).decode()
    if len(text) <= RESULT_MAX_CHARS:
        return {"result": value}
    return {
        "result": text[:RESULT_MAX_CHARS],
        "result_truncated": True,
        "result_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }


def _llm_text(span: SpanIn) -> str | None:
    """The model's natural-language output, when the span captured it (clarification loops)."""
    attrs = span.attrs
    for key in ("llm.output_messages.0.message.content", "gen_ai.completion.0.content"):
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value
    messages = _json_or_text(attrs.get("gen_ai.output.messages"), "gen_ai.output.messages")
    if isinstance(messages, list):
        parts = [
            part["content"]
            for message in messages
            if isinstance(message, dict)
            for part in (message["parts"] if isinstance(message.get("parts"), list) else [])
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("content"), str)
        ]
        if parts:
            return "\n".join(parts)
    return None


def describe(plans: list[SpanPlan]) -> dict[str, str]:
    """agent, backend, model, task_type and service of a run, from its spans (agent spans first).

    A run without an agent name in its spans is named after its service (service.name) when it
    starts; a later export naming the agent renames it."""
    return {name: value for name, (value, _) in _described(plans).items()}


def _described(plans: list[SpanPlan]) -> dict[str, tuple[str, SpanPlan]]:
    """describe(), with the span each value comes from."""
    found: dict[str, tuple[str, SpanPlan]] = {}

    def put(name: str, value: Any, plan: SpanPlan) -> None:
        if name not in found and isinstance(value, str) and value.strip():
            found[name] = (value.strip()[: DESCRIPTION_LIMITS.get(name, 200)], plan)

    for plan in sorted(plans, key=lambda p: (p.role != AGENT, p.span.start_ns)):
        span, attrs = plan.span, plan.span.attrs
        if "agent" not in found:
            for key in AGENT_NAME:
                put("agent", attrs.get(key), plan)
            if plan.role == AGENT and attrs.get("traceloop.span.kind") in ("agent", "workflow"):
                put("agent", attrs.get("traceloop.entity.name"), plan)
        if "backend" not in found:
            provider = span.first(PROVIDER)
            if provider is not None and isinstance(provider[1], str):
                put("backend", provider[1].lower(), plan)
        if "model" not in found:
            model = span.first(MODEL)
            if model is not None:
                put("model", model[1], plan)
        if "task_type" not in found:
            put(
                "task_type",
                attrs.get("loopwatch.task_type") or span.resource.get("loopwatch.task_type"),
                plan,
            )
        if "service" not in found:
            service = span.resource.get("service.name")
            if isinstance(service, str) and not service.startswith("unknown_service"):
                put("service", service, plan)
    return found


def events_build(
    plans: list[SpanPlan],
    *,
    runs: dict[str, KnownRun],
    tool_kinds: dict[str, str],
    max_event_bytes: int,
) -> Built:
    """The events of the planned spans, run by run, in time order.

    Per run: a `run_started` when the run is new (or ones naming what the stored run lacks, and
    its root span's start and agent); one `model_round` per LLM span not stored yet, numbered after
    the run's stored rounds in the order the spans started; a `tool_call` (at the span's start)
    and a `tool_result` (at its end) per tool span, in the round of the last LLM span that started
    before it; a `run_finished` when the root span of a trace that is its own run ends.

    A run that does not exist and that the export has no model or tool span of cannot be started:
    its agent and root spans wait (`Built.waiting`) for the export that starts it.
    """
    built = Built()
    by_run: dict[str, list[SpanPlan]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for plan in plans:
        if plan.problem is not None:
            built.refused[plan.index] = plan.problem
            continue
        key = (plan.span.trace_id, plan.span.span_id)
        if key in seen:  # the same span twice in one request: once is enough
            built.repeated.append(plan.index)
            continue
        seen.add(key)
        by_run[plan.run_id].append(plan)
    for run_id, members in by_run.items():
        known = runs.get(run_id)
        # A trace without a model or tool call (an HTTP request of the same service, a LangChain
        # chain that never reached a model) is no run; its root span still ends a run that earlier
        # exports started, or that a later one starts: it waits for it, as agent spans do.
        members = [plan for plan in members if plan.role is not None or _ends_run(plan)]
        if not members:
            continue
        if known is None and not any(plan.role in (TOOL, LLM) for plan in members):
            built.waiting += [plan.index for plan in members]
            continue
        if not _run_events(run_id, members, known, tool_kinds, max_event_bytes, built) and known is None:
            # Every model and tool span refused: no run to start, the others wait for one.
            built.waiting += [
                p.index for p in members if p.role not in (TOOL, LLM) and p.index not in built.refused
            ]
    return built


def _responded(span: SpanIn) -> bool:
    """A failed model call that reports no usage (a 429, a timeout) brought no response: no round."""
    return span.status_code != 2 or span.first(INPUT_TOKENS + OUTPUT_TOKENS) is not None


def _ends_run(plan: SpanPlan) -> bool:
    return plan.run_from_trace and not plan.span.parent_id


def _start_key(span: SpanIn) -> tuple[int, int, str]:
    """What orders model rounds: start, then end (in microseconds, as stored), then the span id."""
    return span.start_ns // 1000, span.end_ns // 1000, span.span_id


def _run_events(
    run_id: str,
    members: list[SpanPlan],
    known: KnownRun | None,
    tool_kinds: dict[str, str],
    max_event_bytes: int,
    built: Built,
) -> bool:
    """Build one run's events into `built`; False when every span of the run was refused."""
    keyed: list[tuple[int, int, int, dict[str, Any], int | None]] = []
    if known is None:
        description = describe(members)
        first_ns = min(plan.span.start_ns for plan in members)
        started: dict[str, Any] = {
            "type": "run_started",
            "run_id": run_id,
            "ts": ts_text(first_ns),
            "event_id": "otel:run_started",
            **{k: description[k] for k in ("agent", "backend", "model", "task_type") if k in description},
            **(
                {"agent": description["service"][:200]}
                if "agent" not in description and "service" in description
                else {}
            ),
            "labels": {
                "source": "otlp",
                **({"service.name": description["service"]} if "service" in description else {}),
            },
        }
        keyed.append((first_ns, 0, -1, started, None))
    elif known.from_otlp:
        # Never for a run its runtime started itself: a second run_started would reset the budgets
        # its own one set.
        keyed += _described_events(run_id, members, known)

    # Each model span's event first (a refused span takes no number), then the numbers: after the
    # run's stored rounds, in the order the spans started. A span stored before keeps its number
    # (its event is a duplicate). The detection pass renumbers by start time across exports.
    base = known.rounds if known is not None else 0
    stored = known.stored_rounds if known is not None else frozenset()
    responses = sorted(
        (p for p in members if p.role == LLM and _responded(p.span)), key=lambda p: _start_key(p.span)
    )
    starts: list[tuple[int, int]] = []  # (start in µs, round) of the new rounds, in start order
    number = base
    for plan in responses:
        made = _add(
            built, keyed, plan, lambda p=plan: [_model_round(p, run_id, max(base, 1))], max_event_bytes
        )
        if made is None or plan.span.span_id in stored:
            continue
        number += 1
        made[0]["round"] = number
        starts.append((plan.span.start_ns // 1000, number))

    for plan in members:
        span = plan.span
        if plan.role == TOOL:
            start = span.start_ns // 1000
            number = max([r for s, r in starts if s <= start], default=max(base, 1))
            _add(
                built,
                keyed,
                plan,
                lambda p=plan, n=number: _tool_events(p, run_id, n, tool_kinds),
                max_event_bytes,
            )
        if _ends_run(plan):
            _add(built, keyed, plan, lambda p=plan: [_run_finished(p, run_id)], max_event_bytes)

    keyed.sort(key=lambda item: item[:3])
    kept = [item for item in keyed if item[4] is None or item[4] not in built.refused]
    if all(item[4] is None for item in kept):
        return False  # every span of the run refused: no run to start either
    for _, _, _, event, span_index in kept:
        built.events.append(event)
        built.span_of.append(span_index)
    return True


def _described_events(
    run_id: str, members: list[SpanPlan], known: KnownRun
) -> list[tuple[int, int, int, dict[str, Any], int | None]]:
    """run_started events of a run this bridge started, naming what it lacks (agent, backend
    `unknown`, model), one per span that names it; and the root span's, when it names another
    agent or started before the run's first event. Keyed by their span (`otel:<trace>:<span>:
    described`): sent again, a span names nothing new, or its event is a duplicate."""
    fields: dict[int, dict[str, str]] = defaultdict(dict)
    by_index = {plan.index: plan for plan in members}
    unset = {"agent": ("", known.service), "backend": ("unknown",), "model": ("",)}
    found = _described(members)
    for name, values in unset.items():
        if name in found:
            value, plan = found[name]
            current = getattr(known, name)
            if current in values and value != current:
                fields[plan.index][name] = value
    root = next((plan for plan in members if _ends_run(plan)), None)
    if root is not None:
        # The root span names the run and says when it started, whatever arrived before it: the
        # same run, whichever of its spans came first.
        agent = _described([root]).get("agent")
        if agent is not None and agent[0] != known.agent:
            fields[root.index]["agent"] = agent[0]
        if known.started_us is None or root.span.start_ns // 1000 < known.started_us:
            fields.setdefault(root.index, {})  # its start alone is worth an event
    out: list[tuple[int, int, int, dict[str, Any], int | None]] = []
    for index, named in fields.items():
        span = by_index[index].span
        event = {
            "type": "run_started",
            "run_id": run_id,
            "ts": ts_text(span.start_ns),
            "event_id": _event_id(span, "described"),
            **named,
        }
        out.append((span.start_ns, 0, -1, event, index))
    return out


# Events of one span at the same instant: the round first, then the call, its result, the run's end.
_RANK = {"model_round": 1, "tool_call": 2, "tool_result": 3, "run_finished": 4}


def _add(built: Built, keyed: list, plan: SpanPlan, make, max_event_bytes: int) -> list[dict] | None:
    """Build a span's events (returned; None when the span is refused, whole)."""
    if plan.index in built.refused:
        return None
    try:
        events = make()
        # Every field was checked as it was read (lengths, ranges, choices), so events_ingest finds
        # nothing to reject; only the size is left to check, to refuse the span whole. An event
        # holds at most what its span does, a string escaped at most sixfold.
        small = plan.span.wire_size * 6 + 4096 < max_event_bytes
        for event in events:
            if small:
                continue
            size = len(orjson.dumps(event))
            if size > max_event_bytes:
                what = "gen_ai.tool.call.arguments" if event["type"] == "tool_call" else event["type"]
                raise SpanRefused(
                    what, f"the event is {size} bytes, over the limit of {max_event_bytes} bytes"
                )
    except SpanRefused as exc:
        built.refused[plan.index] = exc
        return None
    span = plan.span
    for event in events:
        key = span.start_ns if event["type"] == "tool_call" else span.end_ns
        keyed.append((key, _RANK[event["type"]], plan.index, event, plan.index))
    return events


def _event_id(span: SpanIn, what: str) -> str:
    # Stable across redeliveries of the same span: a second export of it is a duplicate.
    return f"otel:{span.trace_id}:{span.span_id}:{what}"


def _model_round(plan: SpanPlan, run_id: str, number: int) -> dict[str, Any]:
    span = plan.span
    event: dict[str, Any] = {
        "type": "model_round",
        "run_id": run_id,
        "ts": ts_text(span.end_ns),
        "event_id": _event_id(span, "round"),
        "round": number,
        # The start orders the run's rounds (the detection pass numbers them by it): a model call
        # exported late, or by another exporter, still takes its place.
        "otel_start": ts_text(span.start_ns),
    }
    for name, keys in (("input_tokens", INPUT_TOKENS), ("output_tokens", OUTPUT_TOKENS)):
        value = _count(span, keys)
        if value is not None:
            event[name] = value
    text = _llm_text(span)
    if text is not None:
        event["text"] = text
    model = span.first(MODEL)
    if model is not None and isinstance(model[1], str):
        event["model"] = model[1]
    event["otel_span_id"] = span.span_id
    return event


def _tool_events(
    plan: SpanPlan, run_id: str, number: int, tool_kinds: dict[str, str]
) -> list[dict[str, Any]]:
    span = plan.span
    kind = span.attrs.get("loopwatch.tool.kind")
    if kind is not None and kind not in TOOL_KINDS:
        raise SpanRefused("loopwatch.tool.kind", f"must be one of {', '.join(TOOL_KINDS)}")
    call: dict[str, Any] = {
        "type": "tool_call",
        "run_id": run_id,
        "ts": ts_text(span.start_ns),
        "event_id": _event_id(span, "call"),
        "round": number,
        # The span id, not the provider's call id: unique, so a result always finds its own call even
        # when a provider reuses ids within a parallel batch; the provider's id is kept beside it.
        "call_id": span.span_id,
        "tool": plan.tool,
    }
    # The span's own word, else the registry's; else none: detection infers it (a status poll
    # nobody declared must not be judged as a call repeating itself).
    kind = kind or tool_kinds.get(plan.tool)
    if kind:
        call["kind"] = kind
    args, _source = tool_args(span)
    if args is None:
        call["args"] = {}
        call["args_captured"] = False
    else:
        call["args"] = args
    provider_id = span.first(TOOL_CALL_ID)
    if provider_id is not None:
        call["tool_call_id"] = str(provider_id[1])
    tool_type = span.attrs.get("gen_ai.tool.type")
    if isinstance(tool_type, str):
        call["tool_type"] = tool_type
    step_id = _string_attr(span, "loopwatch.step_id", 200)
    if step_id is not None:
        call["step_id"] = step_id
    operation_key = _string_attr(span, "loopwatch.operation_key", 500)
    if operation_key is not None:
        call["operation_key"] = operation_key

    result: dict[str, Any] = {
        "type": "tool_result",
        "run_id": run_id,
        "ts": ts_text(span.end_ns),
        "event_id": _event_id(span, "result"),
        "call_id": span.span_id,
        "status": "ok",
        "latency_ms": (span.end_ns - span.start_ns) / 1e6,
    }
    failure = _failure(span)
    value = tool_result_value(span)
    if failure is not None:
        result["status"], error_class, message = failure
        if result["status"] == "error":
            result["error_class"] = error_class
        if value is None:
            value = (message, "", message)
    if value is None:
        result["result_captured"] = False
    else:
        result.update(_result_fields(value[0], value[2]))
    return [call, result]


def _run_finished(plan: SpanPlan, run_id: str) -> dict[str, Any]:
    span = plan.span
    event: dict[str, Any] = {
        "type": "run_finished",
        "run_id": run_id,
        "ts": ts_text(span.end_ns),
        "event_id": _event_id(span, "finished"),
        "status": "succeeded",
    }
    failure = _failure(span)
    if failure is not None:
        event.update(status="failed", terminated_by="error", reason=failure[2])
    return event
