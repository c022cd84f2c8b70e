"""Detection in the pipeline: stored once, resumed across batches, thresholds resolved, alerts sent."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from ingest.events import ALERT_MESSAGE, alerts_group
from ingest.models import Detection, Run, RunCursor, ThresholdSet, ToolConfig
from ingest.selectors import detection_config
from ingest.services import run_reprocess
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result

URL = "/api/v1/events"
pytestmark = pytest.mark.django_db


def _repeats(n: int, start: int = 1, run_id: str = "r1") -> list[dict]:
    events = []
    for i in range(start, start + n):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i, args={"customer": "42", "request_id": f"q{i}"}),
            tool_result(run_id, f"c{i}", n=i, result={"orders": []}),
        ]
    return events


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant)


def test_a_loop_sent_in_pieces_is_found_once_and_flags_the_run(api, key, tenant):
    api.post(URL, [run_started(), *_repeats(2)], key)
    assert not Detection.objects.exclude(action="observe").exists()
    api.post(URL, _repeats(2, start=3), key)  # the engine resumes its state from the cursor
    found = list(
        Detection.objects.filter(run__tenant=tenant).order_by("seq").values_list("kind", "action", "at_call")
    )
    assert found == [("exact_repeat", "observe", 2), ("exact_repeat", "correct", 3)]
    detection = Detection.objects.get(action="correct")
    assert (detection.backend, detection.model, detection.task_type, detection.tool) == (
        "openai",
        "gpt-4o",
        "order_lookup",
        "search_orders",
    )
    assert "search_orders 3 times" in detection.hint
    run = Run.objects.get(tenant=tenant)
    assert run.loop_flagged and run.max_action == "correct" and run.detections_count == 2
    assert run.first_loop_at == detection.ts


def test_processing_a_run_again_stores_nothing_twice(api, key, tenant):
    api.post(URL, [run_started(), *_repeats(4)], key)
    before = Detection.objects.count()
    assert run_reprocess(run_pk=Run.objects.get().pk) == 13
    assert Detection.objects.count() == before > 0
    assert RunCursor.objects.get().position == 13


def test_a_budget_the_engine_saw_run_out_ends_the_run(api, key, tenant):
    events = [run_started(budgets={"max_tool_calls": 2})]
    for i in range(1, 4):
        events += [
            tool_call(call_id=f"c{i}", n=i, args={"path": f"f{i}"}),
            tool_result(call_id=f"c{i}", n=i, result=str(i)),
        ]
    api.post(URL, events, key)
    run = Run.objects.get()
    assert (run.terminated_by, run.budget_type) == ("budget", "max_tool_calls")
    budget = Detection.objects.get(kind="budget")
    assert budget.action == "terminate" and budget.evidence["limit"] == 2
    # the runtime's own account, when it comes, wins
    api.post(URL, [run_finished(status="truncated", terminated_by="budget", budget_type="max_rounds")], key)
    run.refresh_from_db()
    assert run.budget_type == "max_rounds"


def test_thresholds_resolve_model_over_backend_over_task_type_over_global(tenant):
    run = Run.objects.create(
        tenant=tenant, run_id="x", backend="openai", model="gpt-4o", task_type="research"
    )
    assert detection_config(run=run).thresholds.repeat_tolerance == 3
    ThresholdSet.objects.create(values={"repeat_tolerance": 4, "no_progress_steps": 20})
    ThresholdSet.objects.create(task_type="research", values={"repeat_tolerance": 5, "no_progress_steps": 30})
    assert detection_config(run=run).thresholds.repeat_tolerance == 5
    ThresholdSet.objects.create(backend="openai", values={"repeat_tolerance": 6})
    ThresholdSet.objects.create(backend="openai", model="gpt-4o", values={"repeat_tolerance": 7})
    ThresholdSet.objects.create(backend="anthropic", values={"repeat_tolerance": 9})
    config = detection_config(run=run)
    assert (config.thresholds.repeat_tolerance, config.thresholds.no_progress_steps) == (7, 30)


def test_a_tenants_own_thresholds_and_tools_win_and_stay_its_own(tenant, other_tenant):
    mine = Run.objects.create(tenant=tenant, run_id="x", backend="openai", model="gpt-4o")
    theirs = Run.objects.create(tenant=other_tenant, run_id="x", backend="openai", model="gpt-4o")
    ThresholdSet.objects.create(backend="openai", model="gpt-4o", values={"repeat_tolerance": 7})
    ThresholdSet.objects.create(tenant=tenant, values={"repeat_tolerance": 4})
    ToolConfig.objects.create(name="search", kind="read", core_args=["q"])
    ToolConfig.objects.create(tenant=tenant, name="search", kind="poll")
    # the tenant's global row beats the shared (backend, model) row; the other tenant never sees it
    assert detection_config(run=mine).thresholds.repeat_tolerance == 4
    assert detection_config(run=theirs).thresholds.repeat_tolerance == 7
    assert detection_config(run=mine).tools["search"].kind == "poll"
    assert detection_config(run=theirs).tools["search"].core_args == ("q",)


def test_per_backend_thresholds_change_what_fires(api, key):
    ThresholdSet.objects.create(backend="openai", values={"repeat_tolerance": 4})
    api.post(URL, [run_started(), *_repeats(4)], key)
    assert Detection.objects.get(action="correct").at_call == 4


def test_an_intervention_is_published_to_the_tenants_group(api, key, tenant, other_tenant):
    layer = get_channel_layer()
    mine = async_to_sync(layer.new_channel)()
    theirs = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(alerts_group(tenant.pk), mine)
    async_to_sync(layer.group_add)(alerts_group(other_tenant.pk), theirs)
    try:
        api.post(URL, [run_started(), *_repeats(3)], key)
        message = async_to_sync(layer.receive)(mine)
        assert message["type"] == ALERT_MESSAGE
        alert = message["alert"]
        assert (alert["run_id"], alert["kind"], alert["action"], alert["at_call"]) == (
            "r1",
            "exact_repeat",
            "correct",
            3,
        )
        assert alert["id"] == Detection.objects.get(action="correct").pk
        import asyncio

        async def nothing_for_them():
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(layer.receive(theirs), timeout=0.5)

        async_to_sync(nothing_for_them)()
    finally:
        async_to_sync(layer.group_discard)(alerts_group(tenant.pk), mine)
        async_to_sync(layer.group_discard)(alerts_group(other_tenant.pk), theirs)


def test_a_threshold_row_that_is_not_an_object_is_skipped_not_fatal(tenant, other_tenant):
    from ingest.selectors import configs_for

    ThresholdSet.objects.create(tenant=other_tenant, values=["not", "an", "object"])
    ThresholdSet.objects.create(values={"repeat_tolerance": 4})
    scopes = {(tenant.pk, "openai", "gpt-4o", "default"), (other_tenant.pk, "openai", "gpt-4o", "default")}
    configs = configs_for(scopes=scopes)  # one pass for both tenants: the bad row spoils neither
    assert {scope: c.thresholds.repeat_tolerance for scope, c in configs.items()} == dict.fromkeys(scopes, 4)
