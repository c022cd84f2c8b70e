"""Enqueueing detection (ingest.pending, ingest.services.detection_enqueue) against a private Redis
that is frozen: the request is held for the enqueue timeout at most, and the runs it could not add
are added by the process once Redis answers, with a task queued whatever the flag says.

The runs waiting and the flag live in the private Redis (REDIS_URL for ingest.pending); the task
goes to the real broker (the suite's Redis), on a queue of this test's own."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from django.conf import settings as live_settings

from ingest import pending
from ingest.models import RunCursor
from ingest.services import events_ingest, pipeline
from loopwatch.celery import app
from tests.ingest.events import model_round, run_started, tool_call, tool_result

pytestmark = [pytest.mark.faults, pytest.mark.real_workers, pytest.mark.django_db(transaction=True)]

SLACK_S = 0.75  # a loaded 2-core machine


@pytest.fixture
def frozen_redis_setup(needs_redis, needs_postgres, private_redis, settings):
    queue = f"test-enqueue-{uuid.uuid4().hex[:8]}"
    previous = app.conf.task_default_queue, app.conf.task_always_eager
    app.conf.task_default_queue, app.conf.task_always_eager = queue, False
    settings.REDIS_URL = private_redis.url()  # ingest.pending's; the broker stays the suite's
    pending.pending_clients_forget()
    broker = redis.Redis.from_url(live_settings.CELERY_BROKER_URL)
    try:
        yield private_redis, broker, queue
    finally:
        private_redis.thaw()
        pipeline._requeue.clear()
        app.conf.task_default_queue, app.conf.task_always_eager = previous
        pending.pending_clients_forget()
        broker.delete(queue)


def _batch(run: str) -> list[dict]:
    return [run_started(run), model_round(run, n=1), tool_call(run, "c", n=1), tool_result(run, "c", n=1)]


def test_a_frozen_redis_holds_ingest_for_the_enqueue_timeout_and_the_runs_are_added_after(
    frozen_redis_setup, tenant
):
    private, broker, queue = frozen_redis_setup
    events_ingest(tenant=tenant, events=_batch("before"), max_event_bytes=1 << 20)
    assert broker.llen(queue) == 1  # Redis answering: the batch's run queued a task
    broker.delete(queue)
    private.client().delete(f"loopwatch:{queue}:detect:queued")  # as if that task had started

    private.freeze()
    started = time.monotonic()
    events_ingest(tenant=tenant, events=_batch("frozen"), max_event_bytes=1 << 20)  # enqueues after commit
    held = time.monotonic() - started
    assert held < live_settings.LOOPWATCH_ENQUEUE_TIMEOUT_MS / 1000 + SLACK_S, f"ingest held {held:.2f} s"
    assert pipeline._requeue.held() == 1  # the process keeps the run
    assert broker.llen(queue) == 0

    time.sleep(1.0)  # Redis stays frozen a while: the requeue keeps trying
    private.thaw()
    deadline = time.monotonic() + 10
    while pipeline._requeue.held() or broker.llen(queue) == 0:
        assert time.monotonic() < deadline, "the run was not added again after Redis came back"
        time.sleep(0.05)
    frozen = RunCursor.objects.get(run__run_id="frozen").run_id
    assert private.client().smembers(f"loopwatch:{queue}:detect:pending") >= {str(frozen).encode()}
    # The command that timed out may well have run when Redis woke (its bytes were in Redis's
    # socket), setting the flag with no task behind it: before, that held detection for the flag's
    # minute. The requeue forces the flag and queues the task.
    assert private.client().get(f"loopwatch:{queue}:detect:queued") == b"1"
    assert broker.llen(queue) == 1
