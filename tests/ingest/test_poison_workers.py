"""Two tenants through the real pipeline (REST ingest, Redis, two Celery worker processes, PostgreSQL):
tenant A sends the audit's poison, tenant B sends normal runs. Issue 11, item 1: one event stopped
detection for every tenant (the pass raised, rolled back every run it took, and re-queued itself
thousands of times a minute)."""

from __future__ import annotations

import re
import time

import orjson
import pytest

from ingest.models import Detection, Run, RunCursor
from ingest.services import detection_enqueue
from tests.ingest.events import model_round, run_started
from tests.ingest.test_hostile_input import HOSTILE, as_batch
from tests.ingest.test_poison import POISON, corrupt, normal_run, plant
from tests.ingest.test_workers import workers  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]

B_RUNS = 12


def _b_batches() -> list[list[dict]]:
    """B's runs, interleaved over several batches as a busy runtime sends them."""
    runs = [normal_run(f"b{r}") for r in range(B_RUNS)]
    batches: list[list[dict]] = []
    for start in range(0, 7, 2):
        batches.append([event for events in runs for event in events[start : start + 2]])
    return batches


def test_poison_from_one_tenant_never_holds_up_another(workers, api, tenant, other_tenant, make_key):  # noqa: F811
    key_a, key_b = make_key(tenant), make_key(other_tenant)
    # A through the door: every hostile value is refused, naming the field (nothing to poison).
    hostile = as_batch([orjson.dumps(run_started("door")).decode(), *(text for text, _, _ in HOSTILE)])
    response = api.post("/api/v1/events", hostile, key_a)
    assert response.status_code == 207 and response.json()["rejected"] == len(HOSTILE)
    # A's runs stored before the door refused them (and one no version should have stored), queued
    # for detection as ingest queues a batch's runs; B's runs sent meanwhile, batch after batch.
    poison = []
    for name, make in POISON.items():
        poison += plant(tenant, make(name))
    for n in range(3):
        poison += plant(tenant, corrupt(f"corrupt-{n}"))
    detection_enqueue(poison)
    for batch in _b_batches():
        assert api.post("/api/v1/events", batch, key_b).status_code == 200
        detection_enqueue(poison[-3:])  # A's corrupt runs get new events too, queued again and again
        api.post("/api/v1/events", [model_round(f"corrupt-{n}", n=9) for n in range(3)], key_a)

    deadline = time.monotonic() + 90
    b_runs = Run.objects.filter(tenant=other_tenant)
    while time.monotonic() < deadline:
        behind = [
            c
            for c in RunCursor.objects.filter(run__in=b_runs).select_related("run")
            if c.position < c.run.events_count
        ]
        if len(b_runs) == B_RUNS and not behind:
            break
        time.sleep(0.5)
    logs = [log.read_text() for log in workers]
    assert len(b_runs) == B_RUNS and not behind, f"B's runs are behind; worker logs:\n{logs[0][-3000:]}"
    for run in b_runs:
        assert Detection.objects.filter(run=run, kind="exact_repeat").exists(), run.run_id
    # A's runs that the engine bounds are processed; the corrupt ones are quarantined, once each.
    for name in POISON:
        cursor = RunCursor.objects.select_related("run").get(run__tenant=tenant, run__run_id=name)
        assert cursor.position == cursor.run.events_count and cursor.failures == 0, name
    time.sleep(5)  # time for a hot loop to show, if there were one
    for n in range(3):
        cursor = RunCursor.objects.get(run__tenant=tenant, run__run_id=f"corrupt-{n}")
        assert cursor.failures == 1 and "KeyError" in cursor.error, (cursor.failures, cursor.error)
        assert cursor.position == 0 and cursor.retry_at is not None
    logs = [log.read_text() for log in workers]
    tasks = sum(len(re.findall(r"Task ingest\.detect_\w+\[[^\]]+\] received", log)) for log in logs)
    quarantined = sum(log.count("quarantined until") for log in logs)
    assert quarantined == 3, "each corrupt run is quarantined once, then passed over until its next try"
    # Each batch queues at most one task; a failing pass re-queuing itself made thousands.
    assert tasks <= 40, f"{tasks} detection tasks: a pass is re-queuing itself"
    assert not Run.objects.filter(tenant=tenant, run_id__startswith="b").exists()  # tenants stay apart
