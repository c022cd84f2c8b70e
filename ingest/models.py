"""Storage of tenants, keys, runs and their events.

The hot path writes only `Event` rows (by COPY on PostgreSQL) and the figures of
the runs a batch touched; model rounds and tool calls are built from the events
by the per-run detection task, which sees a run's events once and in order.
"""

from __future__ import annotations

import orjson
from django import forms
from django.conf import settings
from django.db import models
from django.db.models import Q

from ingest.bulk import dumps_bounded

UNSET = "Empty: the LOOPWATCH_TENANT_* default on a tenant, none on a key. 0: no limit."


class Quotas(models.Model):
    """Rate limits and quotas (ingest.quotas): on a tenant, empty takes the LOOPWATCH_TENANT_*
    setting; on a key, empty is no limit of the key's own. 0 is no limit."""

    events_per_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Events a second, REST, WebSocket and OTLP spans together. " + UNSET
    )
    events_per_day = models.PositiveIntegerField(
        null=True, blank=True, help_text="Events a UTC day. " + UNSET
    )
    checks_per_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Guard checks a second. " + UNSET
    )

    class Meta:
        abstract = True


class Tenant(Quotas):
    """Who owns runs: the unit of access control, and of quotas."""

    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "Days its events, model rounds and tool calls are kept after its runs end; blank: "
            "LOOPWATCH_RETENTION_DAYS. Runs' figures and detections stay LOOPWATCH_RUN_RETENTION_DAYS."
        ),
    )

    def __str__(self) -> str:
        return self.slug


class ApiKey(Quotas):
    """A bearer key of one tenant. Only the sha256 of the key is stored. Its quotas hold beside
    the tenant's (both must allow a request)."""

    class Scope(models.TextChoices):
        INGEST = "ingest"
        READ = "read"
        LEDGER = "ledger"
        OPERATE = "operate"  # a person's answers through an integration (chat-ops): handoffs

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, blank=True)
    prefix = models.CharField(max_length=16, help_text="The key's first characters, to tell keys apart.")
    key_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.prefix}…"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Backend(models.Model):
    """A model provider or route; its markup multiplies the list prices (an aggregator: 1.3)."""

    name = models.CharField(max_length=100, unique=True)
    markup = models.DecimalField(max_digits=6, decimal_places=3, default=1)

    def __str__(self) -> str:
        return self.name


class ModelPrice(models.Model):
    """List price per million tokens for (backend, model); a blank model is the backend's default."""

    backend = models.ForeignKey(Backend, on_delete=models.CASCADE, related_name="prices")
    model = models.CharField(max_length=200, blank=True)
    input_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=6)
    output_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=6)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["backend", "model"], name="price_backend_model_uniq")]

    def __str__(self) -> str:
        return f"{self.backend.name}/{self.model or '*'}"


