"""The live alerts page, the verdicts on alerts, and the alerts socket."""

from __future__ import annotations

import asyncio
import functools
import re
from datetime import timedelta

import orjson
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import connections
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from dashboards.alerts import consumers
from dashboards.alerts.selectors import AlertFilterError, AlertFilters, alert_list, alerts_after
from dashboards.models import Membership
from ingest.models import Detection, Incident
from ingest.services import events_ingest
from tests.ingest.events import model_round, run_started, tool_call, tool_result

URL = "/alerts/"


def _loop(run_id: str, repeats: int = 3, **started) -> list[dict]:
    """A run that calls the same read with the same answer `repeats` times: the 2nd is an
    observation, the 3rd a correction (default thresholds)."""
    events = [run_started(run_id, **started)]
    for i in range(1, repeats + 1):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i, args={"customer": "42"}),
            tool_result(run_id, f"c{i}", n=i, result={"orders": []}),
        ]
    return events


def _ingest(tenant, events) -> None:
    events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)


def _user(tenant, name: str, role: str = Membership.Role.OPERATOR):
    user = get_user_model().objects.create_user(name, password="pw")
    if tenant is not None:
        Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


@pytest.fixture
def loops(tenant, other_tenant, django_capture_on_commit_callbacks):
    """A loop in each tenant (detection runs eagerly once the ingest transaction commits)."""
    with django_capture_on_commit_callbacks(execute=True):
        _ingest(tenant, _loop("mine-1", agent="shop"))
    with django_capture_on_commit_callbacks(execute=True):
        _ingest(other_tenant, _loop("theirs-1", backend="anthropic", model="claude"))
    mine = Detection.objects.get(tenant=tenant, action="correct")
    theirs = Detection.objects.get(tenant=other_tenant, action="correct")
    return mine, theirs


# --- filters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"kind": "loopy"}, "kind"),
        ({"action": "explode"}, "action"),
        ({"observe": "maybe"}, "observe"),
        ({"backend": "x" * 101}, "backend"),
    ],
)
def test_alert_filters_name_the_bad_parameter(params, field):
    with pytest.raises(AlertFilterError) as caught:
        AlertFilters.parse(params)
    assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")


@pytest.mark.django_db
def test_alert_filters_select_in_the_database_what_they_match_on_a_payload(loops, tenant):
    every = alert_list(tenant_ids=[tenant.pk], filters=AlertFilters(observe=True))
    assert {a["action"] for a in every} == {"observe", "correct"}
    for filters in (
        AlertFilters(),
        AlertFilters(observe=True),
        AlertFilters(kind="exact_repeat"),
        AlertFilters(kind="oscillation", observe=True),
        AlertFilters(backend="openai"),
        AlertFilters(backend="anthropic"),
        AlertFilters(action="observe", observe=True),
        AlertFilters(action="correct"),
    ):
        from_db = {a["id"] for a in alert_list(tenant_ids=[tenant.pk], filters=filters)}
        assert from_db == {a["id"] for a in every if filters.matches(a)}, filters


@pytest.mark.django_db
def test_catch_up_gives_the_newest_when_too_many_were_missed(tenant, django_capture_on_commit_callbacks):
    for n in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            _ingest(tenant, _loop(f"r{n}"))
    ids = sorted(Detection.objects.exclude(action="observe").values_list("pk", flat=True))
    alerts, more = alerts_after(tenant_ids=[tenant.pk], filters=AlertFilters(), after=0, limit=2)
    assert [a["id"] for a in alerts] == ids[-2:] and more
    alerts, more = alerts_after(tenant_ids=[tenant.pk], filters=AlertFilters(), after=ids[0], limit=5)
    assert [a["id"] for a in alerts] == ids[1:] and not more


