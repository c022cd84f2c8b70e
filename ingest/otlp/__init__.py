"""OpenTelemetry ingest: OTLP/HTTP trace exports become trace events v1 (docs/otlp.md).

- `wire`: the OTLP/HTTP envelope (content types, compression, JSON ids, answers); no Django.
- `mapping`: spans of the GenAI, OpenInference and OpenLLMetry dialects to events; no Django.
- `service`: `otlp_traces_ingest`, which looks up what the mapping needs and stores through
  `events_ingest`, the same path as REST.
"""
