"""Puts trace-events.schema.json into the OpenAPI document as the TraceEvent component."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import orjson

SCHEMA_PATH = Path(__file__).parent / "spec" / "trace-events.schema.json"


@cache
def trace_event_schema() -> dict:
    schema = orjson.loads(SCHEMA_PATH.read_bytes())
    schema.pop("$schema", None)
    schema.pop("$id", None)
    return schema


def add_trace_event_schema(result, generator, request, public):
    result.setdefault("components", {}).setdefault("schemas", {})["TraceEvent"] = trace_event_schema()
    batch = {"type": "array", "items": {"$ref": "#/components/schemas/TraceEvent"}}
    operation = result.get("paths", {}).get("/api/v1/events", {}).get("post")
    if operation is not None:
        operation["requestBody"] = {
            "required": True,
            "description": "A JSON array of TraceEvents, or one TraceEvent per line (JSON Lines).",
            "content": {
                "application/json": {"schema": batch},
                "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/TraceEvent"}},
            },
        }
    return result


from drf_spectacular.extensions import OpenApiAuthenticationExtension  # noqa: E402


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "ingest.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A loopwatch API key: lw_..."}