# --- the page ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_alerts_page_needs_a_login(client):
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.django_db
def test_the_page_lists_the_users_incidents_only(client, loops, tenant):
    mine, theirs = loops
    incident = Incident.objects.get(run_id=mine.run_id)
    client.force_login(_user(tenant, "ana", Membership.Role.VIEWER))
    page = client.get(URL).content.decode()
    assert f'id="incident-{incident.pk}"' in page and "mine-1" in page and escape(mine.hint) in page
    assert f'href="/runs/{mine.run_id}/#incidents"' in page
    assert f'href="/alerts/incidents/{incident.pk}/"' in page
    assert "theirs-1" not in page and "claude" not in page
    assert f'id="incident-{Incident.objects.get(run_id=theirs.run_id).pk}"' not in page
    # a viewer sees the verdicts but gets no form to give one
    assert 'class="mark"' not in page.split('<template id="alert-row">')[0]
    config = re.search(r'<script id="alerts-config" type="application/json">(.*?)</script>', page, re.S)
    assert orjson.loads(config.group(1))["after"] == max(
        Detection.objects.filter(tenant=tenant).values_list("pk", flat=True)
    )


@pytest.mark.django_db
def test_the_page_filters_on_the_server_and_refuses_bad_filters(client, loops, tenant):
    mine, _ = loops
    row = f'id="incident-{Incident.objects.get(run_id=mine.run_id).pk}"'
    client.force_login(_user(tenant, "ana"))
    assert row in client.get(URL, {"kind": "exact_repeat"}).content.decode()
    assert row not in client.get(URL, {"kind": "oscillation"}).content.decode()
    assert row not in client.get(URL, {"backend": "anthropic"}).content.decode()
    assert row not in client.get(URL, {"action": "terminate"}).content.decode()
    assert row in client.get(URL, {"status": "open", "range": "30d"}).content.decode()
    assert row not in client.get(URL, {"status": "resolved"}).content.decode()
    Incident.objects.update(last_seen=timezone.now() - timedelta(days=2))
    assert row not in client.get(URL, {"range": "24h"}).content.decode()
    assert row in client.get(URL, {"range": "7d"}).content.decode()
    for params, field in (
        ({"action": "explode"}, "action"),
        ({"status": "x"}, "status"),
        ({"range": "2y"}, "range"),
        ({"before": "-1"}, "before"),
    ):
        bad = client.get(URL, params)
        assert bad.status_code == 400 and f'data-field="{field}"' in bad.content.decode(), params
    assert "action: unknown action" in client.get(URL, {"action": "explode"}).content.decode()


@pytest.mark.django_db
def test_a_user_without_a_tenant_is_told_so(client):
    client.force_login(_user(None, "nobody"))
    page = client.get(URL).content.decode()
    assert "not a member of any tenant" in page


# --- verdicts ---------------------------------------------------------------------------------


def _feedback_url(detection) -> str:
    return f"/alerts/{detection.pk}/feedback/"


@pytest.mark.django_db
def test_an_operator_marks_an_alert_and_can_mark_it_again(client, loops, tenant):
    mine, _ = loops
    ana = _user(tenant, "ana")
    client.force_login(ana)
    response = client.post(_feedback_url(mine), {"verdict": "false_alarm", "note": "user asked twice"})
    assert response.status_code == 302 and response["Location"] == URL
    mine.refresh_from_db()
    assert (mine.feedback, mine.feedback_note, mine.feedback_by) == ("false_alarm", "user asked twice", ana)
    first_at = mine.feedback_at
    assert first_at is not None
    answer = client.post(
        _feedback_url(mine), {"verdict": "true_loop", "note": ""}, HTTP_ACCEPT="application/json"
    )
    assert answer.status_code == 200
    assert answer.json() | {"feedback_at": None} == {
        "id": mine.pk,
        "feedback": "true_loop",
        "feedback_note": "",
        "feedback_by": "ana",
        "feedback_at": None,
    }
    mine.refresh_from_db()
    assert mine.feedback == "true_loop" and mine.feedback_at >= first_at
    assert "true loop" in client.get(URL).content.decode()
    client.post(_feedback_url(mine), {"verdict": "clear"})
    mine.refresh_from_db()
    assert (mine.feedback, mine.feedback_by, mine.feedback_at) == ("", None, None)


