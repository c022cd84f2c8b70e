"""Rate limits and quotas per tenant and per key (ingest.quotas): 429 with Retry-After and the limit
named, on every way in; kept in the real Redis, shared by several web processes; fail open when
Redis is away; in the process when embedded.

No test depends on how fast it runs: a rate is driven into debt by one large batch (a bucket of 2
at 1 event a second that let 50 through owes 48 s), and a quota a day does not refill."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import orjson
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from google.rpc.status_pb2 import Status

from ingest import metrics
from ingest.models import ApiKey
from ingest.pending import pending_clients_forget, redis_client
from ingest.quotas import quotas_forget
from loopwatch.asgi import application
from tests.ingest.otlp_spans import genai_agent, genai_chat, recorded, request_bytes
from tests.live import HOST, ROOT, free_port, test_database_url

EVENTS = "/api/v1/events"


def batch(n: int, run: str = "r1", start: int = 0) -> list[dict]:
    return [
        {
            "type": "model_round",
            "run_id": run,
            "event_id": f"{run}-{start + i}",
            "ts": "2026-11-29T10:00:00Z",
            "round": start + i + 1,
            "input_tokens": 1,
            "output_tokens": 1,
        }
        for i in range(n)
    ]


def refusals(tenant_label: str, limit: str) -> float:
    value = metrics.RATE_LIMITED.labels(tenant=tenant_label, limit=limit)._value.get()
    return value


@pytest.fixture(autouse=True)
def fresh_buckets(settings):
    """Every bucket full: this run's earlier tests (and primary keys used again) leave none behind."""
    settings.LOOPWATCH_RATE_BURST_S = 2
    if settings.REDIS_URL:
        client = redis_client()
        for name in client.scan_iter(f"loopwatch:{settings.CELERY_TASK_DEFAULT_QUEUE}:quota:*"):
            client.delete(name)
    quotas_forget()
    yield
    quotas_forget()


def key_of(raw: str) -> ApiKey:
    from ingest.services import api_key_hash

    return ApiKey.objects.get(key_hash=api_key_hash(raw))


def over(response, limit: str) -> dict:
    assert response.status_code == 429, response.content
    body = response.json()
    assert body["error"] == "rate_limited"
    assert body["limit"] == limit
    assert response["Retry-After"] == str(body["retry_after_s"])
    assert int(response["Retry-After"]) >= 1
    assert body["detail"].startswith(f"{limit}: ")
    return body


@pytest.mark.django_db
def test_a_tenant_over_its_rate_gets_429_while_another_tenant_passes(
    needs_redis, api, tenant, other_tenant, make_key
):
    tenant.events_per_s = 1
    tenant.save()
    other_tenant.events_per_s = 1
    other_tenant.save()
    mine, theirs = make_key(tenant), make_key(other_tenant)
    before = refusals(metrics.OTHER, "tenant.events_per_s")

    # A full bucket (2 events) lets a batch of 50 through, and owes 48 s.
    assert api.post(EVENTS, batch(50), mine).status_code == 200
    body = over(api.post(EVENTS, batch(1, start=50), mine), "tenant.events_per_s")
    assert body["retry_after_s"] >= 40
    assert "tenant acme may send 1 events a second" in body["detail"]
    # Nothing of the refused batch was stored; the other tenant's bucket is its own.
    assert tenant.runs.get().events_count == 50
    assert api.post(EVENTS, batch(50), theirs).status_code == 200
    assert refusals(metrics.OTHER, "tenant.events_per_s") == before + 1


@pytest.mark.django_db
def test_a_key_limit_holds_for_that_key_only(needs_redis, api, tenant, make_key):
    limited, free = make_key(tenant), make_key(tenant)
    ApiKey.objects.filter(pk=key_of(limited).pk).update(events_per_s=1)
    assert api.post(EVENTS, batch(30), limited).status_code == 200
    body = over(api.post(EVENTS, batch(1, start=30), limited), "key.events_per_s")
    assert f"API key {key_of(limited).prefix}" in body["detail"]
    assert api.post(EVENTS, batch(30, start=40), free).status_code == 200  # the tenant has no limit


@pytest.mark.django_db
def test_a_refused_request_takes_nothing_from_the_other_limits(needs_redis, api, tenant, make_key):
    """The key is over its rate; the tenant's quota a day must not count the refused batches."""
    tenant.events_per_day = 100
    tenant.save()
    raw = make_key(tenant)
    ApiKey.objects.filter(pk=key_of(raw).pk).update(events_per_s=1)
    assert api.post(EVENTS, batch(60), raw).status_code == 200
    for n in range(3):
        over(api.post(EVENTS, batch(20, start=60 + 20 * n), raw), "key.events_per_s")
    other = make_key(tenant)  # same tenant, no rate of its own: 40 of the day's 100 are left
    assert api.post(EVENTS, batch(40, run="r2"), other).status_code == 200
    over(api.post(EVENTS, batch(1, run="r2", start=40), other), "tenant.events_per_day")


