"""Threshold admin: tenant rows over shared ones, validation per field, history, and the preview."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboards.models import ConfigChange, Membership
from dashboards.thresholds.preview import preview_replay
from dashboards.thresholds.selectors import (
    config_resolve,
    threshold_rows,
    thresholds_resolve,
    tool_rows,
    tool_specs,
)
from ingest.detection import Thresholds
from ingest.models import Detection, Event, Reconciler, Run, ThresholdSet, ToolConfig
from ingest.selectors import config_for
from ingest.services import events_ingest, run_process
from tests.ingest.events import model_round, run_started, tool_call, tool_result

pytestmark = pytest.mark.django_db


def _member(tenant, name, role="admin"):
    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def _client(user, csrf=False):
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def _repeating_run(tenant, run_id, calls=4, backend="openai", model="gpt-4o", task_type="order_lookup"):
    """`calls` identical reads with one unchanged result: exact_repeat corrects the 3rd by default."""
    events = [run_started(run_id, backend=backend, model=model, task_type=task_type)]
    for i in range(1, calls + 1):
        events += [
            model_round(run_id, i),
            tool_call(run_id, f"c{i}", i),
            tool_result(run_id, f"c{i}", i, result={"orders": [1]}),
        ]
    return _stored(tenant, run_id, events)


def _quiet_run(tenant, run_id, backend="openai"):
    """Reads that each bring something new: nothing fires."""
    events = [run_started(run_id, backend=backend)]
    for i in range(1, 4):
        events += [
            model_round(run_id, i),
            tool_call(run_id, f"c{i}", i, args={"customer": str(i)}),
            tool_result(run_id, f"c{i}", i, result={"orders": [i * 7]}),
        ]
    return _stored(tenant, run_id, events)


def _stored(tenant, run_id, events):
    # The test's transaction never commits, so the detection queued on commit is run here.
    events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)
    run = Run.objects.get(tenant=tenant, run_id=run_id)
    run_process(run_pk=run.pk)
    return run


# --- selectors: the in-memory resolution is config_for's ------------------------------------------


@pytest.mark.parametrize(
    "scope",
    [
        ("openai", "gpt-4o", "order_lookup"),
        ("openai", "", "faq"),
        ("anthropic", "claude", "order_lookup"),
        ("", "", ""),
    ],
)
def test_the_resolution_is_the_pipelines(tenant, other_tenant, scope):
    ThresholdSet.objects.create(values={"repeat_tolerance": 4, "max_rounds": 90})
    ThresholdSet.objects.create(backend="openai", values={"repeat_tolerance": 5, "count_by_round": True})
    ThresholdSet.objects.create(
        task_type="order_lookup", values={"no_progress_steps": 20, "repeat_tolerance": 6}
    )
    ThresholdSet.objects.create(tenant=tenant, values={"max_rounds": 70})
    ThresholdSet.objects.create(tenant=tenant, backend="openai", model="gpt-4o", values={"similarity": 0.9})
    ThresholdSet.objects.create(tenant=tenant, task_type="order_lookup", values={"max_tool_calls": 40})
    ThresholdSet.objects.create(tenant=other_tenant, values={"max_rounds": 3})
    ToolConfig.objects.create(name="search", core_args=["q"])
    ToolConfig.objects.create(tenant=tenant, name="search", core_args=["query"])
    backend, model, task_type = scope
    expected = config_for(tenant_id=tenant.pk, backend=backend, model=model, task_type=task_type)
    rows = threshold_rows(tenant=tenant)
    got = config_resolve(
        rows, tool_specs(tool_rows(tenant=tenant)), backend=backend, model=model, task_type=task_type
    )
    assert got == expected


def test_sources_say_where_each_value_comes_from(tenant):
    ThresholdSet.objects.create(backend="openai", values={"repeat_tolerance": 5})
    ThresholdSet.objects.create(tenant=tenant, backend="openai", model="gpt-4o", values={"similarity": 0.9})
    resolved = thresholds_resolve(
        threshold_rows(tenant=tenant), backend="openai", model="gpt-4o", task_type="x"
    )
    assert resolved.sources["repeat_tolerance"] == "shared backend openai"
    assert resolved.sources["similarity"] == "openai/gpt-4o"
    assert resolved.sources["max_rounds"] == "default"


# --- preview ---------------------------------------------------------------------------------------


def test_raising_repeat_tolerance_makes_a_run_lose_its_intervention_and_writes_nothing(tenant):
    loop = _repeating_run(tenant, "loop")
    _quiet_run(tenant, "quiet")
    Detection.objects.filter(run=loop, action="correct").update(feedback="false_alarm")
    runs = Run.objects.filter(tenant=tenant)
    counts = (Run.objects.count(), Event.objects.count(), Detection.objects.count())
    with CaptureQueriesContext(connection) as queries:
        preview = preview_replay(
            runs=runs,
            limit=200,
            current=lambda run: config_resolve(
                [], {}, backend=run.backend, model=run.model, task_type=run.task_type
            ),
            proposed=lambda run: config_resolve(
                [ThresholdSet(values={"repeat_tolerance": 5})],
                {},
                backend=run.backend,
                model=run.model,
                task_type=run.task_type,
            ),
        )
    assert not [
        q["sql"] for q in queries.captured_queries if q["sql"].split()[0] in ("INSERT", "UPDATE", "DELETE")
    ]
    assert (Run.objects.count(), Event.objects.count(), Detection.objects.count()) == counts
    assert (preview.runs, preview.replayed, preview.before_interventions, preview.after_interventions) == (
        2,
        2,
        1,
        0,
    )
    [change] = preview.changes
    assert (change.run.run_id, change.change, change.feedback) == ("loop", "loses", "false_alarm")
    assert (change.before.kind, change.before.action, change.before.at_round) == (
        "exact_repeat",
        "correct",
        3,
    )
    assert change.after is None and preview.false_alarms_fixed == 1 and preview.true_loops_lost == 0
    assert preview.verdicts == [("false_alarm", True, False)] and preview.false_alarms_still_firing == 0


def test_lowering_repeat_tolerance_moves_the_first_intervention_earlier(tenant):
    _repeating_run(tenant, "loop")
    preview = preview_replay(
        runs=Run.objects.filter(tenant=tenant),
        limit=10,
        current=lambda run: config_resolve(
            [], {}, backend=run.backend, model=run.model, task_type=run.task_type
        ),
        proposed=lambda run: config_resolve(
            [ThresholdSet(values={"repeat_tolerance": 2})],
            {},
            backend=run.backend,
            model=run.model,
            task_type=run.task_type,
        ),
    )
    [change] = preview.changes
    assert change.change == "earlier" and (change.before.at_call, change.after.at_call) == (3, 2)


def test_the_preview_respects_rollout_modes(tenant):
    _repeating_run(tenant, "loop", calls=8)
    # In shadow the kind loses its interventions; correct-only keeps the first, never the hand-off.
    shadow = _mode_preview(tenant, "shadow")
    [change] = shadow.changes
    assert (change.change, change.after) == ("loses", None)
    capped = _mode_preview(tenant, "correct-only")
    [change] = capped.changes
    assert (change.change, change.before.strongest, change.after.strongest) == (
        "weaker",
        "terminate",
        "correct",
    )


def _mode_preview(tenant, mode: str):
    return preview_replay(
        runs=Run.objects.filter(tenant=tenant),
        limit=10,
        current=lambda run: config_resolve(
            [], {}, backend=run.backend, model=run.model, task_type=run.task_type
        ),
        proposed=lambda run: config_resolve(
            [ThresholdSet(values={"mode_exact_repeat": mode})],
            {},
            backend=run.backend,
            model=run.model,
            task_type=run.task_type,
        ),
    )


def test_the_page_shows_each_kinds_mode_and_its_precision_per_scope(client, tenant):
    loop = _repeating_run(tenant, "loop")
    other = _repeating_run(tenant, "other", backend="anthropic", model="claude")
    # Operators called the openai correction a true loop; ten of anthropic's false alarms.
    Detection.objects.filter(run=loop, action="correct").update(feedback="true_loop")
    from django.utils import timezone

    for n in range(10):
        Detection.objects.create(
            tenant=tenant,
            run=other,
            seq=100 + n,
            kind="exact_repeat",
            action="correct",
            signature=f"x{n}",
            backend="anthropic",
            model="claude",
            task_type="order_lookup",
            ts=timezone.now(),
            feedback="false_alarm",
        )
    ThresholdSet.objects.create(
        tenant=tenant, task_type="order_lookup", values={"mode_clarification": "correct-only"}
    )
    client.force_login(_member(tenant, "vic", "viewer"))
    page = client.get(
        f"/thresholds/{tenant.slug}/?backend=anthropic&model=claude&task_type=order_lookup"
    ).content.decode()
    table = page.split('id="kind-modes"')[1].split("</table>")[0]
    row = table.split('data-kind="exact_repeat"')[1].split("</tr>")[0]
    assert "<b>shadow</b>" in row and "measured: precision 0.00 over 10 verdicts (anthropic/claude)" in row
    assert ">0<" in row and ">10<" in row and "keep in shadow" in row
    clarification = table.split('data-kind="clarification"')[1].split("</tr>")[0]
    assert "<b>correct-only</b>" in clarification and "task type order_lookup" in clarification
    mine = client.get(f"/thresholds/{tenant.slug}/?backend=openai&model=gpt-4o").content.decode()
    row = mine.split('id="kind-modes"')[1].split('data-kind="exact_repeat"')[1].split("</tr>")[0]
    # openai's one verdict is too few: the tenant's verdicts in all decide, and 1 of 11 is low.
    assert "<b>shadow</b>" in row and "(global)" in row


def test_a_mode_is_set_in_the_form_like_any_threshold(tenant):
    client = _client(_member(tenant, "ana"))
    form = {"backend": "openai", "mode_monologue": "shadow", "preview_runs": "10"}
    page = client.get(f"/thresholds/{tenant.slug}/sets/new/").content.decode()
    assert 'name="mode_monologue"' in page and "Rollout modes" in page
    bad = client.post(
        f"/thresholds/{tenant.slug}/sets/new/", {**form, "mode_monologue": "off", "intent": "save"}
    )
    assert bad.status_code == 400 and "mode_monologue" in bad.content.decode()
    assert client.post(f"/thresholds/{tenant.slug}/sets/new/", {**form, "intent": "save"}).status_code == 302
    assert ThresholdSet.objects.get().values == {"mode_monologue": "shadow"}
    scope = {"model": "", "task_type": "x"}
    assert config_for(tenant_id=tenant.pk, backend="openai", **scope).thresholds.mode("monologue") == "shadow"


# --- pages -----------------------------------------------------------------------------------------


def test_the_page_shows_shared_rows_as_inherited_and_the_tools_reconciler_read_only(client, tenant):
    ThresholdSet.objects.create(backend="openai", values={"repeat_tolerance": 5})
    ToolConfig.objects.create(name="refund", kind="write", core_args=["payment"])
    Reconciler.objects.create(
        tenant=tenant, tool="refund", url_template="https://psp.example/refunds/{operation_key}"
    )
    client.force_login(_member(tenant, "vic", "viewer"))
    page = client.get(f"/thresholds/{tenant.slug}/?backend=openai").content.decode()
    assert "inherited: shared backend openai" in page and "shared (staff)" in page
    assert "https://psp.example/refunds/{operation_key}" in page and "only staff configure them" in page
    assert "override for" not in page and 'id="add-thresholds"' not in page  # a viewer reads only
    assert client.get("/thresholds/").headers["Location"] == f"/thresholds/{tenant.slug}/"


def test_another_tenants_reconciler_is_not_shown(client, tenant, other_tenant):
    ToolConfig.objects.create(name="refund", kind="write")  # a shared tool: both tenants see it
    Reconciler.objects.create(
        tenant=other_tenant, tool="refund", url_template="https://globex-internal.example/r/{operation_key}"
    )
    client.force_login(_member(tenant, "vic", "viewer"))
    page = client.get(f"/thresholds/{tenant.slug}/").content.decode()
    assert "refund" in page and "globex-internal" not in page


def test_another_tenant_is_not_found(client, tenant, other_tenant):
    theirs = ThresholdSet.objects.create(tenant=other_tenant, values={"max_rounds": 9})
    tool = ToolConfig.objects.create(tenant=other_tenant, name="secret_tool")
    shared = ThresholdSet.objects.create(values={"max_rounds": 8})
    client.force_login(_member(tenant, "ana"))
    assert client.get(f"/thresholds/{other_tenant.slug}/").status_code == 404
    assert client.get(f"/thresholds/{tenant.slug}/sets/{theirs.pk}/").status_code == 404
    assert client.get(f"/thresholds/{tenant.slug}/tools/{tool.pk}/").status_code == 404
    assert client.get(f"/thresholds/{tenant.slug}/sets/{shared.pk}/").status_code == 404  # staff's, not here
    response = client.post(f"/thresholds/{tenant.slug}/sets/{theirs.pk}/", {"intent": "delete"})
    assert response.status_code == 404 and ThresholdSet.objects.filter(pk=theirs.pk).exists()
    assert "secret_tool" not in client.get(f"/thresholds/{tenant.slug}/").content.decode()


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_admins_change_settings(tenant, role):
    row = ThresholdSet.objects.create(tenant=tenant, values={"max_rounds": 9})
    client = _client(_member(tenant, "olly", role))
    assert client.get(f"/thresholds/{tenant.slug}/sets/{row.pk}/").status_code == 200
    for path, data in [
        (f"/thresholds/{tenant.slug}/sets/new/", {"repeat_tolerance": "4", "intent": "save"}),
        (f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"intent": "delete"}),
        (f"/thresholds/{tenant.slug}/tools/new/", {"name": "x", "intent": "save"}),
    ]:
        assert client.post(path, data).status_code == 403
    assert (
        ThresholdSet.objects.count() == 1
        and not ToolConfig.objects.exists()
        and not ConfigChange.objects.exists()
    )


def test_invalid_values_are_named_per_field(tenant):
    client = _client(_member(tenant, "ana"))
    response = client.post(
        f"/thresholds/{tenant.slug}/sets/new/",
        {
            "repeat_tolerance": "1",
            "similarity": "1.5",
            "max_rounds": "lots",
            "model": "gpt-4o",
            "intent": "save",
        },
    )
    page = response.content.decode()
    assert response.status_code == 400
    assert "max_rounds: Enter a whole number." in page
    page = client.post(
        f"/thresholds/{tenant.slug}/sets/new/", {"max_tokens": str(2**40), "intent": "preview"}
    ).content.decode()
    assert "max_tokens: Ensure this value is less than or equal to 2147483647." in page
    client_page = client.post(
        f"/thresholds/{tenant.slug}/sets/new/",
        {"repeat_tolerance": "1", "similarity": "1.5", "intent": "save"},
    ).content.decode()
    assert (
        "repeat_tolerance: must be at least 2" in client_page
        and "similarity: must be between 0.5 and 1" in client_page
    )
    page = client.post(
        f"/thresholds/{tenant.slug}/sets/new/", {"model": "gpt-4o", "max_rounds": "50", "intent": "save"}
    ).content.decode()
    assert "model: a model threshold needs its backend" in page
    page = client.post(f"/thresholds/{tenant.slug}/sets/new/", {"intent": "save"}).content.decode()
    assert "Nothing to override" in page
    assert not ThresholdSet.objects.exists() and not ConfigChange.objects.exists()


def test_preview_then_save_records_who_changed_what(tenant):
    loop = _repeating_run(tenant, "loop-1")
    _repeating_run(tenant, "other-backend", backend="anthropic")
    Detection.objects.filter(run=loop, action="correct").update(feedback="true_loop")
    client = _client(_member(tenant, "ana"))
    form = {
        "backend": "openai",
        "repeat_tolerance": "5",
        "count_by_round": "true",
        "note": "gpt-4o batches",
        "preview_runs": "200",
    }
    response = client.post(f"/thresholds/{tenant.slug}/sets/new/", {**form, "intent": "preview"})
    page = response.content.decode()
    assert response.status_code == 200 and not ThresholdSet.objects.exists()
    assert 'data-run="loop-1"' in page and 'data-run="other-backend"' not in page  # only that backend's runs
    assert (
        'id="preview-loses">1<' in page
        and 'id="preview-true-loops-lost">1<' in page
        and "feedback-true_loop" in page
    )
    response = client.post(f"/thresholds/{tenant.slug}/sets/new/", {**form, "intent": "save"})
    assert response.status_code == 302
    row = ThresholdSet.objects.get()
    assert (row.tenant, row.backend, row.values) == (
        tenant,
        "openai",
        {"repeat_tolerance": 5, "count_by_round": True},
    )
    assert config_for(
        tenant_id=tenant.pk, backend="openai", model="", task_type="x"
    ).thresholds == Thresholds(repeat_tolerance=5, count_by_round=True)
    change = ConfigChange.objects.get()
    assert (change.user.username, change.action, change.target, change.before, change.note) == (
        "ana",
        "create",
        "thresholds backend openai",
        None,
        "gpt-4o batches",
    )
    # Edit, then remove: each is in the history with before and after.
    client.post(f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"repeat_tolerance": "4", "intent": "save"})
    client.post(f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"intent": "delete", "note": "back to shared"})
    assert not ThresholdSet.objects.exists()
    update, delete = ConfigChange.objects.order_by("pk")[1:]
    assert update.before["values"] == {"repeat_tolerance": 5, "count_by_round": True}
    assert update.after["values"] == {"repeat_tolerance": 4}
    assert (delete.action, delete.after, delete.note) == ("delete", None, "back to shared")
    history = client.get(f"/thresholds/{tenant.slug}/history/").content.decode()
    assert "repeat_tolerance</code>: <code>5</code> → <b><code>4</code></b>" in history
    assert "back to shared" in history
    # Values as JSON, never Python's repr: true, not True.
    assert "count_by_round</code>: <code>true</code> → <b><code>—</code></b>" in history
    assert "True" not in history


def test_a_second_row_for_the_same_scope_is_refused(tenant):
    ThresholdSet.objects.create(tenant=tenant, backend="openai", values={"max_rounds": 9})
    client = _client(_member(tenant, "ana"))
    page = client.post(
        f"/thresholds/{tenant.slug}/sets/new/", {"backend": "openai", "max_rounds": "5", "intent": "save"}
    ).content.decode()
    assert "already has a row for this scope" in page and ThresholdSet.objects.count() == 1


def test_a_tool_description_with_preview_and_validation(tenant):
    events = [run_started("jitter")]
    for i, q in enumerate(["shoes", "shoes ", "SHOES", "Shoes"], start=1):
        events += [
            model_round("jitter", i),
            tool_call("jitter", f"c{i}", i, tool="search", args={"q": q, "request_id": f"x{i}"}),
            tool_result("jitter", f"c{i}", i, result={"items": [1]}),
        ]
    _stored(tenant, "jitter", events)
    client = _client(_member(tenant, "ana"))
    page = client.post(
        f"/thresholds/{tenant.slug}/tools/new/",
        {"name": "search", "core_args": "q, bad name", "intent": "save"},
    ).content.decode()
    assert "core arguments: argument names without spaces" in page and not ToolConfig.objects.exists()
    form = {"name": "search", "kind": "read", "core_args": "q", "noise_args": "request_id", "casefold": "on"}
    page = client.post(
        f"/thresholds/{tenant.slug}/tools/new/", {**form, "intent": "preview"}
    ).content.decode()
    assert 'id="preview"' in page and 'data-run="jitter"' in page
    assert client.post(f"/thresholds/{tenant.slug}/tools/new/", {**form, "intent": "save"}).status_code == 302
    tool = ToolConfig.objects.get()
    assert (tool.tenant, tool.core_args, tool.noise_args, tool.casefold) == (
        tenant,
        ["q"],
        ["request_id"],
        True,
    )
    assert ConfigChange.objects.get().target == "tool search"


def test_forms_need_the_csrf_token(tenant):
    client = _client(_member(tenant, "ana"), csrf=True)
    path = f"/thresholds/{tenant.slug}/sets/new/"
    assert client.post(path, {"repeat_tolerance": "4", "intent": "save"}).status_code == 403
    token = client.get(path).content.decode().split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    response = client.post(path, {"repeat_tolerance": "4", "intent": "save", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and ThresholdSet.objects.get().values == {"repeat_tolerance": 4}


def test_previewing_an_edit_replays_with_the_rows_new_values(tenant):
    row = ThresholdSet.objects.create(
        tenant=tenant, backend="openai", model="gpt-4o", values={"repeat_tolerance": 5}
    )
    _repeating_run(tenant, "quietened")
    client = _client(_member(tenant, "ana"))
    page = client.post(
        f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"repeat_tolerance": "3", "intent": "preview"}
    ).content.decode()
    assert 'id="preview-gains">1<' in page and 'data-run="quietened"' in page
    assert ThresholdSet.objects.get().values == {"repeat_tolerance": 5} and not ConfigChange.objects.exists()


def test_a_viewer_sees_the_form_read_only(client, tenant):
    row = ThresholdSet.objects.create(tenant=tenant, task_type="faq", values={"max_rounds": 9})
    client.force_login(_member(tenant, "vic", "viewer"))
    page = client.get(f"/thresholds/{tenant.slug}/sets/{row.pk}/").content.decode()
    assert 'name="max_rounds" value="9"' in page and "disabled" in page
    assert 'id="preview-button"' not in page and "read only" in page


def test_previewing_the_removal_of_a_row(tenant):
    row = ThresholdSet.objects.create(tenant=tenant, backend="openai", values={"repeat_tolerance": 5})
    _repeating_run(tenant, "back-to-default")
    client = _client(_member(tenant, "ana"))
    page = client.post(
        f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"intent": "preview_delete", "preview_runs": "50"}
    ).content.decode()
    assert (
        "without these overrides" in page
        and 'id="preview-gains">1<' in page
        and 'id="save-button"' not in page
    )
    assert ThresholdSet.objects.filter(pk=row.pk).exists() and not ConfigChange.objects.exists()
    response = client.post(
        f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"intent": "preview_delete", "preview_runs": "x"}
    )
    assert response.status_code == 200 and "preview_runs: Enter a whole number." in response.content.decode()


def test_removing_overrides_asks_for_a_note_and_shows_its_preview_first(tenant):
    row = ThresholdSet.objects.create(tenant=tenant, backend="openai", values={"repeat_tolerance": 5})
    _repeating_run(tenant, "back-to-default")
    client = _client(_member(tenant, "ana"))
    edit = client.get(f"/thresholds/{tenant.slug}/sets/{row.pk}/").content.decode()
    # Offered only with its preview, like saving.
    assert 'id="preview-delete-button"' in edit and 'id="delete-button"' not in edit
    preview = client.post(
        f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"intent": "preview_delete", "preview_runs": "50"}
    ).content.decode()
    assert 'id="delete-button"' in preview and "required to remove" in preview
    # Without a note: refused, naming the field, with the preview again; nothing removed.
    response = client.post(f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"intent": "delete", "note": "  "})
    page = response.content.decode()
    assert response.status_code == 400
    assert "note: required to remove overrides" in page and "without these overrides" in page
    assert ThresholdSet.objects.filter(pk=row.pk).exists() and not ConfigChange.objects.exists()
    response = client.post(
        f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"intent": "delete", "note": "shared values are fine"}
    )
    assert response.status_code == 302 and not ThresholdSet.objects.filter(pk=row.pk).exists()
    assert ConfigChange.objects.get().note == "shared values are fine"


def test_preview_rows_tell_run_ids_that_share_their_start_apart(tenant):
    row = ThresholdSet.objects.create(tenant=tenant, backend="openai", values={"repeat_tolerance": 5})
    _repeating_run(tenant, "sim-shop-assistant-refund-2026-12-02-0001")
    _repeating_run(tenant, "sim-shop-assistant-refund-2026-12-02-0002")
    client = _client(_member(tenant, "ana"))
    page = client.post(
        f"/thresholds/{tenant.slug}/sets/{row.pk}/", {"intent": "preview_delete", "preview_runs": "50"}
    ).content.decode()
    shown = re.findall(r'<a href="/runs/\d+/" title="([^"]+)"><code>([^<]+)</code>', page)
    assert len(shown) == 2
    assert {text[-4:] for _, text in shown} == {"0001", "0002"}  # the end, where they differ, is shown
    assert all(full.startswith(text.split("…")[0]) for full, text in shown)


def test_a_user_of_no_tenant_is_told_so(client, tenant):
    ThresholdSet.objects.create(tenant=tenant, values={"max_rounds": 9})
    client.force_login(get_user_model().objects.create_user("nobody", password="pw"))
    page = client.get("/thresholds/").content.decode()
    assert "not a member of any tenant" in page and "max_rounds" not in page
    assert client.get(f"/thresholds/{tenant.slug}/").status_code == 404