@pytest.mark.django_db
def test_an_admin_may_mark_and_a_viewer_may_not(client, loops, tenant):
    mine, _ = loops
    client.force_login(_user(tenant, "vic", Membership.Role.VIEWER))
    response = client.post(_feedback_url(mine), {"verdict": "false_alarm"})
    assert response.status_code == 403 and "operator or admin" in response.content.decode()
    mine.refresh_from_db()
    assert mine.feedback == ""
    client.force_login(_user(tenant, "adi", Membership.Role.ADMIN))
    assert client.post(_feedback_url(mine), {"verdict": "false_alarm"}).status_code == 302
    mine.refresh_from_db()
    assert mine.feedback == "false_alarm"


@pytest.mark.django_db
def test_another_tenants_alert_cannot_be_marked_or_found(client, loops, tenant):
    _, theirs = loops
    client.force_login(_user(tenant, "ana"))
    assert client.post(_feedback_url(theirs), {"verdict": "false_alarm"}).status_code == 404
    missing = client.post(
        f"/alerts/{theirs.pk + 1000}/feedback/", {"verdict": "false_alarm"}, HTTP_ACCEPT="application/json"
    )
    assert missing.status_code == 404
    theirs.refresh_from_db()
    assert theirs.feedback == ""


@pytest.mark.django_db
def test_a_bad_verdict_or_note_is_a_400_naming_the_field(client, loops, tenant):
    mine, _ = loops
    client.force_login(_user(tenant, "ana"))
    bad = client.post(_feedback_url(mine), {"verdict": "maybe"}, HTTP_ACCEPT="application/json")
    assert bad.status_code == 400 and bad.json()["field"] == "verdict"
    long = client.post(_feedback_url(mine), {"verdict": "true_loop", "note": "x" * 2001})
    assert long.status_code == 400 and 'data-field="note"' in long.content.decode()
    assert client.get(_feedback_url(mine)).status_code == 405
    mine.refresh_from_db()
    assert mine.feedback == ""


