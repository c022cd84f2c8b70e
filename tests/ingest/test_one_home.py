"""One implementation each: the tool description's validation (model, replay file, engine) and the
threshold resolution (pipeline and threshold page) give the same answer over the same input."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from dashboards.thresholds.selectors import threshold_rows, thresholds_resolve
from ingest.detection import ToolSpec
from ingest.management.commands.replay import config_load
from ingest.models import ThresholdSet, ToolConfig
from ingest.selectors import config_for, tool_specs

BAD_SPECS = [
    ({"core_args": "query"}, "core_args"),
    ({"noise_args": [1]}, "noise_args"),
    ({"cursor_args": [""]}, "cursor_args"),
    ({"casefold": "yes"}, "casefold"),
    ({"kind": "fetch"}, "kind"),
]


@pytest.mark.parametrize(("spec", "field"), BAD_SPECS)
def test_a_bad_tool_description_is_refused_alike_everywhere(spec, field, tmp_path):
    with pytest.raises(ValueError, match=f"^{field}: "):
        ToolSpec.from_dict(spec)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"tools": {"search": spec}}))
    with pytest.raises(CommandError, match=rf"tools\.search\.{field}: "):
        config_load(str(path))


@pytest.mark.django_db
@pytest.mark.parametrize(("spec", "field"), [c for c in BAD_SPECS if c[1] != "casefold"])  # a bool column
def test_a_bad_tool_row_is_refused_by_the_model_and_left_out_by_the_pipeline(tenant, spec, field):
    row = ToolConfig(tenant=tenant, name="search", **spec)
    with pytest.raises(ValidationError) as refused:
        row.full_clean()
    assert field in refused.value.message_dict
    ToolConfig.objects.create(name="search", core_args=["q"])
    row.save()  # saved past clean (a script, a fixture): the pipeline keeps the shared row
    specs = tool_specs(ToolConfig.objects.all())
    assert specs["search"] == ToolSpec(core_args=("q",))


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"kind": "poll", "core_args": ["job"], "noise_args": ["trace"], "cursor_args": ["next"]},
        {"kind": "write", "casefold": True},
    ],
)
def test_a_good_tool_description_reads_the_same_from_a_file_and_from_the_engine(spec, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"tools": {"t": spec}}))
    assert config_load(str(path)).tools["t"] == ToolSpec.from_dict(spec)


@pytest.mark.django_db
def test_the_page_and_the_pipeline_skip_the_same_invalid_row(tenant):
    ThresholdSet.objects.create(backend="openai", values={"repeat_tolerance": 5})
    # Written past clean(): the pipeline and the page both skip it, and say which row it was.
    bad = ThresholdSet.objects.create(tenant=tenant, backend="openai", values={"repeat_tolerance": 1})
    resolved = thresholds_resolve(threshold_rows(tenant=tenant), backend="openai", model="", task_type="")
    assert [row.pk for row, _ in resolved.skipped] == [bad.pk]
    pipeline = config_for(tenant_id=tenant.pk, backend="openai", model="", task_type="")
    assert pipeline.thresholds == resolved.thresholds
    assert resolved.thresholds.repeat_tolerance == 5
