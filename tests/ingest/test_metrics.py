"""/metrics: a token outside the embedded development mode, and label sets of bounded size (a tenant
sending thousands of tool names must not grow every scrape and every process by megabytes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ingest import metrics
from ingest.models import Operation
from tests.loopwatch.test_settings import _setting

ROOT = Path(__file__).resolve().parents[2]


def test_metrics_are_public_only_in_the_embedded_mode_with_debug_on():
    assert _setting("settings.LOOPWATCH_METRICS_PUBLIC", DEBUG="true") == "True"
    assert _setting("settings.LOOPWATCH_METRICS_PUBLIC") == "False"  # DEBUG off
    on_postgres = {"DATABASE_URL": "postgres://db.example/lw", "SECRET_KEY": "x" * 50}
    assert _setting("settings.LOOPWATCH_METRICS_PUBLIC", DEBUG="true", **on_postgres) == "False"
    assert (
        _setting("settings.LOOPWATCH_METRICS_PUBLIC", LOOPWATCH_METRICS_PUBLIC="true", **on_postgres)
        == "True"
    )


@pytest.mark.django_db
def test_metrics_need_the_token_unless_public(client, settings):
    settings.LOOPWATCH_METRICS_PUBLIC = False
    settings.LOOPWATCH_METRICS_TOKEN = ""
    closed = client.get("/metrics")
    assert closed.status_code == 403
    assert "LOOPWATCH_METRICS_TOKEN" in closed.content.decode()
    settings.LOOPWATCH_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    settings.LOOPWATCH_METRICS_PUBLIC = True  # a token set is asked for even then
    assert client.get("/metrics").status_code == 401
    settings.LOOPWATCH_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200


def test_thousands_of_tool_names_do_not_grow_the_metrics(settings, monkeypatch):
    settings.LOOPWATCH_METRICS_MAX_TOOLS = 50
    # The places other tests' tools took in this process are not this test's business.
    monkeypatch.setattr(metrics, "TOOL", metrics.BoundedLabel(lambda: settings.LOOPWATCH_METRICS_MAX_TOOLS))
    before = len(metrics.exposition()[0])
    for tenant_id, tools in ((10_001, 4000), (10_002, 30), (10_003, 30)):
        for n in range(tools):
            op = Operation(tenant_id=tenant_id, tool=f"tool-{tenant_id}-{n:04d}")
            metrics.dedupe_hit(op)
            metrics.result_reused(op, 0.003)
            metrics.unknown_reconciled(op, 12.0)
    text = metrics.exposition()[0].decode()
    grown = len(text.encode()) - before
    assert grown < 256 * 1024, f"the metrics grew by {grown / 1024:.0f} KiB"
    # the tools' metrics name no tenant (a tenant label is only for LOOPWATCH_METRICS_TENANTS)
    assert not [line for line in text.splitlines() if 'tool="' in line and "tenant=" in line]
    assert f'tool="{metrics.OTHER}"' in text
    labelled = {line.split('tool="')[1].split('"')[0] for line in text.splitlines() if 'tool="tool-' in line}
    # one tenant's thousands took no more than their share of the places; the others got theirs
    assert len([t for t in labelled if t.startswith("tool-10001-")]) <= 10
    assert len([t for t in labelled if t.startswith("tool-10002-")]) == 10
    assert len(labelled) <= 50


# --- the Grafana dashboard and the Prometheus rules in docs/ --------------------------------------

DASHBOARD = ROOT / "docs" / "grafana" / "loopwatch.json"
RULES = ROOT / "docs" / "prometheus" / "loopwatch-rules.yml"
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once strings, label matchers,
    ranges, `by (...)` clauses, functions (a name before a parenthesis), keywords and numbers are
    taken out."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?\b", " ", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in PROMQL_WORDS or match.group().startswith("$"):
            continue
        names.add(match.group())
    return names


def test_metric_names_are_read_from_expressions():
    expr = (
        'sum by (le, transport) (rate(a_seconds_bucket{x="y(z)"}[5m])) / clamp_min(sum(b_total), 1e-9) > 0.01'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total"}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels, "the dashboard has no panel"
    return [target["expr"] for panel in panels for target in panel["targets"]]


def rule_expressions() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    found = [rule for group in rules["groups"] for rule in group["rules"]]
    assert all({"alert", "expr"} <= set(rule) for rule in found)
    return [str(rule["expr"]) for rule in found]


def test_the_alert_rules_cover_what_an_operator_watches():
    expressions = " ".join(rule_expressions())
    assert "loopwatch_detection_lag_seconds) > 60" in expressions
    assert 'loopwatch_http_responses_total{status="5xx"}' in expressions
    assert 'loopwatch_ledger_operations{status="UNKNOWN"}' in expressions
    assert "loopwatch_rate_limited_total" in expressions


@pytest.mark.django_db
def test_every_metric_of_the_dashboard_and_the_rules_is_exported_after_traffic(
    api, client, settings, tenant, make_key
):
    """Ingest (accepted, duplicate, rejected, 429), a loop found and its alert published, a guard
    check, a ledger claim, a notification delivery; then every name the dashboard and the alert
    rules read must be in /metrics."""
    from tests.ingest.events import model_round, run_started, tool_call, tool_result

    settings.LOOPWATCH_METRICS_PUBLIC, settings.LOOPWATCH_METRICS_TOKEN = True, ""
    settings.LOOPWATCH_METRICS_TENANTS = frozenset({"acme"})
    settings.LOOPWATCH_KEY_CACHE_S = 0  # the tenant's new quota below applies at once
    metrics.LIVE.forget()
    key = make_key(tenant, ["ingest", "ledger"])
    loop = [run_started()]
    for i in range(1, 6):
        loop += [
            model_round(n=i),
            tool_call(call_id=f"c{i}", n=i, args={"customer": "42"}),
            tool_result(call_id=f"c{i}", n=i),
        ]
    loop = [{**event, "event_id": f"m{n}"} for n, event in enumerate(loop)]
    assert api.post("/api/v1/events", loop, key).status_code == 200
    again = api.post("/api/v1/events", [*loop[:2], {"type": "model_round", "run_id": "r1"}], key)
    assert again.status_code == 207
    assert (
        api.post(
            "/api/v1/runs/r1/check", {"tool": "search_orders", "args": {"customer": "42"}}, key
        ).status_code
        == 200
    )
    claim = {"worker_id": "w1", "operation_key": "order-1:refund", "tool": "refund", "args": {"order": "1"}}
    assert api.post("/api/v1/operations/claim", claim, key).status_code == 200
    metrics.notification_delivery(channel="webhook", outcome="sent", tenant_id=tenant.pk)
    tenant.events_per_day = 1
    tenant.save()
    from ingest.quotas import quotas_forget

    quotas_forget()
    assert api.post("/api/v1/events", loop, key).status_code == 429

    text = client.get("/metrics").content.decode()
    exported = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    for expr in dashboard_expressions() + rule_expressions():
        missing = metric_names(expr) - exported
        assert not missing, f"{expr}: {sorted(missing)} not exported"
    # the traffic shows in them
    assert 'loopwatch_events_total{outcome="duplicate",reason="",tenant="acme"} 2.0' in text
    assert 'loopwatch_events_total{outcome="rejected",reason="rate_limited",tenant="acme"}' in text
    assert 'loopwatch_rate_limited_total{limit="tenant.events_per_day",tenant="acme"} 1.0' in text
    assert 'loopwatch_ledger_operations{status="RUNNING"} 1.0' in text
    assert "loopwatch_detection_runs_waiting 0.0" in text  # eager: processed in the request


def test_a_tenant_is_labelled_by_slug_only_when_configured(settings):
    from ingest.models import Tenant

    settings.LOOPWATCH_METRICS_TENANTS = frozenset({"acme"})
    assert metrics.tenant_label(Tenant(slug="acme")) == "acme"
    assert metrics.tenant_label(Tenant(slug="globex")) == metrics.OTHER


@pytest.mark.django_db
def test_detection_lag_counts_runs_behind_from_their_oldest_unprocessed_event(tenant, time_machine):
    """Stored but not processed (no on_commit runs here): the run waits, and its lag is the age of
    its first unprocessed event, counted from when it was stored when its `ts` says earlier."""
    from datetime import UTC, datetime, timedelta

    from ingest.services import events_ingest, run_process
    from tests.ingest.events import model_round, run_started

    stored_at = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    time_machine.move_to(stored_at, tick=False)
    events_ingest(tenant=tenant, events=[run_started(), model_round(n=1)], max_event_bytes=1 << 20)
    time_machine.move_to(stored_at + timedelta(seconds=90), tick=False)
    waiting, lag, states, _ = metrics._database_figures()
    # the events say 10:00 (two hours before they were stored): the lag is since the store, 90 s
    assert (waiting, lag) == (1, 90.0)
    assert states["UNKNOWN"] == 0
    run_process(run_pk=tenant.runs.get().pk)
    assert metrics._database_figures()[:2] == (0, 0.0)


MULTIPROCESS_CHILD = """
import django
django.setup()
from ingest import metrics
from ingest.models import Tenant
metrics.events_refused(tenant=Tenant(pk=1, slug="acme"), count=5, reason="rate_limited")
metrics.ingest_batch_timed("rest", 0.02)
"""
MULTIPROCESS_SCRAPE = """
import django
django.setup()
from ingest import metrics
print(metrics.exposition()[0].decode())
"""


def test_several_processes_add_up_in_multiprocess_mode(tmp_path):
    """Two processes count (as two uvicorn workers would), a third answers the scrape: the figures
    are the sum of both."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "LOOPWATCH_METRICS_TENANTS": "acme",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    env.pop("DATABASE_URL", None)  # no database: the gauges read when scraped are left out
    env.pop("REDIS_URL", None)
    children = [
        subprocess.Popen([sys.executable, "-c", MULTIPROCESS_CHILD], cwd=ROOT, env=env) for _ in range(2)
    ]
    assert [child.wait(timeout=120) for child in children] == [0, 0]
    text = subprocess.run(
        [sys.executable, "-c", MULTIPROCESS_SCRAPE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'loopwatch_events_total{outcome="rejected",reason="rate_limited",tenant="acme"} 10.0' in text
    assert 'loopwatch_ingest_batch_seconds_count{transport="rest"} 2.0' in text