@pytest.mark.django_db
def test_a_quota_a_day_refuses_a_batch_that_does_not_fit_until_midnight(needs_redis, api, tenant, make_key):
    tenant.events_per_day = 30
    tenant.save()
    raw = make_key(tenant)
    assert api.post(EVENTS, batch(20), raw).status_code == 200
    body = over(api.post(EVENTS, batch(20, start=20), raw), "tenant.events_per_day")
    assert 1 <= body["retry_after_s"] <= 86_400
    assert "30 events a UTC day" in body["detail"]
    assert api.post(EVENTS, batch(10, start=40), raw).status_code == 200  # what is left fits


@pytest.mark.django_db
def test_the_tenant_default_comes_from_the_setting_and_zero_is_no_limit(
    needs_redis, api, settings, tenant, other_tenant, make_key
):
    settings.LOOPWATCH_TENANT_EVENTS_PER_DAY = 10
    other_tenant.events_per_day = 0  # its own: no limit
    other_tenant.save()
    over(api.post(EVENTS, batch(11), make_key(tenant)), "tenant.events_per_day")
    assert api.post(EVENTS, batch(11), make_key(other_tenant)).status_code == 200


@pytest.mark.django_db
def test_guard_checks_have_a_rate_of_their_own(needs_redis, api, tenant, make_key):
    tenant.checks_per_s = 1
    tenant.save()
    raw = make_key(tenant)
    check = {"tool": "search", "args": {"q": "x"}}
    answers = [api.post("/api/v1/runs/r1/check", check, raw) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]  # a full bucket holds 2
    # Then the rate: 1 a second. However slow this machine, 40 checks take less than 40 s.
    for _ in range(40):
        answer = api.post("/api/v1/runs/r1/check", check, raw)
        if answer.status_code != 200:
            break
    over(answer, "tenant.checks_per_s")
    # Checks and events are counted apart.
    assert api.post(EVENTS, batch(5), raw).status_code == 200


