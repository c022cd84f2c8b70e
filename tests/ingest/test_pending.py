"""Runs waiting for detection in Redis (ingest.pending): a burst of batches queues one task, and
one task takes every run that came meanwhile — on the real Redis broker and PostgreSQL."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest
import redis
from django.conf import settings

from ingest.models import RunCursor
from ingest.pending import pending_count
from ingest.services import RETRY_AFTER_FAILURE_S, events_ingest, pipeline, runs_pending_process
from ingest.tasks import detect_pending
from loopwatch.celery import app
from tests.ingest.events import model_round, run_started, tool_call, tool_result

pytestmark = [pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def broker(needs_redis, needs_postgres):
    """Tasks go to the real broker, on a queue of this test's own; its Redis keys go afterwards."""
    queue = f"test-pending-{uuid.uuid4().hex[:8]}"
    previous = app.conf.task_default_queue, app.conf.task_always_eager
    app.conf.task_default_queue, app.conf.task_always_eager = queue, False
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        yield client, queue
    finally:
        pipeline._requeue.clear()  # nothing this test's process kept may land in another test's queue
        app.conf.task_default_queue, app.conf.task_always_eager = previous
        client.delete(queue, *(f"loopwatch:{queue}:detect:{key}" for key in ("pending", "queued", "sweep")))


def _batch(run: str, n: int) -> list[dict]:
    events = [run_started(run)] if n == 0 else []
    return [
        *events,
        model_round(run, n=n + 1),
        tool_call(run, "c", n=n + 1, args={"n": n}),
        tool_result(run, "c", n=n + 1, result={"n": n}),
    ]


def _ingest(tenant, runs: int, batches: int) -> None:
    for n in range(batches):
        for r in range(runs):
            events_ingest(tenant=tenant, events=_batch(f"run-{r}", n), max_event_bytes=1 << 20)


def _behind(tenant) -> list[RunCursor]:
    return [
        c
        for c in RunCursor.objects.filter(run__tenant=tenant).select_related("run")
        if c.position < c.run.events_count
    ]


def test_a_burst_of_batches_queues_one_task_that_takes_every_run(broker, tenant):
    client, queue = broker
    _ingest(tenant, runs=8, batches=5)  # 40 batches, each committed: 40 enqueues
    assert client.llen(queue) == 1, "one task queued for the whole burst"
    assert pending_count() == 8
    assert len(_behind(tenant)) == 8

    processed = detect_pending()  # the task, run here as the worker would
    assert processed == 8 * (1 + 5 * 3)
    assert _behind(tenant) == [] and pending_count() == 0

    # The task cleared the flag when it started: the next batch queues a task of its own.
    events_ingest(tenant=tenant, events=_batch("run-0", 5), max_event_bytes=1 << 20)
    assert client.llen(queue) == 2 and pending_count() == 1


def test_a_task_out_of_time_leaves_the_rest_queued_for_the_next(broker, tenant):
    client, queue = broker
    _ingest(tenant, runs=10, batches=1)
    client.delete(queue)
    processed = runs_pending_process(budget_s=0, take=3)  # one pass of 3 runs, then out of time
    assert processed == 3 * 4
    assert pending_count() == 7 and len(_behind(tenant)) == 7
    assert client.llen(queue) == 1, "the rest must have a task queued"
    assert runs_pending_process() == 7 * 4
    assert _behind(tenant) == [] and pending_count() == 0


def test_runs_of_a_failed_pass_go_back_and_a_task_is_queued(broker, tenant, monkeypatch):
    client, queue = broker
    _ingest(tenant, runs=4, batches=1)
    client.delete(queue)

    def broken(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr("ingest.services.pipeline.runs_process", broken)
    with pytest.raises(RuntimeError):
        runs_pending_process()
    assert pending_count() == 4 and client.llen(queue) == 1
    # Not at once: a failure that is everyone's (a run's own is quarantined in the pass) would
    # otherwise loop as fast as the workers take the task.
    eta = datetime.fromisoformat(orjson.loads(client.lindex(queue, 0))["headers"]["eta"])
    assert eta - datetime.now(UTC) > timedelta(seconds=RETRY_AFTER_FAILURE_S - 2)
    monkeypatch.undo()
    assert runs_pending_process() == 4 * 4 and _behind(tenant) == []


def test_the_sweep_queues_lagging_runs_through_the_same_set(broker, tenant):
    from ingest.tasks import detect_sweep

    client, queue = broker
    _ingest(tenant, runs=3, batches=2)
    client.delete(queue, f"loopwatch:{queue}:detect:pending", f"loopwatch:{queue}:detect:queued")  # lost
    assert detect_sweep() == 3
    assert pending_count() == 3 and client.llen(queue) == 1
    detect_pending()
    assert _behind(tenant) == []


def test_with_redis_down_a_batch_is_stored_and_its_runs_are_added_when_redis_is_back(
    broker, tenant, make_key, client, monkeypatch
):
    from ingest import pending

    client_redis, queue = broker
    pending.pending_clients_forget()
    monkeypatch.setattr(settings, "REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    response = client.post(
        "/api/v1/events",
        orjson.dumps(_batch("run-down", 0)),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {make_key(tenant)}",
    )
    assert response.status_code == 200
    assert [v["status"] for v in response.json()["results"]] == ["accepted"] * 4
    assert len(_behind(tenant)) == 1  # stored, not processed: its enqueue failed after the commit
    assert pipeline._requeue.held() == 1  # kept by the process

    monkeypatch.undo()  # Redis is back: the process adds the run again, and queues a task
    pending.pending_clients_forget()
    deadline = time.monotonic() + 10
    while pipeline._requeue.held() or client_redis.llen(queue) == 0:
        assert time.monotonic() < deadline, "the run was not added again"
        time.sleep(0.05)
    assert pending_count() == 1
    detect_pending()
    assert _behind(tenant) == []


def test_the_sweep_queues_a_task_even_when_a_flag_says_one_is_queued(broker, tenant):
    """A flag left by a command that timed out (it ran after its client gave up), or by a process
    that died before sending the task: no task is queued, yet the flag says one is. The sweep's
    task goes anyway."""
    from ingest.tasks import detect_sweep

    client, queue = broker
    _ingest(tenant, runs=2, batches=1)
    client.delete(queue, f"loopwatch:{queue}:detect:pending")  # the runs and the task are lost...
    client.set(f"loopwatch:{queue}:detect:queued", "1", ex=60)  # ...and the flag stayed
    assert detect_sweep() == 2
    assert client.llen(queue) == 1 and pending_count() == 2
    detect_pending()
    assert _behind(tenant) == []


def test_one_sweep_claim_of_all_wins_per_interval(broker):
    from ingest.pending import sweep_claim

    assert sweep_claim(ttl_s=0.5) is True
    assert sweep_claim(ttl_s=0.5) is False  # another worker, in the same interval
    time.sleep(0.6)
    assert sweep_claim(ttl_s=0.5) is True
