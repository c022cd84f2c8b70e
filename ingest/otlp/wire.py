"""The OTLP/HTTP envelope for traces: what a request may be, and how to answer it. No Django.

Per the OTLP/HTTP specification: protobuf (`application/x-protobuf`) or JSON (`application/json`)
bodies, optionally `Content-Encoding: gzip` (or `deflate`, which the Python exporter offers);
success is an ExportTraceServiceResponse (with `partial_success` when spans were refused), failure
a `google.rpc.Status`, both in the request's encoding.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF, JSON = "protobuf", "json"
MEDIA_TYPES = {
    "application/x-protobuf": PROTOBUF,
    "application/protobuf": PROTOBUF,
    "application/json": JSON,
}
CONTENT_TYPES = {PROTOBUF: "application/x-protobuf", JSON: "application/json"}

# google.rpc.Code for the HTTP statuses this endpoint answers.
GRPC_CODES = {400: 3, 401: 16, 403: 7, 405: 12, 413: 8, 415: 3, 429: 8, 500: 13}


class OtlpError(Exception):
    """A request refused whole: an HTTP status, a short code, and `field: reason`."""

    def __init__(self, status: int, code: str, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.status = status
        self.code = code
        self.field = field
        self.reason = reason


def encoding_of(content_type: str) -> str:
    """protobuf or json, or OtlpError(415)."""
    media = content_type.split(";")[0].strip().lower()
    encoding = MEDIA_TYPES.get(media)
    if encoding is None:
        raise OtlpError(
            415,
            "unsupported_media_type",
            "Content-Type",
            f"{media or '(none)'!r} is not accepted; send application/x-protobuf or application/json",
        )
    return encoding


def decompress(body: bytes, content_encoding: str, max_bytes: int) -> bytes:
    """The body without its Content-Encoding, never more than max_bytes (a gzip bomb gets a 413)."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif coding == "deflate":
        wbits = zlib.MAX_WBITS  # zlib-wrapped, as HTTP means it; raw deflate is tried below
    else:
        raise OtlpError(
            415, "unsupported_encoding", "Content-Encoding", f"{coding!r} is not accepted; send gzip or none"
        )
    try:
        return _inflate(body, wbits, max_bytes)
    except zlib.error as exc:
        if coding == "deflate":
            try:
                return _inflate(body, -zlib.MAX_WBITS, max_bytes)
            except zlib.error:
                pass
        raise OtlpError(400, "bad_encoding", "body", f"not valid {coding} data ({exc})") from None


def _inflate(body: bytes, wbits: int, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    data = inflater.decompress(body, max_bytes + 1)
    if len(data) > max_bytes:
        raise OtlpError(
            413,
            "body_too_large",
            "body",
            f"over the limit of {max_bytes} bytes once decompressed (LOOPWATCH_MAX_BODY_BYTES)",
        )
    if not inflater.eof:
        raise zlib.error("the compressed data is cut short")
    return data


def request_decode(body: bytes, encoding: str) -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest from its bytes, or OtlpError(400) naming what is wrong."""
    request = ExportTraceServiceRequest()
    if encoding == PROTOBUF:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(
                400, "invalid_protobuf", "body", f"not an ExportTraceServiceRequest ({exc})"
            ) from None
        return request
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(400, "invalid_json", "body", f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise OtlpError(400, "invalid_json", "body", "must be a JSON object (an ExportTraceServiceRequest)")
    _ids_to_base64(data)
    try:
        # Unknown fields are ignored, as the specification asks of receivers.
        json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise OtlpError(400, "invalid_otlp_json", "body", _short(str(exc))) from None
    return request


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# OTLP/JSON writes trace and span ids as hex (32 and 16 digits), where protobuf's JSON mapping
# expects base64. Both are taken: an id of hex length in hex digits is hex; anything else is left for
# the parser to read as base64 (what json_format.MessageToJson writes). The two cannot be confused:
# base64 of 16 bytes is 24 characters, of 8 bytes 12.
_ID_KEYS = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8, "parentSpanId": 8, "parent_span_id": 8}
_HEX = frozenset("0123456789abcdefABCDEF")


def _ids_to_base64(data: dict[str, Any]) -> None:
    for r, resource_spans in enumerate(_list(data, ("resourceSpans", "resource_spans"), "")):
        where = f"resourceSpans[{r}]"
        for s, scope_spans in enumerate(_list(resource_spans, ("scopeSpans", "scope_spans"), where)):
            for i, span in enumerate(_list(scope_spans, ("spans",), f"{where}.scopeSpans[{s}]")):
                path = f"{where}.scopeSpans[{s}].spans[{i}]"
                if not isinstance(span, dict):
                    raise OtlpError(400, "invalid_otlp_json", path, "must be an object (a span)")
                _fix_ids(span, path)
                for k, link in enumerate(_list(span, ("links",), path)):
                    if isinstance(link, dict):
                        _fix_ids(link, f"{path}.links[{k}]")


def _list(parent: Any, keys: tuple[str, ...], where: str) -> list:
    if not isinstance(parent, dict):
        raise OtlpError(400, "invalid_otlp_json", where or "body", "must be an object")
    for key in keys:
        if key in parent:
            value = parent[key]
            if value is None:
                return []
            if not isinstance(value, list):
                raise OtlpError(
                    400, "invalid_otlp_json", f"{where}.{keys[0]}".lstrip("."), "must be an array"
                )
            return value
    return []


def _fix_ids(item: dict[str, Any], path: str) -> None:
    for key, size in _ID_KEYS.items():
        value = item.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise OtlpError(400, "invalid_otlp_json", f"{path}.{key}", "must be a string of hex digits")
        if len(value) == 2 * size and _HEX.issuperset(value):
            item[key] = base64.b64encode(bytes.fromhex(value)).decode()
            continue
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raw = None
        if raw is None or len(raw) != size:
            raise OtlpError(
                400,
                "invalid_otlp_json",
                f"{path}.{key}",
                f"must be {2 * size} hex digits (got {_short(value, 60)!r})",
            )


def response_encode(encoding: str, rejected: int = 0, message: str = "") -> bytes:
    """An ExportTraceServiceResponse; partial_success only when spans were refused (or a warning)."""
    response = ExportTraceServiceResponse()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if encoding == JSON:
        return json_format.MessageToJson(response, indent=None).encode()
    return response.SerializeToString()


def status_encode(encoding: str, http_status: int, message: str) -> bytes:
    """A google.rpc.Status {code, message}, encoded by hand: opentelemetry-proto does not ship it."""
    code = GRPC_CODES.get(http_status, 2)
    if encoding == JSON:
        return orjson.dumps({"code": code, "message": message})
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
