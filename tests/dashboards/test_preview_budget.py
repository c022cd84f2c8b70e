"""The threshold preview replays within a time budget and says when it was cut short (issue 11,
item 2: a 6-call run of huge arguments replayed for 19 s in a web process)."""

from __future__ import annotations

import pytest

from dashboards.thresholds.preview import preview_replay
from dashboards.thresholds.selectors import config_resolve
from ingest.models import Run, ThresholdSet
from tests.dashboards.test_thresholds import _client, _member, _repeating_run
from tests.ingest.test_guard_budget import long_run
from tests.ingest.test_poison import plant

pytestmark = pytest.mark.django_db


def _preview(tenant, budget_s: float):
    def config(values):
        rows = [ThresholdSet(values=values)] if values else []
        return lambda run: config_resolve(
            rows, {}, backend=run.backend, model=run.model, task_type=run.task_type
        )

    return preview_replay(
        runs=Run.objects.filter(tenant=tenant),
        limit=200,
        current=config({}),
        proposed=config({"repeat_tolerance": 5}),
        budget_s=budget_s,
    )


def test_a_preview_out_of_time_is_cut_short_and_counts_only_what_it_replayed(tenant):
    plant(tenant, long_run("huge", 6))  # six calls of 200 KB arguments, nudged: fuzzy matching's worst
    for n in range(3):
        _repeating_run(tenant, f"loop-{n}")
    cut = _preview(tenant, budget_s=0)
    assert cut.cut_short and cut.replayed == 4 and cut.done == 0
    assert (cut.events, cut.before_interventions, cut.changes) == (0, 0, [])
    whole = _preview(tenant, budget_s=120)
    assert not whole.cut_short and whole.done == whole.replayed == 4
    assert whole.before_interventions >= 3 and whole.count_loses >= 3


def test_the_page_says_the_preview_was_cut_short(tenant, settings):
    for n in range(3):
        _repeating_run(tenant, f"loop-{n}")
    client = _client(_member(tenant, "ana"))
    form = {"backend": "openai", "repeat_tolerance": "5", "preview_runs": "200", "intent": "preview"}
    settings.LOOPWATCH_PREVIEW_BUDGET_MS = 1
    page = client.post(f"/thresholds/{tenant.slug}/sets/new/", form).content.decode()
    assert 'id="preview-cut-short"' in page and "LOOPWATCH_PREVIEW_BUDGET_MS" in page
    settings.LOOPWATCH_PREVIEW_BUDGET_MS = 120_000
    page = client.post(f"/thresholds/{tenant.slug}/sets/new/", form).content.decode()
    assert 'id="preview-cut-short"' not in page and 'id="preview-loses">3<' in page