@pytest.mark.django_db
def test_otlp_spans_count_as_events(needs_redis, api, tenant, make_key):
    tenant.events_per_s = 1
    tenant.save()
    raw = make_key(tenant)
    agent, memory = recorded()
    with agent.span("invoke_agent shop", genai_agent()):
        for _ in range(30):  # 31 spans: the full bucket (2) lets them through and owes 29 s
            agent.leaf("chat gpt-4o", genai_chat())
    export = request_bytes(memory.get_finished_spans())
    assert api.post("/v1/traces", export, raw, content_type="application/x-protobuf").status_code == 200
    refused = api.post("/v1/traces", export, raw, content_type="application/x-protobuf")
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    status = Status()
    status.ParseFromString(refused.content)
    assert status.code == 8  # RESOURCE_EXHAUSTED
    assert status.message.startswith("tenant.events_per_s: ")
    over(api.post(EVENTS, batch(1), raw), "tenant.events_per_s")  # REST and OTLP share the bucket


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_socket_message_over_the_limit_gets_an_ack_naming_it_and_stays_open(
    needs_redis, tenant, make_key
):
    tenant.events_per_s = 1
    await sync_to_async(tenant.save)()
    raw = await sync_to_async(make_key)(tenant)
    ws = WebsocketCommunicator(
        application,
        "/ws/v1/events",
        headers=[(b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {raw}".encode())],
    )
    assert (await ws.connect())[0]
    try:
        await ws.send_to(text_data=orjson.dumps(batch(30)).decode())
        assert (await ws.receive_json_from(timeout=30))["accepted"] == 30
        await ws.send_to(text_data=orjson.dumps(batch(1, start=30)).decode())
        refused = await ws.receive_json_from(timeout=30)
        assert refused["ack"] == 2
        assert refused["error"] == "rate_limited"
        assert refused["limit"] == "tenant.events_per_s"
        assert refused["retry_after_s"] >= 20
        await ws.send_to(text_data="not json")  # the socket is still there and answers
        assert (await ws.receive_json_from(timeout=30))["error"] == "invalid_json"
    finally:
        await ws.disconnect()


@pytest.mark.django_db
def test_embedded_the_limits_live_in_the_process(api, settings, tenant, make_key):
    settings.REDIS_URL = ""
    tenant.events_per_s = 1
    tenant.save()
    raw = make_key(tenant)
    assert api.post(EVENTS, batch(50), raw).status_code == 200
    over(api.post(EVENTS, batch(1, start=50), raw), "tenant.events_per_s")
    quotas_forget()  # the process's buckets are all there is
    assert api.post(EVENTS, batch(1, start=50), raw).status_code == 200


@pytest.mark.django_db
def test_redis_away_lets_requests_through_and_says_so(api, settings, tenant, make_key, caplog):
    with __import__("socket").socket() as closed:  # a port nothing listens on
        closed.bind((HOST, 0))
        port = closed.getsockname()[1]
    settings.REDIS_URL = f"redis://{HOST}:{port}/0"
    pending_clients_forget()
    try:
        tenant.events_per_day = 5
        tenant.save()
        raw = make_key(tenant)
        before = metrics.RATE_LIMIT_FAIL_OPEN._value.get()
        with caplog.at_level(logging.WARNING, logger="ingest.quotas"):
            for start in (0, 10):
                assert api.post(EVENTS, batch(10, start=start), raw).status_code == 200
        assert metrics.RATE_LIMIT_FAIL_OPEN._value.get() == before + 2
        assert "requests pass unlimited" in caplog.text
    finally:
        pending_clients_forget()


# --- several web processes sharing the limits ----------------------------------------------------

UVICORN = (sys.executable, "-m", "uvicorn", "loopwatch.asgi:application")
QUOTA = 200
SENDERS = 6
BATCHES = 12  # per sender, of 10 events: 720 events sent for a quota of 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.real_workers
def test_the_limit_holds_across_web_processes(needs_redis, needs_postgres, tenant, make_key, tmp_path):
    """uvicorn with 3 worker processes and 6 senders at once: exactly the quota's events are taken,
    whichever process each request reached; the rest are 429."""
    tenant.events_per_day = QUOTA
    tenant.save()
    raw = make_key(tenant)
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "CELERY_QUEUE": "test-quotas-discard",  # no worker reads it: detection is not this test's
        "LOG_LEVEL": "WARNING",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    # The day's counters of an earlier run stay in Redis, and tenant ids start again in every test
    # database: a second run on the same Redis found this tenant's quota spent (every answer 429).
    import redis

    stale = redis.Redis.from_url(os.environ["REDIS_URL"])
    for name in stale.scan_iter("loopwatch:test-quotas-discard:quota:*"):
        stale.delete(name)
    stale.close()
    log = tmp_path / "uvicorn.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [*UVICORN, "--host", HOST, "--port", str(port), "--workers", "3"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://{HOST}:{port}{EVENTS}"
    codes: list[int] = []
    workers = 0
    lock = threading.Lock()

    def send(sender: int) -> None:
        for b in range(BATCHES):
            body = orjson.dumps(batch(10, run=f"s{sender}", start=b * 10))
            request = urllib.request.Request(
                url, body, {"Authorization": f"Bearer {raw}", "Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    code = response.status
            except urllib.error.HTTPError as error:
                code = error.code
                assert code != 429 or error.headers["Retry-After"], "429 without Retry-After"
            with lock:
                codes.append(code)

    try:
        _wait_for(server, f"http://{HOST}:{port}/accounts/login/", log)
        threads = [threading.Thread(target=send, args=(s,)) for s in range(SENDERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        workers = len(subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True).stdout.split())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert workers >= 3, "uvicorn did not run its worker processes"
    assert sorted(set(codes)) == [200, 429], codes
    assert codes.count(200) * 10 == QUOTA
    assert sum(run.events_count for run in tenant.runs.all()) == QUOTA


def _wait_for(server: subprocess.Popen, url: str, log) -> None:
    import time

    deadline = time.monotonic() + 90
    while True:
        assert server.poll() is None, f"uvicorn exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"uvicorn did not answer:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)


def _inline_management(page: str) -> dict[str, str]:
    """The management fields of an admin page's inline formsets, with no new rows."""
    fields = dict(
        re.findall(r'name="([\w-]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)"[^>]*value="(\d*)"', page)
    )
    return {name: ("0" if name.endswith("TOTAL_FORMS") else value) for name, value in fields.items()}


@pytest.mark.django_db
def test_the_admin_shows_and_edits_the_limits_of_a_tenant_and_a_key(admin_client, settings, tenant, make_key):
    settings.LOOPWATCH_TENANT_EVENTS_PER_DAY = 5000
    key = key_of(make_key(tenant))
    page = admin_client.get(f"/admin/ingest/tenant/{tenant.pk}/change/").content.decode()
    assert 'name="events_per_s"' in page and 'name="checks_per_s"' in page
    assert "events_per_day=5000 (default)" in page  # the limits in force, the default filled in
    changed = admin_client.post(
        f"/admin/ingest/tenant/{tenant.pk}/change/",
        {
            "slug": "acme",
            "name": "",
            "events_per_s": "300",
            "events_per_day": "",
            "checks_per_s": "0",
            **_inline_management(page),  # the page's inlines (members), left as they are
        },
    )
    assert changed.status_code == 302, changed.content.decode()[:2000]
    tenant.refresh_from_db()
    assert (tenant.events_per_s, tenant.events_per_day, tenant.checks_per_s) == (300, None, 0)
    assert "events_per_s=300" in admin_client.get("/admin/ingest/tenant/").content.decode()

    page = admin_client.get(f"/admin/ingest/apikey/{key.pk}/change/").content.decode()
    assert 'name="events_per_s"' in page
    changed = admin_client.post(
        f"/admin/ingest/apikey/{key.pk}/change/",
        {
            "tenant": tenant.pk,
            "name": "",
            "scopes": '["ingest"]',
            "events_per_s": "50",
            "events_per_day": "",
            "checks_per_s": "5",
        },
    )
    assert changed.status_code == 302, changed.content.decode()[:2000]
    key.refresh_from_db()
    assert (key.events_per_s, key.events_per_day, key.checks_per_s) == (50, None, 5)
