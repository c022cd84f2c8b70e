"""POST /api/v1/events: verdicts, storage, limits, keys and tenants."""

from __future__ import annotations

import json
from decimal import Decimal

import orjson
import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ingest.models import ApiKey, Backend, Event, ModelPrice, Run, RunCursor, ToolCall
from ingest.services import api_key_create, api_key_revoke
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result, with_ids

URL = "/api/v1/events"
pytestmark = pytest.mark.django_db


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant)


def test_it_stores_a_run_and_keeps_its_figures_current(api, key, tenant):
    batch = [
        run_started(budgets={"max_rounds": 5}, labels={"prompt_version": "7"}),
        model_round(n=1, cost_usd=0.25),
        tool_call(call_id="c1"),
        tool_result(call_id="c1"),
        model_round(n=2, cost_usd=0.5),
        tool_call(call_id="c2", n=2),
        tool_result(call_id="c2", n=2, status="error", error_class="not_found"),
    ]
    response = api.post(URL, batch, key)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["accepted"], body["duplicate"], body["rejected"]) == (7, 0, 0)
    assert [v["status"] for v in body["results"]] == ["accepted"] * 7
    run = Run.objects.get(tenant=tenant, run_id="r1")
    assert (run.rounds, run.tool_calls, run.tool_errors) == (2, 2, 1)
    assert (run.input_tokens, run.output_tokens) == (2000, 200)
    assert run.cost_usd == pytest.approx(0.75)
    assert run.budgets == {"max_rounds": 5} and run.labels == {"prompt_version": "7"}
    assert (run.backend, run.model, run.agent, run.task_type) == ("openai", "gpt-4o", "shop", "order_lookup")
    assert run.status == "running" and run.finished_at is None
    assert list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True)) == list(
        range(1, 8)
    )

    response = api.post(
        URL, [run_finished(status="truncated", terminated_by="budget", budget_type="max_rounds")], key
    )
    run.refresh_from_db()
    assert (run.status, run.terminated_by, run.budget_type) == ("truncated", "budget", "max_rounds")
    assert run.finished_at is not None and run.events_count == 8


def test_it_prices_rounds_without_a_cost_from_the_table_with_the_backend_markup(api, key, tenant):
    backend = Backend.objects.create(name="deepseek", markup=Decimal("1.3"))
    ModelPrice.objects.create(
        backend=backend, model="deepseek-chat", input_usd_per_mtok=1, output_usd_per_mtok=4
    )
    ModelPrice.objects.create(backend=backend, model="", input_usd_per_mtok=10, output_usd_per_mtok=10)
    api.post(URL, [run_started(backend="deepseek", model="deepseek-chat"), model_round()], key)
    api.post(URL, [run_started("r2", backend="deepseek", model="other"), model_round("r2")], key)
    # 1000 in x $1 + 100 out x $4 per Mtok = $0.0014, x 1.3
    assert Run.objects.get(run_id="r1").cost_usd == pytest.approx(0.0014 * 1.3)
    # the backend's default price (blank model) for an unlisted model
    assert Run.objects.get(run_id="r2").cost_usd == pytest.approx(1100 * 10 / 1e6 * 1.3)
    stored = ToolCall.objects.count(), Run.objects.get(run_id="r1").model_rounds.get()
    assert stored[1].cost_computed and stored[1].cost_usd == pytest.approx(0.0014 * 1.3)


def test_a_mixed_batch_stores_the_valid_events_and_names_each_bad_field(api, key):
    batch = [
        run_started(),
        tool_call(args=["not", "an", "object"]),
        model_round(),
        {"type": "model_round", "run_id": "r1"},
        "not an event",
        tool_call(call_id="c9"),
    ]
    response = api.post(URL, batch, key)
    assert response.status_code == 207
    body = response.json()
    assert (body["accepted"], body["rejected"]) == (3, 3)
    verdicts = body["results"]
    assert [v["status"] for v in verdicts] == [
        "accepted",
        "rejected",
        "accepted",
        "rejected",
        "rejected",
        "accepted",
    ]
    assert verdicts[1]["error"] == "[1].args: must be an object, not an array"
    assert verdicts[1]["field"] == "[1].args"
    assert verdicts[3]["error"] == "[3].ts: is required"
    assert verdicts[4]["field"] == "[4]"
    assert Event.objects.count() == 3


def test_a_batch_with_every_event_rejected_is_a_422(api, key):
    response = api.post(URL, [{"type": "model_round"}, {}], key)
    assert response.status_code == 422
    assert response.json()["rejected"] == 2
    assert not Run.objects.exists()