class Run(models.Model):
    """One agent task execution.

    Ingest numbers its events (events_count) and writes what run_started and run_finished describe;
    the detection pass counts the rest of its figures (rounds, calls, errors, tokens, cost, first
    and last event) as it reads each event once (RunCursor.figures_seq): they are as current as
    detection is.
    """

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        TRUNCATED = "truncated"
        ABANDONED = "abandoned"
        WAITING = "waiting", "waiting for a person"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runs")
    run_id = models.CharField(max_length=200)
    agent = models.CharField(max_length=200, blank=True, default="")
    task_type = models.CharField(max_length=100, default="default")
    backend = models.CharField(max_length=100, default="unknown")
    model = models.CharField(max_length=200, blank=True, default="")
    budgets = models.JSONField(default=dict, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    terminated_by = models.CharField(max_length=16, blank=True, default="")
    budget_type = models.CharField(max_length=100, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_event_at = models.DateTimeField(null=True, blank=True)
    rounds = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    tool_errors = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cost_usd = models.FloatField(default=0)
    events_count = models.PositiveIntegerField(default=0, help_text="Stored events; also the last seq.")
    # Written by detection (the per-run task), never by ingest; so are rounds ... cost_usd, started_at
    # and last_event_at (ingest sets started_at too, with run_started's ts).
    loop_flagged = models.BooleanField(
        default=False, help_text="An intervention (correct or stronger) fired."
    )
    first_loop_at = models.DateTimeField(null=True, blank=True, help_text="ts of the first intervention.")
    first_loop_seq = models.PositiveIntegerField(
        null=True, blank=True, help_text="seq of the event that made the first intervention fire."
    )
    cost_after_loop_usd = models.FloatField(
        default=0, help_text="Cost of the model rounds after the first intervention: money burned in a loop."
    )
    max_action = models.CharField(max_length=16, blank=True, default="")
    last_progress_step = models.PositiveIntegerField(default=0)
    detections_count = models.PositiveIntegerField(default=0)
    unverified_from_seq = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "The first event stored through an API key without the ledger scope: the results of "
            "traced writes from it on are evidence for operators, not ledger verdicts."
        ),
    )
    handoff = models.JSONField(
        null=True, blank=True, help_text="Set when the run was handed to a person: why, and what was tried."
    )
    guard_checked_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "The first guard check of the run: its interventions could reach the agent through the guard "
            "(GuardDelivery says which did); NULL: detected from traces only."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "run_id"], name="run_tenant_run_id_uniq")]
        indexes = [
            models.Index(fields=["tenant", "-started_at"], name="run_tenant_started"),
            models.Index(fields=["tenant", "backend", "-started_at"], name="run_tenant_backend"),
            models.Index(fields=["tenant", "task_type", "-started_at"], name="run_tenant_task_type"),
            models.Index(fields=["tenant", "status", "-started_at"], name="run_tenant_status"),
            # The values the overview's filters offer (DISTINCT by an index-only scan). Columns set once
            # by run_started: ingest's updates of the figures stay HOT.
            models.Index(
                fields=["tenant", "backend", "model", "task_type", "agent"], name="run_tenant_dimensions"
            ),
        ]

    def __str__(self) -> str:
        return self.run_id


class Event(models.Model):
    """Every raw event as received, numbered per run (seq) in the order it was stored."""

    # No foreign-key constraints in the database: a constraint is a trigger fired for every row of a
    # COPY (a third of PostgreSQL's work per event), and the one writer, events_ingest, holds the
    # run's row lock while it inserts, so the run exists. Deletes still cascade (Django does it).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False, db_constraint=False)
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, db_index=False, db_constraint=False, related_name="events"
    )
    seq = models.PositiveIntegerField()
    # NULL, not "": the unique (run, event_id) index must skip events sent without an id.
    event_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    type = models.CharField(max_length=16)
    ts = models.DateTimeField()
    body = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_run_seq_uniq"),
            models.UniqueConstraint(
                fields=["run", "event_id"],
                condition=Q(event_id__isnull=False),
                name="event_run_event_id_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class JSONText(models.TextField):
    """A JSON value kept as its text, not as jsonb: for a value written and read whole, never
    queried inside. PostgreSQL parses jsonb on every write, and it was most of a detection pass's
    statement: the engine states of 1,000 runs (4 MB) took 176 ms to parse, their text 10 ms to
    store. Python sees the value (orjson; an integer past 64 bits is written as a float,
    ingest.bulk.dumps_bounded); raw SQL reads the text."""

    def from_db_value(self, value, expression, connection):
        return None if value is None else orjson.loads(value)

    def to_python(self, value):
        return orjson.loads(value) if isinstance(value, str | bytes) else value

    def get_prep_value(self, value):
        return None if value is None else dumps_bounded(value).decode()

    def value_to_string(self, obj):  # dumpdata: the JSON text
        return self.get_prep_value(self.value_from_object(obj))

    def formfield(self, **kwargs):
        return models.Field.formfield(self, **{"form_class": forms.JSONField, **kwargs})


class RunCursor(models.Model):
    """How far the detection task has processed a run: events with seq <= position are done.

    A row of its own, so that the task's lock never blocks ingest's updates of the run. A run whose
    processing raised is quarantined here (failures > 0): passed over until retry_at, then tried
    again, with a wait that doubles each time it fails (ingest.services).
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="cursor")
    position = models.PositiveIntegerField(default=0)
    processed = models.PositiveIntegerField(default=0, help_text="Events processed, all passes together.")
    figures_seq = models.PositiveIntegerField(
        default=0,
        help_text=(
            "Events with seq <= figures_seq are counted in the run's figures (rounds, calls, tokens, "
            "cost): a run processed again from its first event is not counted twice."
        ),
    )
    engine_state = JSONText(null=True, blank=True, help_text="The detection engine's RunState (JSON).")
    updated_at = models.DateTimeField(auto_now=True)
    failures = models.PositiveIntegerField(
        default=0, help_text="Detection passes in a row that failed on this run; 0: not quarantined."
    )
    error = models.TextField(blank=True, default="", help_text="Why the last of them failed.")
    failed_at = models.DateTimeField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True, help_text="Quarantined until then.")

    class Meta:
        indexes = [
            # The quarantined runs, few among many: the runs list's filter, the sweep's exclusion.
            models.Index(fields=["retry_at"], name="cursor_quarantined", condition=models.Q(failures__gt=0))
        ]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.position}"


class ModelRound(models.Model):
    """One model response of a run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="model_rounds")
    seq = models.PositiveIntegerField()
    round = models.PositiveIntegerField()
    ts = models.DateTimeField()
    # When the model call started (an OTLP span's start; null for rounds sent over REST): rounds with
    # one are numbered by it, whatever order their spans arrived in (ingest.otlp.rounds).
    started_at = models.DateTimeField(null=True, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.FloatField(default=0)
    cost_computed = models.BooleanField(default=False, help_text="From the price table, not the event.")
    text = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="round_run_seq_uniq")]

    def __str__(self) -> str:
        return f"{self.run_id} round {self.round}"


