"""GET /api/v1/incidents and GET /api/v1/runs/{run_id}/detections (read scope), and what a guard
check's answer records as delivered."""

from __future__ import annotations

import re

import pytest

from ingest.models import Detection, Incident
from ingest.services import events_ingest, run_process
from tests.ingest.events import model_round, run_started, tool_call, tool_result
from tests.ingest.test_guard import call, ran

pytestmark = pytest.mark.django_db


def _loop(run_id: str, calls: int, **started) -> list[dict]:
    events = [run_started(run_id, **started)]
    for i in range(1, calls + 1):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i, args={"customer": "42"}),
            tool_result(run_id, f"c{i}", n=i, result={"orders": []}),
        ]
    return events


def _process(tenant, events) -> None:
    for pk in events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20).runs_touched:
        run_process(run_pk=pk)


def test_incidents_page_after_an_id_with_filters(api, tenant, other_tenant, make_key):
    for n in range(5):
        _process(tenant, _loop(f"r{n}", 3, backend="anthropic" if n % 2 else "openai"))
    _process(other_tenant, _loop("theirs", 3))
    key = make_key(tenant, ["read"])
    mine = list(Incident.objects.filter(tenant=tenant).order_by("pk").values_list("pk", flat=True))

    first = api.get("/api/v1/incidents", key, limit="2")
    assert first.status_code == 200, first.content
    assert [i["id"] for i in first.json()] == mine[:2]
    link = re.fullmatch(r'<(/api/v1/incidents\?[^>]+)>; rel="next"', first["Link"]).group(1)
    assert f"after={mine[1]}" in link and "limit=2" in link
    rest = api.get(f"/api/v1/incidents?after={mine[1]}&limit=10", key).json()
    assert [i["id"] for i in rest] == mine[2:]
    assert "theirs" not in {i["run_id"] for i in first.json() + rest}

    body = rest[0]
    assert (body["kind"], body["action"], body["status"], body["guard"]) == (
        "exact_repeat",
        "correct",
        "open",
        False,
    )
    assert body["steps"][0]["action"] == "correct" and body["alerts"] == 1
    anthropic = api.get("/api/v1/incidents", key, backend="anthropic").json()
    assert {i["run_id"] for i in anthropic} == {"r1", "r3"}
    assert api.get("/api/v1/incidents", key, status="resolved").json() == []
    assert len(api.get("/api/v1/incidents", key, status="open", kind="exact_repeat").json()) == 5
    assert api.get("/api/v1/incidents", key, kind="oscillation").json() == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"after": "-1"}, "after"),
        ({"after": "x"}, "after"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"status": "closed"}, "status"),
        ({"kind": "loopy"}, "kind"),
        ({"backend": "b" * 101}, "backend"),
        ({"backend": "a\x00b"}, "backend"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(api, tenant, make_key, params, field):
    response = api.get("/api/v1/incidents", make_key(tenant, ["read"]), **params)
    assert response.status_code == 400 and response.json()["field"] == field


def test_the_read_scope_is_needed(api, tenant, make_key):
    assert api.get("/api/v1/incidents", None).status_code == 401
    assert api.get("/api/v1/incidents", make_key(tenant, ["ingest"])).status_code == 403
    assert api.get("/api/v1/runs/r1/detections", make_key(tenant, ["ingest"])).status_code == 403


def test_a_runs_detections_with_their_incident(api, tenant, other_tenant, make_key):
    _process(tenant, _loop("esc", 12))
    _process(other_tenant, _loop("theirs", 12))
    key = make_key(tenant, ["read"])
    response = api.get("/api/v1/runs/esc/detections", key)
    assert response.status_code == 200, response.content
    body = response.json()
    stored = list(Detection.objects.filter(run__run_id="esc").order_by("seq", "pk"))
    assert [d["id"] for d in body] == [d.pk for d in stored]
    incident = Incident.objects.get(run__run_id="esc")
    assert {d["incident"] for d in body if d["action"] != "observe"} == {incident.pk}
    assert {d["incident"] for d in body if d["action"] == "observe"} == {None}
    assert {d["reached"] for d in body if d["action"] != "observe"} == {"traces"}
    later = api.get("/api/v1/runs/esc/detections", key, after=str(stored[1].seq)).json()
    assert [d["id"] for d in later] == [d.pk for d in stored if d.seq > stored[1].seq]
    # another tenant's run is not known to this key
    assert api.get("/api/v1/runs/theirs/detections", key).status_code == 404
    assert api.get("/api/v1/runs/esc/detections", key, after="-2").json()["field"] == "after"


def test_what_a_guard_check_answered_is_delivered(api, tenant, make_key):
    key = make_key(tenant, ["ingest", "read"])
    events = [run_started(), *ran(1), *ran(2)]
    assert api.post("/api/v1/events", events, key).status_code == 200
    # an hour later: the result is too old to be handed back, so the check corrects
    answer = api.post("/api/v1/runs/r1/check", {**call(3), "ts": "2026-11-29T11:00:00Z"}, key).json()
    assert answer["decision"] == "correct"
    # the runtime traces the call it was told not to run, and runs the next ones unchecked
    later = [tool_call(call_id="c3", n=3, args={"customer": "42"}), *ran(4), *ran(5), *ran(6)]
    assert api.post("/api/v1/events", later, key).status_code == 200
    body = api.get("/api/v1/runs/r1/detections", key).json()
    reached = {d["action"]: d["reached"] for d in body if d["action"] != "observe"}
    assert reached["correct"] == "guard"
    assert set(reached.values()) - {"guard"} == {"traces"}, reached  # later steps only traced
    incident = api.get("/api/v1/incidents", key).json()[0]
    assert incident["guard"] is True


def test_the_openapi_document_has_both_operations(client):
    doc = client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    listed = doc["paths"]["/api/v1/incidents"]["get"]
    assert {"after", "status", "kind", "backend", "limit"} <= {p["name"] for p in listed["parameters"]}
    assert "Link" in listed["responses"]["200"]["headers"]
    assert "get" in doc["paths"]["/api/v1/runs/{run_id}/detections"]