@pytest.mark.django_db
def test_a_verdict_needs_the_csrf_token(loops, tenant):
    mine, _ = loops
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(_user(tenant, "ana"))
    assert browser.post(_feedback_url(mine), {"verdict": "false_alarm"}).status_code == 403
    mine.refresh_from_db()
    assert mine.feedback == ""
    page = browser.get(URL).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = browser.post(_feedback_url(mine), {"verdict": "false_alarm", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    mine.refresh_from_db()
    assert mine.feedback == "false_alarm"


# --- the socket -------------------------------------------------------------------------------

socket_db = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_layer(request, settings):
    """Socket tests on the in-memory channel layer, a fresh one each (tests/conftest.py): with
    channels_redis, a consumer's receive left over from one test's event loop could hang the
    teardown of a later one. The test that is about Redis keeps Redis."""
    if "needs_redis" not in request.fixturenames:
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


TEST_TIMEOUT_S = 60  # a hung socket test fails instead of holding up the suite


def socket_test(test):
    """An async socket test on pytest-asyncio's loop that fails after TEST_TIMEOUT_S instead of
    holding up the suite, and closes the database connections its thread opened."""

    @functools.wraps(test)
    async def run(*args, **kwargs):
        try:
            await asyncio.wait_for(test(*args, **kwargs), TEST_TIMEOUT_S)
        finally:
            await database_sync_to_async(connections.close_all)()

    return pytest.mark.asyncio(run)


def _socket(user, query: str = "") -> WebsocketCommunicator:
    """The consumer itself, with the user a session would have given it."""
    ws = WebsocketCommunicator(consumers.AlertsConsumer.as_asgi(), f"/ws/alerts{query}")
    ws.scope["user"] = user
    return ws


# What a page of the app sends with its socket (the Origin is checked: tests/loopwatch/test_websocket_origin.py).
PAGE_HEADERS = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000")]


async def _json(ws: WebsocketCommunicator, timeout: float = 5) -> dict:
    return orjson.loads(await ws.receive_from(timeout=timeout))


@socket_db
@socket_test
async def test_the_socket_pushes_a_new_alert_of_the_users_tenants_only(tenant, other_tenant):
    user = await database_sync_to_async(_user)(tenant, "ana")
    ws = _socket(user)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    await database_sync_to_async(_ingest)(other_tenant, _loop("theirs"))
    await database_sync_to_async(_ingest)(tenant, _loop("mine", agent="shop"))
    message = await _json(ws)
    assert message["type"] == "alert"
    alert = message["alert"]
    stored = await database_sync_to_async(Detection.objects.select_related("run").get)(
        tenant=tenant, action="correct"
    )
    assert (alert["id"], alert["run"], alert["run_id"], alert["kind"], alert["action"]) == (
        stored.pk,
        stored.run.pk,
        "mine",
        "exact_repeat",
        "correct",
    )
    assert (alert["agent"], alert["backend"], alert["model"], alert["tool"], alert["count"]) == (
        "shop",
        "openai",
        "gpt-4o",
        "search_orders",
        3,
    )
    assert alert["hint"] == stored.hint and alert["tenant_id"] == tenant.pk
    assert await ws.receive_nothing(timeout=0.5)  # not the other tenant's, not the observation
    await ws.disconnect()


@socket_db
@socket_test
async def test_a_reconnecting_socket_catches_up_from_the_last_id_it_saw(tenant, other_tenant):
    user = await database_sync_to_async(_user)(tenant, "ana")
    await database_sync_to_async(_ingest)(tenant, _loop("before"))
    seen = await database_sync_to_async(lambda: Detection.objects.filter(tenant=tenant).latest("pk").pk)()
    await database_sync_to_async(_ingest)(tenant, _loop("while-away-1"))
    await database_sync_to_async(_ingest)(other_tenant, _loop("theirs"))
    await database_sync_to_async(_ingest)(tenant, _loop("while-away-2"))
    ws = _socket(user, f"?after={seen}")
    await ws.connect(timeout=10)
    catch_up = await _json(ws)
    assert catch_up["type"] == "catch_up" and catch_up["more"] is False
    assert [(a["run_id"], a["action"]) for a in catch_up["alerts"]] == [
        ("while-away-1", "correct"),
        ("while-away-2", "correct"),
    ]
    assert all(a["id"] > seen for a in catch_up["alerts"])
    # then live
    await database_sync_to_async(_ingest)(tenant, _loop("live"))
    assert (await _json(ws))["alert"]["run_id"] == "live"
    await ws.disconnect()


@socket_db
@socket_test
async def test_the_socket_applies_the_pages_filters(tenant):
    user = await database_sync_to_async(_user)(tenant, "ana")
    ws = _socket(user, "?after=0&backend=anthropic")
    await ws.connect(timeout=10)
    assert (await _json(ws))["alerts"] == []
    await database_sync_to_async(_ingest)(tenant, _loop("on-openai"))
    await database_sync_to_async(_ingest)(tenant, _loop("on-anthropic", backend="anthropic"))
    assert (await _json(ws))["alert"]["run_id"] == "on-anthropic"
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


@socket_db
@socket_test
async def test_observations_reach_a_socket_that_asked_for_them(tenant, monkeypatch):
    monkeypatch.setattr(consumers, "OBSERVE_POLL_S", 0.2)
    user = await database_sync_to_async(_user)(tenant, "ana")
    ws = _socket(user, "?after=0&observe=1")
    await ws.connect(timeout=10)
    assert (await _json(ws))["alerts"] == []
    await database_sync_to_async(_ingest)(tenant, _loop("two", repeats=2))  # an observation only
    message = await _json(ws)
    assert (message["alert"]["run_id"], message["alert"]["action"]) == ("two", "observe")
    await ws.disconnect()


@socket_db
@socket_test
async def test_an_anonymous_socket_is_closed_with_4401(tenant):
    await database_sync_to_async(_ingest)(tenant, _loop("secret"))
    ws = _socket(AnonymousUser(), "?after=0")
    connected, _ = await ws.connect(timeout=10)
    assert connected  # accepted, then closed: a browser sees the code only after the handshake
    closed = await ws.receive_output(timeout=2)
    assert closed == {"type": "websocket.close", "code": 4401, "reason": "sign in first"}
    await ws.disconnect()  # ends the consumer: a task left running hangs the loop's teardown


@socket_db
@socket_test
async def test_a_bad_after_is_answered_then_closed_with_4400(tenant):
    user = await database_sync_to_async(_user)(tenant, "ana")
    ws = _socket(user, "?after=-3")
    await ws.connect(timeout=10)
    error = await _json(ws)
    assert error["type"] == "error" and error["field"] == "after"
    assert (await ws.receive_output(timeout=2))["code"] == 4400
    await ws.disconnect()


@socket_db
@socket_test
async def test_a_verdict_reaches_the_other_pages_of_the_tenant(tenant, other_tenant):
    ana = await database_sync_to_async(_user)(tenant, "ana")
    outsider = await database_sync_to_async(_user)(other_tenant, "oz")
    await database_sync_to_async(_ingest)(tenant, _loop("mine"))
    detection = await database_sync_to_async(Detection.objects.get)(tenant=tenant, action="correct")
    watching, theirs = _socket(ana), _socket(outsider)
    await watching.connect(timeout=10)
    await theirs.connect(timeout=10)
    client = Client()
    await database_sync_to_async(client.force_login)(ana)
    response = await database_sync_to_async(client.post)(
        _feedback_url(detection), {"verdict": "false_alarm", "note": "a retry"}
    )
    assert response.status_code == 302
    message = await _json(watching)
    assert message["type"] == "feedback"
    assert (
        message["feedback"]["id"],
        message["feedback"]["feedback"],
        message["feedback"]["feedback_by"],
    ) == (
        detection.pk,
        "false_alarm",
        "ana",
    )
    assert await theirs.receive_nothing(timeout=0.3)
    await watching.disconnect()
    await theirs.disconnect()


@socket_db
@socket_test
async def test_the_socket_knows_the_user_from_the_session_cookie(tenant):
    """Through the real ASGI application and its AuthMiddlewareStack, as a browser connects."""
    from loopwatch.asgi import application

    ana = await database_sync_to_async(_user)(tenant, "ana")
    client = Client()
    await database_sync_to_async(client.force_login)(ana)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    ws = WebsocketCommunicator(
        application, "/ws/alerts?after=0", headers=[*PAGE_HEADERS, (b"cookie", cookie)]
    )
    await ws.connect(timeout=10)
    assert (await _json(ws))["type"] == "catch_up"
    await ws.disconnect()
    anonymous = WebsocketCommunicator(application, "/ws/alerts?after=0", headers=PAGE_HEADERS)
    await anonymous.connect(timeout=10)
    assert (await anonymous.receive_output(timeout=2))["code"] == 4401
    await asyncio.sleep(0)


@socket_db
@socket_test
async def test_an_idle_socket_on_redis_still_gets_the_next_alert(tenant, needs_redis):
    """The Redis channel layer blocks up to 5 s per read (BZPOPMIN): the client's socket timeout
    must be longer, or every idle page is torn down and reconnects every 5 s (redis-py 8 made 5 s
    its default)."""
    user = await database_sync_to_async(_user)(tenant, "ana")
    ws = _socket(user)
    assert (await ws.connect(timeout=10))[0]
    await asyncio.sleep(7)
    await database_sync_to_async(_ingest)(tenant, _loop("after-a-quiet-while"))
    message = await _json(ws)
    assert message["alert"]["run_id"] == "after-a-quiet-while"
    await ws.disconnect()


@socket_db
@socket_test
async def test_a_socket_follows_the_users_memberships(tenant, other_tenant, monkeypatch):
    monkeypatch.setattr(consumers, "ACCESS_CHECK_S", 0.2)
    user = await database_sync_to_async(_user)(tenant, "ana")
    ws = _socket(user)
    await ws.connect(timeout=10)
    await database_sync_to_async(Membership.objects.filter(user=user).delete)()
    await database_sync_to_async(Membership.objects.create)(user=user, tenant=other_tenant)
    await asyncio.sleep(1)  # a few checks
    await database_sync_to_async(_ingest)(tenant, _loop("no-longer-mine"))
    await database_sync_to_async(_ingest)(other_tenant, _loop("now-mine"))
    assert (await _json(ws))["alert"]["run_id"] == "now-mine"
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


@socket_db
@socket_test
async def test_a_socket_is_closed_when_its_session_ends(tenant, monkeypatch):
    from loopwatch.asgi import application

    monkeypatch.setattr(consumers, "ACCESS_CHECK_S", 0.2)
    ana = await database_sync_to_async(_user)(tenant, "ana")
    client = Client()
    await database_sync_to_async(client.force_login)(ana)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    ws = WebsocketCommunicator(application, "/ws/alerts", headers=[*PAGE_HEADERS, (b"cookie", cookie)])
    assert (await ws.connect(timeout=10))[0]
    await database_sync_to_async(client.logout)()
    closed = await ws.receive_output(timeout=5)
    assert (closed["type"], closed["code"]) == ("websocket.close", 4401)
    await ws.disconnect()


@socket_db
@socket_test
async def test_a_socket_is_closed_when_its_session_expires(tenant, monkeypatch):
    from django.contrib.sessions.models import Session

    from loopwatch.asgi import application

    monkeypatch.setattr(consumers, "ACCESS_CHECK_S", 0.2)
    ana = await database_sync_to_async(_user)(tenant, "ana")
    client = Client()
    await database_sync_to_async(client.force_login)(ana)
    key = client.cookies["sessionid"].value
    ws = WebsocketCommunicator(
        application, "/ws/alerts", headers=[*PAGE_HEADERS, (b"cookie", f"sessionid={key}".encode())]
    )
    assert (await ws.connect(timeout=10))[0]
    # Not signed out: the session's time is up (its row stays until clearsessions).
    await database_sync_to_async(Session.objects.filter(session_key=key).update)(
        expire_date=timezone.now() - timedelta(minutes=1)
    )
    closed = await ws.receive_output(timeout=5)
    assert (closed["type"], closed["code"]) == ("websocket.close", 4401)
    await ws.disconnect()


@pytest.mark.django_db
def test_a_kind_in_shadow_is_listed_as_what_it_would_have_done(
    client, tenant, django_capture_on_commit_callbacks
):
    from ingest.models import ThresholdSet

    ThresholdSet.objects.create(tenant=tenant, values={"mode_exact_repeat": "shadow"})
    with django_capture_on_commit_callbacks(execute=True):
        _ingest(tenant, _loop("shadowed-1"))
    shadowed = Detection.objects.get(tenant=tenant, evidence__has_key="shadow")
    plain = Detection.objects.exclude(pk=shadowed.pk).get(tenant=tenant, action="observe")
    client.force_login(_user(tenant, "ana"))
    page = client.get(URL).content.decode()
    incident = Incident.objects.get(run_id=shadowed.run_id)
    assert (incident.action, incident.shadow) == ("observe", "correct")
    row = page.split(f'id="incident-{incident.pk}"')[1].split("</tr>")[0]
    assert "would have corrected" in row and "pill act-observe shadow" in row
    assert Incident.objects.filter(tenant=tenant).count() == 1  # an observation that was never more: none
    assert plain.kind == incident.kind
    filters = AlertFilters.parse({})
    alert = {"action": "observe", "shadow": "correct", "kind": "exact_repeat"}
    assert filters.matches(alert) and not filters.matches({**alert, "shadow": ""})