class ToolCall(models.Model):
    """A tool call joined with its result (by call_id: the most recent unanswered call)."""

    class Kind(models.TextChoices):
        READ = "read"
        WRITE = "write"
        POLL = "poll"
        OTHER = "other"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="calls")
    seq = models.PositiveIntegerField()
    round = models.PositiveIntegerField()
    call_id = models.CharField(max_length=200)
    tool = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.OTHER)
    args = models.JSONField(default=dict)
    step_id = models.CharField(max_length=200, blank=True, default="")
    operation_key = models.CharField(max_length=500, blank=True, default="")
    ts = models.DateTimeField()
    result_seq = models.PositiveIntegerField(null=True, blank=True)
    result_status = models.CharField(max_length=8, blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    result_truncated = models.BooleanField(default=False)
    result_sha256 = models.CharField(max_length=64, blank=True, default="")
    error_class = models.CharField(max_length=32, blank=True, default="")
    latency_ms = models.FloatField(null=True, blank=True)
    external_request_id = models.CharField(max_length=500, blank=True, default="")
    result_ts = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="call_run_seq_uniq")]
        indexes = [models.Index(fields=["run", "call_id"], name="call_run_call_id")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.tool}#{self.call_id}"


class RetentionPurge(models.Model):
    """A partition of events (one day's runs, ingest.retention) from which the rows of a tenant that
    keeps its events for less than the longest retention were deleted before the partition's drop;
    with no tenant: every such tenant's rows are gone from it. Recorded so that a partition is not
    gone through again."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    partition = models.CharField(max_length=63, help_text="The events partition's table name.")
    events = models.BigIntegerField(default=0, help_text="Event rows deleted.")
    purged_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "partition"], name="retention_purge_tenant_partition"),
            models.UniqueConstraint(
                fields=["partition"], condition=Q(tenant__isnull=True), name="retention_purge_partition_done"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id or 'all'} {self.partition}"


class PendingResult(models.Model):
    """A tool_result that arrived before its tool_call; joined when the call comes."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="pending_results")
    seq = models.PositiveIntegerField()
    call_id = models.CharField(max_length=200)
    body = models.JSONField()

    class Meta:
        indexes = [models.Index(fields=["run", "call_id", "seq"], name="pending_run_call")]

    def __str__(self) -> str:
        return f"{self.run_id} result for {self.call_id}"


