"""OpenTelemetry ingest: OTLP/HTTP trace exports become trace events v1 (docs/otlp.md).

- `wire`: the OTLP/HTTP envelope (content types, compression, JSON ids, answers); no Django.
- `mapping`: spans of the GenAI, OpenInference and OpenLLMetry dialects to events; no Django.
- `service`: `otlp_traces_ingest`, which holds the export's runs, looks up what the mapping needs
  and stores through `events_ingest`, the same path as REST; spans that wait for their run.
- `rounds`: the detection pass's numbering of OTLP rounds by start time.
"""
