"""/metrics: a token outside the embedded development mode, and label sets of bounded size (a tenant
sending thousands of tool names must not grow every scrape and every process by megabytes)."""

from __future__ import annotations

import pytest

from ingest import metrics
from ingest.models import Operation
from tests.loopwatch.test_settings import _setting


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
    # no tenant is named (LOOPWATCH_METRICS_TENANTS is empty): ids and slugs are no label values
    assert {v.split('"')[0] for v in text.split('tenant="')[1:]} <= {metrics.OTHER}
    assert f'tool="{metrics.OTHER}"' in text
    labelled = {line.split('tool="')[1].split('"')[0] for line in text.splitlines() if 'tool="tool-' in line}
    # one tenant's thousands took no more than their share of the places; the others got theirs
    assert len([t for t in labelled if t.startswith("tool-10001-")]) <= 10
    assert len([t for t in labelled if t.startswith("tool-10002-")]) == 10
    assert len(labelled) <= 50