class ParkedSpan(models.Model):
    """An OTLP span that cannot be placed yet: a trace's root or agent span exported before any of the
    trace's model or tool spans made its run. Placed by the export that creates the run, in its
    transaction (or by the otlp_parked_sweep task once a run exists); dropped after
    LOOPWATCH_OTLP_PARK_S."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False)
    run_id = models.CharField(max_length=200)
    # trace id and span id (48 hex digits): a span exported twice is parked once.
    span_key = models.CharField(max_length=48)
    span = models.JSONField(help_text="The span as ingest.otlp.mapping.span_dump writes it.")
    parked_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "run_id", "span_key"], name="parked_span_uniq")
        ]
        indexes = [models.Index(fields=["parked_at"], name="parked_span_age")]

    def __str__(self) -> str:
        return f"{self.run_id} span {self.span_key[32:]}"


class Detection(models.Model):
    """A finding of the detection engine on one run: evidence, the action decided, the hint."""

    class Action(models.TextChoices):
        OBSERVE = "observe"
        CORRECT = "correct"
        HANDOFF = "handoff"
        TERMINATE = "terminate"

    class Feedback(models.TextChoices):
        TRUE_LOOP = "true_loop", "true loop"
        FALSE_ALARM = "false_alarm", "false alarm"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="detections")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="detections")
    seq = models.PositiveIntegerField(help_text="The event that made it fire.")
    kind = models.CharField(max_length=32)
    action = models.CharField(max_length=16, choices=Action.choices)
    signature = models.CharField(max_length=64, blank=True, default="")
    tool = models.CharField(max_length=200, blank=True, default="")
    count = models.PositiveIntegerField(default=0)
    at_call = models.PositiveIntegerField(default=0)
    at_round = models.PositiveIntegerField(default=0)
    backend = models.CharField(max_length=100, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    task_type = models.CharField(max_length=100, blank=True, default="")
    agent = models.CharField(max_length=200, blank=True, default="")
    evidence = models.JSONField(default=dict)
    hint = models.TextField(blank=True, default="")
    ts = models.DateTimeField(help_text="ts of the event that made it fire.")
    created_at = models.DateTimeField(auto_now_add=True)
    # Operator feedback: drives the false-alarm rate and the threshold preview.
    feedback = models.CharField(max_length=16, choices=Feedback.choices, blank=True, default="")
    feedback_note = models.TextField(blank=True, default="")
    feedback_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    feedback_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # A run replayed twice stores nothing twice.
            models.UniqueConstraint(fields=["run", "seq", "kind", "signature"], name="detection_once"),
        ]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="detection_tenant_created"),
            models.Index(fields=["tenant", "backend", "-created_at"], name="detection_tenant_backend"),
            # The overview counts detections by the time of the event that fired them, from this
            # index alone (an index-only scan: the rows themselves carry evidence and hints).
            models.Index(
                fields=[
                    "tenant",
                    "ts",
                    "backend",
                    "model",
                    "task_type",
                    "agent",
                    "kind",
                    "action",
                    "feedback",
                ],
                name="detection_tenant_ts_agent",
            ),
            # Operators' verdicts per kind (the precision that keeps a kind in shadow): few rows,
            # read on every detection pass.
            models.Index(
                fields=["tenant", "kind", "backend", "model", "task_type", "feedback"],
                name="detection_verdicts",
                condition=~Q(feedback=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind} {self.action}"


class ThresholdSet(models.Model):
    """Threshold overrides for a scope; blank fields match anything.

    Resolution, weakest first: the engine's defaults, then the rows for every tenant (tenant NULL,
    kept by staff in the Django admin), then the tenant's own rows; within each, the global row
    (all blank), the task type's, the backend's, the (backend, model)'s.
    """

    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="threshold_sets",
        help_text="Blank: applies to every tenant.",
    )
    backend = models.CharField(max_length=100, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    task_type = models.CharField(max_length=100, blank=True, default="")
    values = models.JSONField(default=dict, help_text='Overrides, e.g. {"repeat_tolerance": 4}.')
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["backend", "model", "task_type"],
                condition=Q(tenant__isnull=True),
                name="thresholds_scope_uniq",
            ),
            models.UniqueConstraint(
                fields=["tenant", "backend", "model", "task_type"],
                condition=Q(tenant__isnull=False),
                name="thresholds_tenant_scope_uniq",
            ),
        ]

    def __str__(self) -> str:
        scope = f"{self.backend or '*'}/{self.model or '*'}/{self.task_type or '*'}"
        return f"{self.tenant.slug}:{scope}" if self.tenant is not None else scope

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from ingest.detection import Thresholds

        if self.model and not self.backend:
            raise ValidationError({"model": "a model threshold needs its backend"})
        if self.task_type and (self.backend or self.model):
            raise ValidationError(
                {"task_type": "task type thresholds apply to every backend: leave backend blank"}
            )
        if not isinstance(self.values, dict):
            raise ValidationError({"values": "must be a JSON object"})
        try:
            Thresholds().merged(self.values)
        except ValueError as exc:
            raise ValidationError({"values": str(exc)}) from None


class ToolConfig(models.Model):
    """What detection should know of a tool: its kind and which arguments mean what."""

    class Kind(models.TextChoices):
        READ = "read"
        WRITE = "write"
        POLL = "poll"
        OTHER = "other"

    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="tool_configs",
        help_text="Blank: applies to every tenant; a tenant's row for the same tool replaces it.",
    )
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices, blank=True, default="")
    core_args = models.JSONField(default=list, blank=True, help_text="Arguments that say what is asked.")
    noise_args = models.JSONField(default=list, blank=True, help_text="Arguments left out of the signature.")
    cursor_args = models.JSONField(default=list, blank=True, help_text="Paging arguments beyond the usual.")
    casefold = models.BooleanField(default=False, help_text="Compare string arguments without case.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name"], condition=Q(tenant__isnull=True), name="tool_name_uniq"),
            models.UniqueConstraint(
                fields=["tenant", "name"], condition=Q(tenant__isnull=False), name="tool_tenant_name_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.name}" if self.tenant is not None else self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from ingest.selectors import tool_row_spec

        try:
            tool_row_spec(self)
        except ValueError as exc:  # `core_args: must be a list of argument names`
            name, _, reason = str(exc).partition(": ")
            raise ValidationError({name: reason}) from None


class Operation(models.Model):
    """A side-effecting write as a business operation: one identity, one durable state, one owner.

    Identified by (tenant, operation_key). A repeated request becomes a status lookup, not a
    second effect.
    """

    class Status(models.TextChoices):
        PENDING = "PENDING"
        RUNNING = "RUNNING"
        SUCCEEDED = "SUCCEEDED"
        FAILED = "FAILED"
        RETRYABLE_FAILED = "RETRYABLE_FAILED"
        UNKNOWN = "UNKNOWN"
        COMPENSATED = "COMPENSATED"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="operations")
    operation_key = models.CharField(max_length=500)
    tool = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64, help_text="sha256 of the canonical arguments.")
    args = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(
        default=0,
        help_text="Attempts granted so far; the latest one's number is its fencing token.",
    )
    attempt_id = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="The client's id of the latest attempt (a lost claim answer is asked for again with it).",
    )
    external_request_id = models.CharField(max_length=500, blank=True, default="")
    # The first result as the JSON text it was stored as: every repeat gets these very bytes.
    result_json = models.TextField(null=True, blank=True)  # noqa: DJ001 - NULL: no result yet
    result_digest = models.CharField(max_length=64, blank=True, default="")
    error_class = models.CharField(max_length=32, blank=True, default="")
    error = models.JSONField(null=True, blank=True)
    source = models.CharField(
        max_length=8, default="api", help_text="api (claimed) or trace (seen in traces)"
    )
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="operations")
    call_id = models.CharField(max_length=200, blank=True, default="")
    step_id = models.CharField(max_length=200, blank=True, default="")
    executions = models.PositiveIntegerField(default=0, help_text="Times it was seen executing (traces).")
    needs_person = models.BooleanField(default=False)
    unverified = models.BooleanField(
        default=False,
        help_text=(
            "The status comes from a trace sent with a key without the ledger scope: evidence for "
            "operators; a claim gets `reconcile`, never that result."
        ),
    )
    reconcile_attempts = models.PositiveIntegerField(default=0)
    next_reconcile_at = models.DateTimeField(null=True, blank=True)
    last_reconcile = models.JSONField(null=True, blank=True, help_text="What the downstream answered last.")
    unknown_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "operation_key"], name="operation_tenant_key_uniq")
        ]
        indexes = [
            models.Index(fields=["status", "next_reconcile_at"], name="operation_reconcile"),
            models.Index(fields=["status", "lease_expires_at"], name="operation_lease"),
            models.Index(fields=["tenant", "status", "updated_at"], name="operation_tenant_status"),
            models.Index(
                fields=["tenant", "unknown_since"],
                condition=Q(status="UNKNOWN"),
                name="operation_tenant_unknown",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_key} {self.status}"


class OperationTransition(models.Model):
    """One change of an operation's state; append-only, the operation's history."""

    class Actor(models.TextChoices):
        WORKER = "worker"
        RECONCILER = "reconciler"
        USER = "user"
        TRACE = "trace"
        SYSTEM = "system"

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="history")
    from_status = models.CharField(max_length=16, blank=True, default="")
    to_status = models.CharField(max_length=16)
    actor = models.CharField(max_length=16, choices=Actor.choices)
    actor_id = models.CharField(max_length=200, blank=True, default="")
    note = models.TextField(blank=True, default="")
    # What an operator gave as proof of a decision (the downstream's id of the effect, a ticket): kept
    # beside the operation's own external_request_id, which a decision never overwrites. A database
    # default too: the ledger inserts transitions with SQL of its own (ingest/ledger.py).
    operator_reference = models.CharField(max_length=500, blank=True, default="", db_default="")
    evidence = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.operation_id}: {self.from_status or '-'} -> {self.to_status}"


class Reconciler(models.Model):
    """How to ask the downstream system whether an UNKNOWN write of a tenant's tool happened.

    It belongs to a tenant, with that tenant's credentials: another tenant's operations never use
    it. Staff configure reconcilers in the Django admin (they make the server send requests).
    """

    class Method(models.TextChoices):
        GET = "GET"
        POST = "POST"

    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        null=True,  # only rows from before reconcilers had a tenant: those are never used
        related_name="reconcilers",
        help_text="Whose operations it reconciles, with that tenant's credentials.",
    )
    tool = models.CharField(max_length=200)
    url_template = models.CharField(
        max_length=1000,
        help_text=(
            "http(s) URL with {operation_key} and/or {external_request_id} in its path or query, e.g. "
            "https://pay.example/api/refunds/{external_request_id}. Private, loopback and link-local "
            "hosts only when LOOPWATCH_RECONCILER_ALLOWED_HOSTS names them; redirects are not followed."
        ),
    )
    method = models.CharField(max_length=4, choices=Method.choices, default=Method.GET)
    headers_name = models.CharField(
        max_length=100,
        blank=True,
        default="",
        help_text="A name under this tenant's slug in LOOPWATCH_RECONCILER_HEADERS (secrets stay in settings).",
    )
    field = models.CharField(
        max_length=200, default="status", help_text="Dotted path of the answer's field, e.g. data.state"
    )
    done_values = models.JSONField(default=list, help_text='Values meaning it happened, e.g. ["succeeded"]')
    not_done_values = models.JSONField(
        default=list, help_text='Values meaning it did not, e.g. ["not_found"]'
    )
    not_found_means_not_done = models.BooleanField(
        default=False, help_text="A 404 answer proves it never happened."
    )
    keep_fields = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            'Dotted paths of the answer kept besides the verdict, e.g. ["id"]; the rest of the '
            "downstream's body is never stored or shown."
        ),
    )
    timeout_s = models.FloatField(default=5.0)
    grace_s = models.FloatField(
        default=30.0,
        help_text=(
            "After an attempt's lease ran out (or it timed out), how long its request may still land "
            "downstream: a 'not done' before then is asked again later, never acted on."
        ),
    )
    max_attempts = models.PositiveIntegerField(default=8, help_text="Then the operation needs a person.")
    give_up_after_min = models.PositiveIntegerField(default=60, help_text="Or after this long UNKNOWN.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tool"], name="reconciler_tenant_tool_uniq"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.tenant.slug}:{self.tool}"
            if self.tenant is not None
            else f"(no tenant, unused) {self.tool}"
        )

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from ingest.downstream import url_template_problem

        problem = url_template_problem(self.url_template)
        if problem:
            raise ValidationError({"url_template": problem})
        for name in ("done_values", "not_done_values"):
            if not isinstance(getattr(self, name), list):
                raise ValidationError({name: "must be a JSON list of values"})
        if not isinstance(self.keep_fields, list) or not all(
            isinstance(f, str) and f for f in self.keep_fields
        ):
            raise ValidationError({"keep_fields": 'must be a JSON list of dotted paths, e.g. ["id"]'})


class Incident(models.Model):
    """One problem of one run: its detections of one (kind, signature) folded together.

    A run's correct, then handoff, then terminate for the same repeated call are one incident, with
    its current action, the steps it escalated through, first and last seen, and one verdict.
    Written by the detection pass in the transaction that stores the detections (ingest.incidents);
    a problem with observations only is not an incident.
    """

    class Status(models.TextChoices):
        OPEN = "open"
        RESOLVED = "resolved", "resolved (verdict given)"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="incidents")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="incidents")
    kind = models.CharField(max_length=32)
    signature = models.CharField(max_length=64, blank=True, default="")
    tool = models.CharField(max_length=200, blank=True, default="")
    backend = models.CharField(max_length=100, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    task_type = models.CharField(max_length=100, blank=True, default="")
    agent = models.CharField(max_length=200, blank=True, default="")
    action = models.CharField(
        max_length=16,
        choices=Detection.Action.choices,
        help_text="The strongest action stored; observe for a kind in shadow (see shadow).",
    )
    shadow = models.CharField(
        max_length=16,
        blank=True,
        default="",
        help_text="In shadow: the strongest action it would have taken.",
    )
    steps = models.JSONField(
        default=list,
        help_text="Its detections in event order (at most STEPS_MAX): [{id, seq, action, shadow, count, ts}].",
    )
    alerts = models.PositiveIntegerField(default=0, help_text="Its detections (interventions and shadow).")
    hint = models.TextField(blank=True, default="", help_text="The latest detection's hint.")
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    last_detection_id = models.BigIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    verdict = models.CharField(max_length=16, choices=Detection.Feedback.choices, blank=True, default="")
    verdict_note = models.TextField(blank=True, default="")
    verdict_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    verdict_at = models.DateTimeField(null=True, blank=True)
    notified_action = models.CharField(
        max_length=16, blank=True, default="", help_text="The action its notifications were sent for last."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "kind", "signature"], name="incident_problem_uniq"),
        ]
        indexes = [
            models.Index(fields=["tenant", "-id"], name="incident_tenant_newest"),
            models.Index(fields=["tenant", "status", "-id"], name="incident_tenant_status"),
            models.Index(fields=["tenant", "last_seen"], name="incident_tenant_last_seen"),
        ]

    def __str__(self) -> str:
        return f"incident {self.pk}: {self.run_id} {self.kind} {self.action}"


class GuardDelivery(models.Model):
    """An intervention a guard check answered with: it reached the agent, not only the trace.

    One row per (run, kind, signature, action), from the first check that answered it.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="guard_deliveries")
    kind = models.CharField(max_length=32)
    signature = models.CharField(max_length=64, blank=True, default="")
    action = models.CharField(max_length=16, choices=Detection.Action.choices)
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "kind", "signature", "action"], name="guard_delivery_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind} {self.action} delivered"


