"""The runs pages: search among the user's tenants, recent runs, and one run's detail."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils.html import escape

from dashboards.models import Membership
from dashboards.runs.selectors import call_signature, run_timeline, timeline_start_for
from ingest.models import Detection, Run, RunCursor, ThresholdSet
from ingest.selectors import detection_config
from ingest.services import events_ingest
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result

pytestmark = pytest.mark.django_db


def _ingest(tenant, events, capture) -> Run:
    with capture(execute=True):
        events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)
    return Run.objects.get(tenant=tenant, run_id=events[0]["run_id"])


def _user(tenant, name: str = "ana", role: str = Membership.Role.VIEWER):
    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def _looping(run_id: str = "loop-1", repeats: int = 3, **started) -> list[dict]:
    events = [run_started(run_id, **started)]
    for i in range(1, repeats + 1):
        events += [
            model_round(run_id, n=i, text=f"Let me look up the orders (try {i})."),
            tool_call(run_id, f"c{i}", n=i, args={"customer": "42", "request_id": f"req-{i}"}),
            tool_result(run_id, f"c{i}", n=i, result={"orders": []}),
        ]
    return events


@pytest.fixture
def capture(django_capture_on_commit_callbacks):
    return django_capture_on_commit_callbacks


# --- search and list --------------------------------------------------------------------------


def test_the_runs_pages_need_a_login(client, tenant):
    run = Run.objects.create(tenant=tenant, run_id="r")
    for url in ("/runs/", f"/runs/{run.pk}/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_search_finds_the_exact_run_then_by_prefix_in_the_users_tenants_only(client, tenant, other_tenant):
    for run_id in ("order-7", "order-71", "order-72"):
        Run.objects.create(tenant=tenant, run_id=run_id)
    Run.objects.create(tenant=other_tenant, run_id="order-73")
    theirs_only = Run.objects.create(tenant=other_tenant, run_id="secret-1")
    client.force_login(_user(tenant))
    exact = client.get("/runs/", {"q": "order-71"})
    assert exact.status_code == 302
    assert exact["Location"] == f"/runs/{Run.objects.get(tenant=tenant, run_id='order-71').pk}/"
    page = client.get("/runs/", {"q": "order-7"}).content.decode()
    assert page.index("Run id order-7") < page.index("Starting with order-7")
    assert ">order-71<" in page and ">order-72<" in page and "order-73" not in page
    missing = client.get("/runs/", {"q": theirs_only.run_id})
    assert missing.status_code == 200 and 'id="no-runs"' in missing.content.decode()


def test_the_same_run_id_in_two_of_the_users_tenants_is_listed_twice(client, tenant, other_tenant):
    user = _user(tenant)
    Membership.objects.create(user=user, tenant=other_tenant)
    Run.objects.create(tenant=tenant, run_id="shared")
    Run.objects.create(tenant=other_tenant, run_id="shared")
    client.force_login(user)
    page = client.get("/runs/", {"q": "shared"}).content.decode()
    assert page.count(">shared</a>") == 2 and "globex" in page and "acme" in page


def test_recent_runs_are_the_users_newest_with_pages(client, tenant, other_tenant, capture):
    _ingest(tenant, _looping("flagged"), capture)
    _ingest(tenant, [run_started("quiet"), model_round("quiet")], capture)
    _ingest(other_tenant, [run_started("theirs")], capture)
    client.force_login(_user(tenant))
    page = client.get("/runs/").content.decode()
    assert ">flagged</a>" in page and ">quiet</a>" in page and "theirs" not in page
    flagged_only = client.get("/runs/", {"flagged": "1"}).content.decode()
    assert ">flagged</a>" in flagged_only and ">quiet</a>" not in flagged_only
    assert ">quiet</a>" not in client.get("/runs/", {"page": "2"}).content.decode()


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "exploded"}, "status"),
        ({"page": "0"}, "page"),
        ({"page": "x"}, "page"),
        ({"q": "x" * 201}, "q"),
    ],
)
def test_bad_list_parameters_are_a_400_naming_the_field(client, tenant, params, field):
    client.force_login(_user(tenant))
    response = client.get("/runs/", params)
    assert response.status_code == 400 and f'data-field="{field}"' in response.content.decode()


# --- detail -----------------------------------------------------------------------------------


def test_another_tenants_run_is_a_404_both_ways(client, tenant, other_tenant):
    mine = Run.objects.create(tenant=tenant, run_id="mine")
    theirs = Run.objects.create(tenant=other_tenant, run_id="theirs")
    client.force_login(_user(tenant, "ana"))
    assert client.get(f"/runs/{mine.pk}/").status_code == 200
    assert client.get(f"/runs/{theirs.pk}/").status_code == 404
    assert client.get(f"/runs/{theirs.pk + 100}/").status_code == 404
    client.force_login(_user(other_tenant, "oz"))
    assert client.get(f"/runs/{mine.pk}/").status_code == 404
    assert client.get(f"/runs/{theirs.pk}/").status_code == 200


def test_the_detail_shows_figures_timeline_signatures_and_where_detection_fired(client, tenant, capture):
    run = _ingest(tenant, [*_looping(agent="shop"), run_finished("loop-1", status="failed")], capture)
    correction = Detection.objects.get(run=run, action="correct")
    client.force_login(_user(tenant))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    figures = page[page.index('id="run-figures"') : page.index("</table>", page.index('id="run-figures"'))]
    for text in (
        "failed",
        "openai / gpt-4o",
        "shop",
        "order_lookup",
        'id="fig-rounds">3<',
        'id="fig-calls">3',
    ):
        assert text in figures, text
    # each round, the model's text, each call's arguments and result
    for n in (1, 2, 3):
        assert f"<h3>Round {n}</h3>" in page and f"Let me look up the orders (try {n})." in page
    assert escape('"request_id":"req-2"') in page and escape('{"orders":[]}') in page
    # the normalised signature (request ids are noise) is the one detection compared
    assert page.count(f"<code>{correction.signature}</code>") == 3 and "\u00d73 on this page" in page
    # the correction sits beside the result that made it fire, with its hint
    call = run.calls.get(call_id="c3")
    anchor = page.index(f'<a id="seq-{call.result_seq}">')
    fired = page.index(f'id="det-{correction.pk}"')
    assert anchor < fired < page.index('id="seq-', fired)
    assert escape(correction.hint) in page[fired:]
    assert "run finished</b> failed" in page


def test_signatures_follow_the_tenants_tool_settings(tenant):
    run = Run.objects.create(tenant=tenant, run_id="r", backend="openai")
    config = detection_config(run=run)
    assert call_signature(config, "search", {"q": "Shoes"}) != call_signature(
        config, "search", {"q": "shoes"}
    )
    from ingest.models import ToolConfig

    ToolConfig.objects.create(tenant=tenant, name="search", casefold=True, noise_args=["session"])
    config = detection_config(run=run)
    assert call_signature(config, "search", {"q": "Shoes", "session": "a"}) == call_signature(
        config, "search", {"q": "shoes", "session": "b"}
    )


def test_budgets_are_shown_against_the_runs_limits(client, tenant, capture):
    ThresholdSet.objects.create(tenant=tenant, values={"max_tool_calls": 40})
    run = _ingest(tenant, _looping(budgets={"max_rounds": 5}), capture)
    client.force_login(_user(tenant))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    rounds = page[page.index('data-budget="max_rounds"') :]
    assert ">3</td>" in rounds[:200] and ">5</td>" in rounds[:200] and "run_started.budgets" in rounds[:600]
    calls = page[page.index('data-budget="max_tool_calls"') :]
    assert (
        ">3</td>" in calls[:200] and ">40</td>" in calls[:200] and "thresholds (openai/gpt-4o" in calls[:600]
    )


def test_the_ledger_operations_of_the_run_are_listed_with_their_state(client, tenant, capture):
    events = [
        run_started("pay"),
        tool_call(
            "pay", "w1", 1, tool="create_refund", kind="write", args={"order": "9"}, operation_key="refund-9"
        ),
        tool_result("pay", "w1", 1, status="timeout", result=None),
    ]
    run = _ingest(tenant, events, capture)
    client.force_login(_user(tenant))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    operations = page[page.index('id="operations"') :]
    assert "refund-9" in operations and "UNKNOWN" in operations and "create_refund" in operations


def test_a_call_recorded_without_arguments_says_what_detection_can_do_with_it(client, tenant, capture):
    events = [
        run_started("otel"),
        {**tool_call("otel", "c1", 1, tool="lookup", args={}), "args_captured": False},
        tool_result("otel", "c1", 1),
        tool_call("otel", "c2", 2, tool="now", args={}),
        tool_result("otel", "c2", 2),
    ]
    run = _ingest(tenant, events, capture)
    client.force_login(_user(tenant))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert page.count("exact-repeat detection is limited to the tool name and the result") == 1
    note = page.index("No arguments recorded")
    assert page.rindex('class="tool">lookup<', 0, note) > page.rfind('class="tool">now<', 0, note)


def test_long_values_are_folded_and_a_handoff_is_summarised(client, tenant, capture):
    long_result = {"text": "word " * 200}
    events = [
        run_started("long"),
        tool_call("long", "c1", 1),
        tool_result("long", "c1", 1, result=long_result),
    ]
    run = _ingest(tenant, events, capture)
    Run.objects.filter(pk=run.pk).update(
        handoff={"why": "same refund asked three times", "tried": ["search_orders", "get_order"]}
    )
    client.force_login(_user(tenant))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "<details><summary>result (" in page
    handoff = page[page.index('id="handoff"') :]
    assert "same refund asked three times" in handoff and "get_order" in handoff


def test_a_long_run_is_paged_and_a_detection_link_opens_its_page(client, tenant, capture):
    events = [run_started("long", budgets={"max_tool_calls": 1000, "max_rounds": 1000})]
    for i in range(1, 151):
        events += [
            model_round("long", n=i),
            tool_call("long", f"c{i}", n=i, args={"path": f"/f{i}"}),
            tool_result("long", f"c{i}", n=i, result={"body": f"content {i}"}),
        ]
    run = _ingest(tenant, events, capture)
    assert run.events_count == 451
    client.force_login(_user(tenant))
    first = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Events 1\u2013200 of 451" in first and 'href="?from=201#timeline"' in first
    assert 'id="seq-200"' in first and 'id="seq-201"' not in first
    last = client.get(f"/runs/{run.pk}/", {"seq": "430"}).content.decode()
    assert (
        "Events 401\u2013451 of 451" in last
        and 'id="seq-430"' in last
        and 'href="?from=201#timeline"' in last
    )
    assert timeline_start_for(430) == 401 and timeline_start_for(200) == 1
    bad = client.get(f"/runs/{run.pk}/", {"from": "abc"})
    assert bad.status_code == 400 and 'data-field="from"' in bad.content.decode()


def test_events_detection_has_not_processed_yet_are_announced(client, tenant, capture):
    run = _ingest(tenant, _looping(), capture)
    RunCursor.objects.filter(run=run).update(position=4)
    run.refresh_from_db()
    timeline = run_timeline(run=run, config=detection_config(run=run))
    assert (timeline.processed, timeline.total) == (4, 10)
    client.force_login(_user(tenant))
    assert "Detection has processed 4 of 10 events" in client.get(f"/runs/{run.pk}/").content.decode()


def test_figures_not_counted_yet_are_announced(client, tenant, capture):
    run = _ingest(tenant, _looping(), capture)
    client.force_login(_user(tenant))
    assert 'id="fig-counting"' not in client.get(f"/runs/{run.pk}/").content.decode()  # all counted
    RunCursor.objects.filter(run=run).update(figures_seq=6)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "The figures count 6 of the 10 events" in page