def test_a_duplicate_delivery_is_counted_once(api, key):
    batch = with_ids([run_started(), model_round(), tool_call(), tool_result()])
    first = api.post(URL, batch, key).json()
    again = api.post(URL, [*batch, batch[1]], key)
    assert first["accepted"] == 4
    assert again.status_code == 200
    assert again.json()["duplicate"] == 5 and again.json()["accepted"] == 0
    run = Run.objects.get()
    assert (run.events_count, run.rounds, run.tool_calls, run.input_tokens) == (4, 1, 1, 1000)
    within = api.post(URL, with_ids([model_round(n=2)]) * 2, key).json()
    assert [v["status"] for v in within["results"]] == ["accepted", "duplicate"]


def test_ndjson_lines_are_events_and_a_broken_line_is_rejected_alone(api, key):
    lines = [orjson.dumps(e) for e in (run_started(), model_round())]
    body = lines[0] + b"\n{not json\n" + lines[1] + b"\n"
    response = api.post(URL, body, key, content_type="application/x-ndjson")
    assert response.status_code == 207
    verdicts = response.json()["results"]
    assert [v["status"] for v in verdicts] == ["accepted", "rejected", "accepted"]
    assert verdicts[1]["error"].startswith("[1]: not valid JSON")


@pytest.mark.parametrize(
    ("body", "content_type", "status", "error"),
    [
        (b"{oops", "application/json", 400, "invalid_json"),
        (b"", "application/json", 400, "invalid_json"),
        (b'"text"', "application/json", 400, "invalid_batch"),
        (b"[]", "application/json", 400, "empty_batch"),
        (b"\xff\xfe", "application/json", 400, "invalid_json"),
        (b"[]", "text/plain", 415, "unsupported_media_type"),
    ],
)
def test_a_body_that_is_not_a_batch_is_a_4xx_naming_it(api, key, body, content_type, status, error):
    response = api.post(URL, body, key, content_type=content_type)
    assert response.status_code == status
    assert response.json()["error"] == error
    assert response.json()["detail"]


def test_a_single_event_object_is_a_batch_of_one(api, key):
    response = api.post(URL, run_started(), key)
    assert response.status_code == 200 and response.json()["accepted"] == 1


def test_limits_answer_413_and_store_nothing(api, key, settings):
    settings.LOOPWATCH_MAX_BATCH_EVENTS = 3
    response = api.post(URL, [model_round(n=i) for i in range(1, 5)], key)
    assert response.status_code == 413
    assert response.json()["error"] == "too_many_events"
    assert "LOOPWATCH_MAX_BATCH_EVENTS" in response.json()["detail"]

    settings.LOOPWATCH_MAX_BATCH_EVENTS = 100
    settings.LOOPWATCH_MAX_EVENT_BYTES = 2048
    big = tool_result(result="x" * 4000)
    response = api.post(URL, [run_started(), big], key)
    assert response.status_code == 413
    assert response.json()["field"] == "[1]" and response.json()["error"] == "event_too_large"

    settings.LOOPWATCH_MAX_BODY_BYTES = 4096
    response = api.post(URL, [run_started(), tool_result(result="y" * 5000)], key)
    assert response.status_code == 413 and response.json()["error"] == "body_too_large"
    assert not Event.objects.exists() and not Run.objects.exists()


def test_a_nul_character_is_rejected_with_its_path(api, key):
    response = api.post(URL, [run_started(), tool_result(result={"rows": ["ok", "bad\x00"]})], key)
    assert response.status_code == 207
    assert (
        response.json()["results"][1]["error"]
        == "[1].result.rows[1]: must not contain the character U+0000 (NUL)"
    )


def test_a_5000_event_batch_is_stored_whole(api, key, tenant):
    batch = [run_started()]
    for i in range(1, 2500):
        batch += [tool_call(call_id=f"c{i}", n=i), tool_result(call_id=f"c{i}", n=i)]
    batch.append(run_finished())
    assert len(batch) == 5000
    response = api.post(URL, with_ids(batch), key)
    assert response.status_code == 200 and response.json()["accepted"] == 5000
    run = Run.objects.get(tenant=tenant)
    assert run.events_count == 5000 and run.tool_calls == 2499
    assert Event.objects.filter(run=run).count() == 5000
    # detection ran after the commit (eager in tests) and joined every result to its call
    assert RunCursor.objects.get(run=run).position == 5000
    assert ToolCall.objects.filter(run=run, result_status="ok").count() == 2499


# --- keys -----------------------------------------------------------------------------------


def test_it_refuses_a_request_without_a_usable_key(api, key, tenant, make_key):
    assert api.post(URL, [run_started()], None).status_code == 401
    assert api.post(URL, [run_started()], "lw_unknown").status_code == 401
    response = api.post(URL, [run_started()], None, HTTP_AUTHORIZATION="Token abc")
    assert response.status_code == 401 and "Bearer" in response.json()["detail"]
    assert response["WWW-Authenticate"].startswith("Bearer")
    read_only = make_key(tenant, scopes=["read"])
    response = api.post(URL, [run_started()], read_only)
    assert response.status_code == 403 and "'ingest' scope" in response.json()["detail"]
    api_key_revoke(key=ApiKey.objects.get(scopes=["ingest", "read"]))
    assert api.post(URL, [run_started()], key).status_code == 401
    assert not Event.objects.exists()


