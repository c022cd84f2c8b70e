"""Forms for a tenant's threshold rows and tool descriptions; blank means inherited."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import ValidationError

from dashboards.thresholds.preview import PREVIEW_MAX_RUNS, PREVIEW_RUNS
from dashboards.thresholds.selectors import DEFAULTS, THRESHOLD_NAMES
from ingest.detection import ToolSpec
from ingest.detection.config import MODE_PREFIX, MODES, TOOL_FIELDS
from ingest.models import ThresholdSet, ToolConfig

# What differs per model backend (some repeat verbatim after an error, some batch calls in parallel)…
BACKEND_FIELDS = (
    "count_by_round",
    "repeat_tolerance",
    "action_repeat_tolerance",
    "oscillation_cycles",
    "perturbation_calls",
    "similarity",
    "escalate_every",
    "error_repeats",
    "transient_retries",
    "other_error_repeats",
    "text_similarity",
    "monologue_repeats",
    "announcement_rounds",
    "question_rounds",
    "empty_rounds",
    "harness_repeats",
    "poll_max_unchanged",
    "poll_max_wall_s",
)
# Rollout modes per detection kind (shadow, correct-only, full), in any scope.
MODE_FIELDS = tuple(n for n in THRESHOLD_NAMES if n.startswith(MODE_PREFIX))
# … and what differs per task type: budgets and how long a run may go without progress.
TASK_FIELDS = tuple(n for n in THRESHOLD_NAMES if n not in BACKEND_FIELDS and n not in MODE_FIELDS)
LABELS = {
    "count_by_round": "count windows by",
    "repeat_tolerance": "repeat tolerance (identical calls before a correction)",
    "oscillation_cycles": "oscillation cycles (A→B→A→B full cycles)",
    "perturbation_calls": "near-identical calls before a correction",
    "similarity": "argument similarity threshold (0.5 to 1)",
    "escalate_every": "escalate every (occurrences after a correction)",
    "error_repeats": "identical non-retryable errors",
    "transient_retries": "retries of a transient error",
    "other_error_repeats": "identical errors of class other",
    "text_similarity": "question/announcement similarity (0.5 to 1)",
    "monologue_repeats": "repeated announcements",
    "announcement_rounds": "announcement rounds without a call",
    "question_rounds": "question rounds without a call",
    "empty_rounds": "empty responses in a row",
    "poll_max_unchanged": "poll: same status at most",
    "poll_max_wall_s": "poll: wall clock at most (s)",
    "no_progress_steps": "no-progress K (steps without progress)",
    "max_goal_calls": "calls for one goal",
    "max_rounds": "budget: model rounds",
    "max_tool_calls": "budget: tool calls",
    "max_same_tool_retries": "budget: same-tool retries",
    "max_tokens": "budget: tokens",
    "max_cost_usd": "budget: cost (USD)",
    "max_wall_s": "budget: wall clock (s)",
    "action_repeat_tolerance": "repeat tolerance of actions (writes without a key, other)",
    "harness_repeats": "same harness message in a row",
    **{n: f"mode: {n.removeprefix(MODE_PREFIX)}" for n in MODE_FIELDS},
}
ARG_NAME = re.compile(r"^[^\s,]+$")
MAX_VALUE = 2**31 - 1  # as ingest caps integers: larger is a typo, not a budget


def _threshold_field(name: str) -> forms.Field:
    default = getattr(DEFAULTS, name)
    label = LABELS.get(name, name.replace("_", " "))
    if isinstance(default, bool):
        return forms.TypedChoiceField(
            label=label,
            required=False,
            choices=[("", "inherit"), ("true", "round (a parallel batch is one step)"), ("false", "call")],
            coerce=lambda v: v == "true",
            empty_value=None,
        )
    if isinstance(default, str):  # a rollout mode
        return forms.ChoiceField(
            label=label, required=False, choices=[("", "inherit"), *((m, m) for m in MODES)]
        )
    if isinstance(default, float):
        return forms.FloatField(label=label, required=False, max_value=MAX_VALUE)
    return forms.IntegerField(label=label, required=False, max_value=MAX_VALUE)


class _SettingsForm(forms.Form):
    """A tenant's settings row: a note for the history, how many runs a preview replays; the
    fields naming the row (`identity`) are fixed once it exists; read-only for non-admins."""

    identity: tuple[str, ...] = ()
    note = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    preview_runs = forms.IntegerField(
        label="replay the last N runs",
        min_value=1,
        max_value=PREVIEW_MAX_RUNS,
        initial=PREVIEW_RUNS,
        required=False,
    )

    def __init__(self, *args, tenant, row=None, read_only: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tenant = tenant
        self.row = row
        self.add_fields()
        if row is not None:
            for name in self.identity:
                self.fields[name].disabled = True  # a row's identity: delete and add instead
                self.initial[name] = getattr(row, name)
        if read_only:
            for f in self.fields.values():
                f.disabled = True

    def add_fields(self) -> None:
        """Fields built at run time (before the identity and read-only rules apply)."""


class ThresholdSetForm(_SettingsForm):
    identity = ("backend", "model", "task_type")
    backend = forms.CharField(required=False, max_length=100)
    model = forms.CharField(required=False, max_length=200)
    task_type = forms.CharField(required=False, max_length=100)

    def add_fields(self) -> None:
        for name in THRESHOLD_NAMES:
            self.fields[name] = _threshold_field(name)

    @property
    def backend_fields(self):
        return [self[n] for n in BACKEND_FIELDS]

    @property
    def task_fields(self):
        return [self[n] for n in TASK_FIELDS]

    def values(self) -> dict:
        data = self.cleaned_data
        # A blank choice (a mode left to inherit) is "", a blank number None: neither is a value.
        return {n: data[n] for n in THRESHOLD_NAMES if data.get(n) not in (None, "")}

    def clean(self):
        super().clean()
        data = self.cleaned_data
        if self.errors:
            return data
        for name in ("backend", "model", "task_type"):
            data[name] = (data.get(name) or "").strip()
        # add_error() drops a field from cleaned_data: keep the scope and values aside first.
        scope = {name: data[name] for name in ("backend", "model", "task_type")}
        values = self.values()
        candidate = ThresholdSet(tenant=self.tenant, values=values, **scope)
        try:
            candidate.clean()  # scope rules and Thresholds().merged(values)
        except ValidationError as exc:
            for name, messages in exc.message_dict.items():
                for message in messages:
                    # merged() says "field: reason; field: reason"; each goes beside its field.
                    for part in message.split("; "):
                        field_name, _, reason = part.partition(": ")
                        if name == "values" and field_name in self.fields:
                            self.add_error(field_name, f"{field_name}: {reason}")
                        elif name in self.fields and name != "values":
                            self.add_error(name, f"{name.replace('_', ' ')}: {part}")
                        else:
                            self.add_error(None, part)
        if not values and self.row is None:
            self.add_error(None, "Nothing to override: fill at least one value (blank fields inherit).")
        if self.row is None:
            clash = ThresholdSet.objects.filter(tenant=self.tenant, **scope).first()
            if clash is not None:
                self.add_error(
                    "backend",
                    "backend: this tenant already has a row for this scope: edit it instead of adding one",
                )
                self.clash = clash
        data["preview_runs"] = data.get("preview_runs") or PREVIEW_RUNS
        return data


def _arg_list(value: str, name: str) -> list[str]:
    items = [v.strip() for v in (value or "").split(",") if v.strip()]
    bad = [v for v in items if not ARG_NAME.match(v)]
    if bad:
        raise ValidationError(f"{name}: argument names without spaces, separated by commas (not {bad[0]!r})")
    return items


class ToolConfigForm(_SettingsForm):
    identity = ("name",)
    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(choices=[("", "as the call says"), *ToolConfig.Kind.choices], required=False)
    core_args = forms.CharField(required=False, help_text="comma-separated; empty: all of them")
    noise_args = forms.CharField(required=False, help_text="comma-separated; left out of the signature")
    cursor_args = forms.CharField(required=False, help_text="comma-separated; beyond page/offset/cursor/…")
    casefold = forms.BooleanField(required=False, label="compare string arguments without case")

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if not name:
            raise ValidationError("name: required")
        return name

    def clean_core_args(self):
        return _arg_list(self.cleaned_data["core_args"], "core arguments")

    def clean_noise_args(self):
        return _arg_list(self.cleaned_data["noise_args"], "noise arguments")

    def clean_cursor_args(self):
        return _arg_list(self.cleaned_data["cursor_args"], "cursor arguments")

    def clean(self):
        super().clean()
        data = self.cleaned_data
        if self.errors:
            return data
        try:
            self.spec()
        except ValueError as exc:
            self.add_error(None, str(exc))
        if self.row is None and ToolConfig.objects.filter(tenant=self.tenant, name=data["name"]).exists():
            self.add_error("name", "name: this tenant already describes this tool: edit it instead")
        data["preview_runs"] = data.get("preview_runs") or PREVIEW_RUNS
        return data

    def spec(self) -> ToolSpec:
        """The tool as the engine will see it, validated as every tool description is."""
        return ToolSpec.from_dict({k: self.cleaned_data[k] for k in TOOL_FIELDS})


def named_errors(form: forms.Form) -> list[str]:
    """Every error as `field: message` (Django's own messages do not name their field)."""
    out = []
    for name, errors in form.errors.items():
        for error in map(str, errors):
            named = name == "__all__" or error.startswith((f"{name}:", name.replace("_", " ")))
            out.append(error if named else f"{name}: {error}")
    return out
