"""Rollout modes in the pipeline: a kind in shadow is stored as observe with what it would have done
and published as such; a kind operators judged wrong too often goes back to shadow on its own."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from ingest.events import alerts_group
from ingest.models import Detection, Run, ThresholdSet
from ingest.selectors import MIN_VERDICTS, config_for, kind_verdicts, verdict_rows
from tests.ingest.events import model_round, run_started, tool_call, tool_result

URL = "/api/v1/events"
pytestmark = pytest.mark.django_db


def _repeats(n: int, run_id: str = "r1") -> list[dict]:
    events = [run_started(run_id)]
    for i in range(1, n + 1):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i, args={"customer": "42"}),
            tool_result(run_id, f"c{i}", n=i, result={"orders": []}),
        ]
    return events


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant)


def test_a_kind_in_shadow_is_recorded_and_published_as_what_it_would_have_done(api, key, tenant):
    ThresholdSet.objects.create(tenant=tenant, values={"mode_exact_repeat": "shadow"})
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(alerts_group(tenant.pk), channel)
    try:
        api.post(URL, _repeats(4), key)
        alert = async_to_sync(layer.receive)(channel)["alert"]
    finally:
        async_to_sync(layer.group_discard)(alerts_group(tenant.pk), channel)
    assert not Detection.objects.exclude(action="observe").exists()
    shadowed = Detection.objects.get(evidence__has_key="shadow")
    assert (shadowed.kind, shadowed.action, shadowed.evidence["shadow"]) == (
        "exact_repeat",
        "observe",
        "correct",
    )
    assert (alert["id"], alert["action"], alert["shadow"]) == (shadowed.pk, "observe", "correct")
    run = Run.objects.get(tenant=tenant)
    assert not run.loop_flagged and run.first_loop_at is None  # nothing was acted on


def test_correct_only_never_hands_off(api, key, tenant):
    ThresholdSet.objects.create(tenant=tenant, backend="openai", values={"mode_exact_repeat": "correct-only"})
    api.post(URL, _repeats(8), key)
    actions = list(Detection.objects.exclude(action="observe").values_list("action", flat=True))
    assert actions and set(actions) == {"correct"}
    assert Run.objects.get(tenant=tenant).max_action == "correct"


def _verdicts(tenant, *, true_loops: int, false_alarms: int, kind="exact_repeat", backend="openai") -> None:
    run = Run.objects.create(tenant=tenant, run_id=f"judged-{kind}-{backend}", backend=backend)
    from django.utils import timezone

    for n in range(true_loops + false_alarms):
        Detection.objects.create(
            tenant=tenant,
            run=run,
            seq=n + 1,
            kind=kind,
            action="correct",
            signature=f"s{n}",
            backend=backend,
            model="gpt-4o",
            task_type="order_lookup",
            ts=timezone.now(),
            feedback="true_loop" if n < true_loops else "false_alarm",
        )


def test_a_kind_operators_judged_wrong_too_often_goes_back_to_shadow(tenant, other_tenant):
    _verdicts(tenant, true_loops=3, false_alarms=MIN_VERDICTS)
    scope = {"backend": "openai", "model": "gpt-4o", "task_type": "order_lookup"}
    assert config_for(tenant_id=tenant.pk, **scope).thresholds.mode("exact_repeat") == "shadow"
    # Its verdicts are the tenant's own: another tenant's kind stays as it was.
    assert config_for(tenant_id=other_tenant.pk, **scope).thresholds.mode("exact_repeat") == "full"
    # Other kinds are not touched; and a row that sets the mode is an operator's decision.
    assert config_for(tenant_id=tenant.pk, **scope).thresholds.mode("repeated_error") == "full"
    ThresholdSet.objects.create(tenant=tenant, backend="openai", values={"mode_exact_repeat": "full"})
    assert config_for(tenant_id=tenant.pk, **scope).thresholds.mode("exact_repeat") == "full"


def test_verdicts_come_from_the_most_specific_scope_that_has_enough(tenant):
    _verdicts(tenant, true_loops=MIN_VERDICTS, false_alarms=0, backend="openai")
    _verdicts(tenant, true_loops=1, false_alarms=MIN_VERDICTS, backend="local")
    rows = verdict_rows(tenant_ids=[tenant.pk])[tenant.pk]
    local = kind_verdicts(rows, kind="exact_repeat", backend="local", model="gpt-4o")
    assert (local.scope, local.true_loops, local.false_alarms, local.low) == (
        "local/gpt-4o",
        1,
        MIN_VERDICTS,
        True,
    )
    good = kind_verdicts(rows, kind="exact_repeat", backend="openai")
    assert (good.scope, good.precision, good.low) == ("backend openai", 1.0, False)
    few = kind_verdicts(rows, kind="exact_repeat", backend="mistral")  # none of its own: everyone's
    assert few.scope == "global" and few.total == 2 * MIN_VERDICTS + 1
    scope = {"model": "gpt-4o", "task_type": "order_lookup"}
    assert (
        config_for(tenant_id=tenant.pk, backend="local", **scope).thresholds.mode("exact_repeat") == "shadow"
    )
    assert (
        config_for(tenant_id=tenant.pk, backend="openai", **scope).thresholds.mode("exact_repeat") == "full"
    )
