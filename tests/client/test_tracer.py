"""The Tracer against a live server over real HTTP: batches, redelivery, loopwatch down."""

from __future__ import annotations

import logging
import time

import pytest

from ingest.models import Event, Run
from loopwatch_client import Tracer

# live_server serves from another thread: what the tests read must really be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def key(tenant, make_key) -> str:
    return make_key(tenant, scopes=("ingest",))


def calls(run, n: int) -> None:
    for i in range(n):
        call_id = run.tool_call("search_orders", {"customer": str(i)}, kind="read")
        run.tool_result(call_id, "ok", {"orders": [i]})


def test_events_go_in_full_batches_and_are_all_stored(live_server, proxy, key, tenant):
    tracer = Tracer(proxy.url, key, batch_size=100, flush_interval=60)
    run = tracer.start_run("r1", agent="shop", backend="openai")
    calls(run, 99)  # 1 + 198 + 1 = 200 events: two full batches, sent without waiting for a flush
    run.finish("succeeded")
    deadline = time.monotonic() + 10
    while tracer.stats["sent"] < 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tracer.stats["sent"] == 200 and tracer.stats["batches"] == 2
    assert proxy.posts("/api/v1/events") == 2
    assert Event.objects.filter(tenant=tenant).count() == 200
    assert Run.objects.get(run_id="r1").status == Run.Status.SUCCEEDED
    # Every event has its id, unique in the run.
    ids = list(Event.objects.values_list("event_id", flat=True))
    assert None not in ids and len(set(ids)) == 200
    tracer.close()


def test_a_batch_whose_answer_was_lost_is_sent_again_and_stored_once(live_server, proxy, key, tenant):
    proxy.lose_answers = 1  # the server stores the first batch, the tracer never hears so
    tracer = Tracer(proxy.url, key, batch_size=50, flush_interval=0.05)
    run = tracer.start_run("r1")
    calls(run, 10)
    assert tracer.flush(timeout=15)
    stats = tracer.stats
    assert stats["retries"] >= 1
    assert stats["sent"] + stats["duplicate"] == 21 and stats["duplicate"] >= 1
    assert Event.objects.filter(tenant=tenant).count() == 21
    assert proxy.posts("/api/v1/events") >= 2
    tracer.close()


def test_loopwatch_refusing_for_a_while_then_back_loses_nothing(live_server, proxy, key, tenant):
    proxy.refuse = 3  # three 503s in a row
    tracer = Tracer(proxy.url, key, batch_size=20, flush_interval=0.05, max_backoff_s=0.2)
    run = tracer.start_run("r1")
    calls(run, 5)
    assert tracer.flush(timeout=15)
    assert tracer.stats["retries"] == 3 and tracer.stats["dropped"] == 0
    assert Event.objects.filter(tenant=tenant).count() == 11
    tracer.close()


def test_loopwatch_down_never_blocks_and_counts_what_it_drops(down_url, caplog):
    tracer = Tracer(down_url, "lw_whatever", batch_size=10, max_buffer=50, flush_interval=0.01, timeout=1)
    run = tracer.start_run("r1")
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="loopwatch_client.tracer"):
        for i in range(100):
            run.tool_call("t", {"i": i})
    took = time.perf_counter() - started
    assert took < 0.5, f"100 emits took {took:.3f} s"
    stats = tracer.stats
    assert stats["emitted"] == 50 and stats["dropped"] == 51  # run_started + 100 calls, 50 kept
    assert "buffer full (50 events)" in stats["last_error"]
    assert any("dropped" in r.getMessage() for r in caplog.records)
    assert tracer.flush(timeout=0.3) is False  # nothing can be delivered
    started = time.perf_counter()
    tracer.close(timeout=0.3)
    assert time.perf_counter() - started < 2
    assert tracer.stats["dropped"] == 101 and tracer.stats["sent"] == 0
    assert run.tool_call("t", {}) and tracer.stats["dropped"] == 102  # after close: counted, no error


def test_events_the_server_rejects_are_counted_not_retried(live_server, key, tenant):
    tracer = Tracer(live_server.url, key, flush_interval=0.01)
    run = tracer.start_run("r1")
    run.emit("tool_call", round=1, call_id="c1", args={})  # no tool
    run.emit("model_round", round=1, input_tokens=-5)
    assert tracer.flush(timeout=10)
    assert tracer.stats["rejected"] == 2 and tracer.stats["sent"] == 1 and tracer.stats["retries"] == 0
    tracer.close()


def test_an_unknown_key_drops_the_batch_and_says_why(live_server):
    tracer = Tracer(live_server.url, "lw_not-a-key", flush_interval=0.01)
    tracer.start_run("r1")
    assert tracer.flush(timeout=10)
    assert tracer.stats["dropped"] == 1 and "HTTP 401" in tracer.stats["last_error"]
    tracer.close()


def test_events_that_are_not_json_are_dropped_not_raised(down_url):
    tracer = Tracer(down_url, "lw_x", flush_interval=60)
    assert tracer.emit({"type": "user_message", "run_id": "r1", "text": float("nan")}) is False
    assert tracer.emit(None) is False  # type: ignore[arg-type]
    circular: dict = {}
    circular["self"] = circular
    assert tracer.emit({"type": "user_message", "run_id": "r1", "text": circular}) is False
    assert tracer.stats["dropped"] == 3 and tracer.stats["emitted"] == 0
    tracer.close(timeout=0.1)
