"""What a tool does when nobody said: read, write, poll or other, from its name and its results.

OTLP spans and many runtimes send no `kind`, and a tool registry is rarely complete. The kind
decides how repetition is judged (a poll waiting on a job is not a loop; a write is never
deduplicated by its arguments), so an undeclared tool gets one inferred, in this order:

1. the `tool_call` event's own `kind`;
2. the tool's description (Tool configs, `ToolSpec.kind`): an operator's word overrides inference;
3. the name: `get_job_status`, `wait_for_export`, `check_build`, `poll_*` are polls; a leading
   verb says read (`get_`, `list_`, `search_`…) or write (`create_`, `update_`, `cancel_`…);
4. the results: a call whose result carries a status field that says "still working"
   (`{"status": "running"}`), or whose status changes between identical calls, is a poll from then
   on (for the rest of the run, for that tool).

Where the kind came from is kept with the call (`event`, `config`, `name`, `result`, `default`)
and shown in the evidence of what fires on it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.detection.policy import Detection
    from ingest.detection.state import Call

KIND_NAMES = ("read", "write", "poll", "other")
DECLARED = ("event", "config")  # where a kind was said rather than guessed

_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
POLL_VERBS = frozenset({"wait", "poll", "await"})
POLL_NOUNS = frozenset({"status", "progress", "state", "health", "readiness"})
CHECK_VERBS = frozenset({"check"})
READ_VERBS = frozenset(
    """get list search find read fetch lookup look query describe show view retrieve load count
    browse inspect peek head cat grep select scan download""".split()
)
WRITE_VERBS = frozenset(
    """create update delete remove cancel book send set add insert put post patch write modify submit
    place pay charge refund transfer exchange return upload assign approve reject close register
    reset move rename apply enable disable archive publish deploy schedule reserve order purchase
    buy issue grant revoke invite merge commit push edit replace append upsert save store""".split()
)
# Values of a status field that say the work is not done yet.
PENDING = frozenset(
    """pending running queued in_progress in-progress inprogress processing started waiting scheduled
    building deploying provisioning initializing initialising creating submitted accepted
    not_started notstarted working active_running""".split()
)
STATUS_KEYS = ("status", "state", "phase", "job_status", "run_status", "task_status")


def words(name: str) -> list[str]:
    """A tool name's words, lower case: `getJobStatus`, `get_job_status`, `jobs.get-status`."""
    return [w.lower() for w in _WORDS.findall(name)]


@functools.lru_cache(maxsize=4096)  # a tenant has few tools; the name is parsed once
def kind_from_name(name: str) -> str:
    """read / write / poll / other, from the name alone."""
    parts = words(name)
    if not parts:
        return "other"
    first = parts[0]
    if first in POLL_VERBS or first in CHECK_VERBS:
        return "poll"
    if first in WRITE_VERBS:
        return "write"  # update_status sets one
    if POLL_NOUNS & set(parts):
        return "poll"  # get_job_status, job_status, fetch_build_progress
    if first in READ_VERBS:
        return "read"
    return "other"


def kind_resolve(declared: Any, configured: str, name: str) -> tuple[str, str]:
    """(kind, where it came from) of a call of tool `name`."""
    if isinstance(declared, str) and declared in KIND_NAMES:
        return declared, "event"
    if configured in KIND_NAMES:
        return configured, "config"
    inferred = kind_from_name(name)
    return inferred, "name" if inferred != "other" else "default"


def status_of(result: Any) -> str:
    """The value of a result's status field (lower case), or "" when it has none.

    A bare string result is its own status when it is one word (`"RUNNING"`).
    """
    if isinstance(result, dict):
        for key in STATUS_KEYS:
            value = result.get(key)
            if isinstance(value, str) and value:
                return value.strip().lower()[:40]
        return ""
    if isinstance(result, str) and result and len(result) <= 40 and " " not in result.strip():
        return result.strip().lower()
    return ""


def pending(status: str) -> bool:
    return status.replace(" ", "_") in PENDING


def with_kind(found: list[Detection], call: Call) -> list[Detection]:
    """The detections on a call, their evidence naming the kind it was judged as and, when nobody
    declared it, where that kind came from."""
    extra: dict[str, str] = {"tool_kind": call.kind}
    if call.kind_from not in DECLARED:
        extra["kind_inferred_from"] = call.kind_from
    return [replace(d, evidence={**d.evidence, **extra}) for d in found]
