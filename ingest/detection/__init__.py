"""The detection engine: pure Python, no Django import, no clock reads, no I/O (see DESIGN.md).

One engine, three callers: the Celery pipeline, `manage.py replay`, and a guard asked about a call
before it runs. It consumes one run's trace events in order and emits detections; its state per
run (`RunState`) is bounded and serialises to JSON.
"""

from ingest.detection.config import DEFAULT_CONFIG, Config, Thresholds, ToolSpec
from ingest.detection.engine import Engine, replay_run
from ingest.detection.policy import ACTIONS, KINDS, Detection
from ingest.detection.state import RunState

__all__ = [
    "ACTIONS",
    "DEFAULT_CONFIG",
    "KINDS",
    "Config",
    "Detection",
    "Engine",
    "RunState",
    "Thresholds",
    "ToolSpec",
    "replay_run",
]
