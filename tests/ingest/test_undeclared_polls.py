"""A status poll nobody declared, within its poll budget, is never corrected: whichever way its
events come (REST batch, OTLP spans, the guard asked before each call)."""

from __future__ import annotations

import pytest

from ingest.guard import config_cache_clear
from ingest.models import Detection, Run
from tests.ingest.events import model_round, run_started, ts
from tests.ingest.otlp_spans import genai_agent, genai_chat, genai_tool, recorded, request_bytes

pytestmark = pytest.mark.django_db
POLLS = 12  # under the default poll budget (15 unchanged), over every repeat tolerance (3, 4)
RUNNING = {"export_id": "E-1", "status": "running", "rows": 0}


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant, scopes=("ingest", "ledger"))


def _poll_events(n: int) -> list[dict]:
    """Round n: the model polls get_export_status; no `kind` anywhere."""
    return [
        model_round(n=n),
        {
            "type": "tool_call",
            "run_id": "r1",
            "ts": ts(n),
            "round": n,
            "call_id": f"c{n}",
            "tool": "get_export_status",
            "args": {"export_id": "E-1"},
        },
        {
            "type": "tool_result",
            "run_id": "r1",
            "ts": ts(n),
            "call_id": f"c{n}",
            "status": "ok",
            "result": RUNNING,
        },
    ]


def _interventions(tenant) -> list[tuple[str, str]]:
    return list(
        Detection.objects.filter(run__tenant=tenant).exclude(action="observe").values_list("kind", "action")
    )


def test_over_rest(api, tenant, key):
    events = [run_started()] + [e for n in range(1, POLLS + 1) for e in _poll_events(n)]
    response = api.post("/api/v1/events", events, key)
    assert response.status_code in (200, 207), response.content
    assert Run.objects.get(tenant=tenant).tool_calls == POLLS
    assert _interventions(tenant) == []


def test_over_otlp(api, tenant, key):
    agent, memory = recorded()
    with agent.span("invoke_agent exporter", genai_agent()):
        for _ in range(POLLS):
            agent.leaf("chat gpt-4o", genai_chat())
            agent.leaf(
                "execute_tool get_export_status",
                genai_tool("get_export_status", '{"export_id": "E-1"}', '{"status": "running", "rows": 0}'),
            )
    response = api.post(
        "/v1/traces", request_bytes(memory.get_finished_spans()), key, content_type="application/x-protobuf"
    )
    assert response.status_code == 200, response.content
    assert Run.objects.get(tenant=tenant).tool_calls == POLLS
    assert _interventions(tenant) == []


def test_through_the_guard(api, tenant, key):
    config_cache_clear()
    api.post("/api/v1/events", [run_started()], key)
    for n in range(1, POLLS + 1):
        answer = api.post(
            "/api/v1/runs/r1/check",
            {"tool": "get_export_status", "args": {"export_id": "E-1"}, "round": n, "ts": ts(n)},
            key,
        ).json()
        # Never corrected, never reused (a poll's answer may change), never refused as a write.
        assert answer["decision"] == "allow", (n, answer)
        assert answer["kind"] == "poll" and answer["kind_from"] == "name"
        response = api.post("/api/v1/events", _poll_events(n), key)
        assert response.status_code in (200, 207), response.content
    assert _interventions(tenant) == []