def test_a_key_is_looked_up_once_per_cache_period_and_revoking_ends_it_at_once(
    key, settings, django_assert_num_queries
):
    from ingest.services.keys import api_key_lookup

    settings.LOOPWATCH_KEY_CACHE_S = 60
    first = api_key_lookup(key)
    with django_assert_num_queries(0):
        assert api_key_lookup(key) == first
    api_key_revoke(key=first)
    assert api_key_lookup(key) is None
    settings.LOOPWATCH_KEY_CACHE_S = 0  # no cache: a revocation by another process counts at once
    fresh, raw = api_key_create(tenant=first.tenant, scopes=["ingest"])
    assert api_key_lookup(raw) == fresh
    ApiKey.objects.filter(pk=fresh.pk).update(revoked_at=timezone.now())
    assert api_key_lookup(raw) is None


def test_only_a_hash_of_the_key_is_stored(key):
    stored = ApiKey.objects.get()
    assert key not in {stored.key_hash, stored.prefix, *map(str, stored.scopes)}
    assert len(stored.key_hash) == 64


# --- tenants ----------------------------------------------------------------------------------


def test_the_same_run_id_in_two_tenants_is_two_runs(api, tenant, other_tenant, make_key):
    key_a, key_b = make_key(tenant), make_key(other_tenant)
    api.post(URL, [run_started(backend="openai"), model_round()], key_a)
    api.post(URL, [run_started(backend="anthropic")], key_b)
    run_a, run_b = Run.objects.get(tenant=tenant), Run.objects.get(tenant=other_tenant)
    assert run_a.pk != run_b.pk
    assert (run_a.backend, run_a.rounds, run_b.backend, run_b.rounds) == ("openai", 1, "anthropic", 0)
    assert api.get("/api/v1/runs/r1", key_a).json()["backend"] == "openai"
    assert api.get("/api/v1/runs/r1", key_b).json()["backend"] == "anthropic"


def test_a_key_reads_nothing_of_another_tenant(api, tenant, other_tenant, make_key):
    key_a, key_b = make_key(tenant), make_key(other_tenant)
    api.post(URL, [run_started("secret-run"), model_round("secret-run")], key_b)
    assert api.get("/api/v1/runs/secret-run", key_a).status_code == 404
    assert api.get("/api/v1/runs/secret-run/events", key_a).status_code == 404
    assert api.get("/api/v1/runs", key_a).json() == []
    assert [r["run_id"] for r in api.get("/api/v1/runs", key_b).json()] == ["secret-run"]
    events = api.get("/api/v1/runs/secret-run/events", key_b).json()
    assert [e["seq"] for e in events] == [1, 2] and events[1]["event"]["type"] == "model_round"


def test_a_run_started_naming_another_tenant_is_rejected(api, tenant, make_key):
    response = api.post(
        URL, [run_started(tenant="globex"), run_started("r2", tenant="acme")], make_key(tenant)
    )
    verdicts = response.json()["results"]
    assert verdicts[0]["error"] == "[0].tenant: must be the API key's tenant 'acme' or left out"
    assert verdicts[1]["status"] == "accepted"
    assert list(Run.objects.values_list("run_id", flat=True)) == ["r2"]


# --- joining results to calls -----------------------------------------------------------------


def test_results_join_the_most_recent_unanswered_call_even_across_batches(api, key):
    api.post(
        URL,
        [run_started(), tool_call(call_id="a", args={"q": 1}), tool_call(call_id="a", args={"q": 2})],
        key,
    )
    api.post(URL, [tool_result(call_id="a", result="second")], key)
    api.post(
        URL, [tool_result(call_id="a", result="first"), tool_result(call_id="late", result="early")], key
    )
    api.post(URL, [tool_call(call_id="late", args={"q": 3})], key)
    calls = {c.args["q"]: c.result for c in ToolCall.objects.all()}
    assert calls == {1: "first", 2: "second", 3: "early"}


# --- nothing gives a 500 ----------------------------------------------------------------------


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.one_of(
                st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)
            ),
            lambda inner: st.one_of(
                st.lists(inner, max_size=4),
                st.dictionaries(
                    st.sampled_from(
                        [
                            "type",
                            "run_id",
                            "ts",
                            "round",
                            "args",
                            "call_id",
                            "status",
                            "tool",
                            "event_id",
                            "x",
                        ]
                    ),
                    inner,
                    max_size=6,
                ),
            ),
            max_leaves=20,
        ).map(lambda value: json.dumps(value).encode()),
    )
)
def test_no_body_gives_a_500(api, key, body):
    response = api.post(URL, body, key)
    assert response.status_code < 500, response.content