class NotificationRule(models.Model):
    """Where a tenant's incidents go when they match: a webhook, a Slack incoming webhook, e-mail.

    An empty match list matches anything. An incident notifies a rule once per action it reaches.
    """

    class Channel(models.TextChoices):
        WEBHOOK = "webhook"
        SLACK = "slack", "Slack incoming webhook"
        EMAIL = "email", "e-mail"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="notification_rules")
    name = models.CharField(max_length=200)
    enabled = models.BooleanField(default=True)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    url = models.CharField(
        max_length=1000, blank=True, default="", help_text="webhook and Slack: http(s) URL"
    )
    secret = models.CharField(
        max_length=200, blank=True, default="", help_text="webhook: the HMAC-SHA256 key of the signature"
    )
    emails = models.JSONField(default=list, blank=True, help_text="e-mail: the addresses")
    kinds = models.JSONField(default=list, blank=True)
    actions = models.JSONField(default=list, blank=True)
    backends = models.JSONField(default=list, blank=True)
    task_types = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "enabled"], name="notify_rule_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.name} ({self.channel})"


class NotificationDelivery(models.Model):
    """One notification of one incident (or a rule's test) to one rule's target, with its attempts."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RETRYING = "retrying"
        SENT = "sent"
        FAILED = "failed"

    rule = models.ForeignKey(NotificationRule, on_delete=models.CASCADE, related_name="deliveries")
    incident = models.ForeignKey(
        Incident, on_delete=models.CASCADE, null=True, blank=True, related_name="notifications"
    )
    action = models.CharField(max_length=16, help_text="The escalation step notified.")
    test = models.BooleanField(default=False)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(
        null=True, blank=True, help_text="The last answer's HTTP status."
    )
    error = models.TextField(blank=True, default="")
    log = models.JSONField(default=list, help_text="Every attempt: [{at, status_code, error}].")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One incident notifies a rule once per escalation step, never per alert row.
            models.UniqueConstraint(
                fields=["rule", "incident", "action"],
                condition=Q(incident__isnull=False),
                name="notify_once_per_step",
            ),
        ]
        indexes = [models.Index(fields=["rule", "-id"], name="notify_delivery_rule")]

    def __str__(self) -> str:
        return f"{self.rule_id} {self.incident_id or 'test'} {self.action} {self.status}"
