"""Writes: tenants and keys, event ingestion, detection's pipeline, alerts.

One module per topic; the public names are re-exported here (`from ingest.services import
events_ingest`):

- keys: tenants, API keys and the per-process cache of active keys;
- ingestion: a batch validated and stored (events_ingest), runs held for an export (runs_hold);
- pipeline: runs queued for detection, then their events processed in passes (runs_process);
- materialise: a pass's model rounds and tool calls, and its traced writes fed to the ledger;
- alerts: interventions published to the tenants' pages;
- postgres: PostgreSQL's own statements of the fast paths above.
"""

from ingest.services.alerts import alert_payload, alerts_publish, alerts_publish_all
from ingest.services.ingestion import (
    EVENT_ID_CONSTRAINT,
    EventTooLarge,
    IngestResult,
    Verdict,
    events_ingest,
    runs_drop_empty,
    runs_hold,
)
from ingest.services.keys import (
    KEY_PREFIX,
    api_key_cached,
    api_key_create,
    api_key_forget,
    api_key_hash,
    api_key_lookup,
    api_key_revoke,
    tenant_get_or_create,
)
from ingest.services.materialise import RESULT_FIELDS, round_cost
from ingest.services.pipeline import (
    PROCESS_CHUNK,
    QUARANTINE_ERROR_CHARS,
    QUARANTINE_FIRST_S,
    QUARANTINE_MAX_S,
    RETRY_AFTER_FAILURE_S,
    RUN_CHUNK_MIN,
    SHADOW,
    detection_enqueue,
    run_process,
    run_reprocess,
    runs_pending_process,
    runs_process,
)
from ingest.services.postgres import RUN_FIELDS, RUN_FIGURES

__all__ = [
    "EVENT_ID_CONSTRAINT",
    "KEY_PREFIX",
    "PROCESS_CHUNK",
    "QUARANTINE_ERROR_CHARS",
    "QUARANTINE_FIRST_S",
    "QUARANTINE_MAX_S",
    "RESULT_FIELDS",
    "RETRY_AFTER_FAILURE_S",
    "RUN_CHUNK_MIN",
    "RUN_FIELDS",
    "RUN_FIGURES",
    "SHADOW",
    "EventTooLarge",
    "IngestResult",
    "Verdict",
    "alert_payload",
    "alerts_publish",
    "alerts_publish_all",
    "api_key_cached",
    "api_key_create",
    "api_key_forget",
    "api_key_hash",
    "api_key_lookup",
    "api_key_revoke",
    "detection_enqueue",
    "events_ingest",
    "round_cost",
    "run_process",
    "run_reprocess",
    "runs_drop_empty",
    "runs_hold",
    "runs_pending_process",
    "runs_process",
    "tenant_get_or_create",
]
