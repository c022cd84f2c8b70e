"""OTLP exports of one trace in any order, split and interleaving: the same stored run.

Exporters in a collector send a trace's spans in several requests, in parallel and out of order;
a retry or a replay sends a request again. Whatever the order, every span is mapped once, the run
ends when its root span does, rounds follow the spans' start times and nothing is counted twice.
"""

from __future__ import annotations

import random
import threading
import urllib.request
from collections.abc import Callable

import pytest
from django.db import connection

from ingest.models import Event, ModelRound, Run, ToolCall
from tests.ingest.otlp_spans import Agent, genai_agent, genai_chat, genai_tool, recorded, request_bytes

URL = "/v1/traces"
PROTOBUF = "application/x-protobuf"
SYNTHESISED = ("run_started",)


# --- recorded agent runs ----------------------------------------------------------------------------


def shop(agent: Agent) -> None:
    """Three rounds, a parallel batch of two calls in the second."""
    with agent.span("invoke_agent shop", genai_agent()):
        agent.leaf("chat gpt-4o", genai_chat(900, 40))
        agent.leaf("execute_tool search_orders", genai_tool("search_orders", '{"customer": "42"}', '["o1"]'))
        agent.leaf("chat gpt-4o", genai_chat(1500, 60))
        agent.leaf("execute_tool get_order", genai_tool("get_order", '{"id": "o1"}', '{"id": "o1"}'))
        agent.leaf("execute_tool get_order", genai_tool("get_order", '{"id": "o2"}', '{"id": "o2"}'))
        agent.leaf("chat gpt-4o", genai_chat(2000, 80))


def support(agent: Agent) -> None:
    """A tool before any round, a failed call, and a root span that fails."""
    with agent.span("invoke_agent support", genai_agent("support")) as root:
        agent.leaf("execute_tool whoami", genai_tool("whoami", "{}", '"u1"'))
        for n in range(3):
            agent.leaf("chat gpt-4o", genai_chat(300 + n, 20))
            agent.leaf(
                "execute_tool get_ticket",
                genai_tool("get_ticket", '{"ticket": "T-9"}'),
                error=ConnectionError("tickets unavailable"),
            )
        from opentelemetry.trace import Status, StatusCode

        root.set_status(Status(StatusCode.ERROR, "gave up"))


def research(agent: Agent) -> None:
    """Model calls that overlap (a sub-agent's chat ends after the next one started)."""
    with agent.span("invoke_agent research", genai_agent("research")):
        with agent.span("chat gpt-4o", genai_chat(700, 30)):
            agent.leaf("execute_tool fetch", genai_tool("fetch", '{"url": "a"}', '"page a"'))
        agent.leaf("chat gpt-4o", genai_chat(800, 35))
        agent.leaf("execute_tool fetch", genai_tool("fetch", '{"url": "b"}', '"page b"'))
        agent.leaf("chat gpt-4o", genai_chat(900, 40))


AGENTS: list[Callable[[Agent], None]] = [shop, support, research]


def recorded_spans(runs: int = 6) -> list:
    """The finished spans of several agent runs, in the order the SDK ended them, the runs' steps
    interleaved as concurrent agents' are (each run on a clock of its own)."""
    spans = []
    for n in range(runs):
        agent, memory = recorded({"service.name": "shop-agent"})
        agent.clock = iter(range((1_795_950_000 + n) * 10**9 + n * 7 * 10**6, 10**20, 10**6))
        AGENTS[n % len(AGENTS)](agent)
        spans.append(list(memory.get_finished_spans()))
    # Interleave the runs span by span: an export then holds pieces of several traces.
    out = []
    for i in range(max(map(len, spans))):
        out += [run[i] for run in spans if i < len(run)]
    return out


def exports_of(spans: list, size: int) -> list[bytes]:
    return [request_bytes(spans[i : i + size]) for i in range(0, len(spans), size)]


def trace_of(span) -> str:
    return span.context.trace_id.to_bytes(16, "big").hex()


# --- what is stored -----------------------------------------------------------------------------------

FIGURES = (
    *("agent", "task_type", "backend", "model", "labels", "status", "terminated_by", "reason"),
    *("started_at", "finished_at", "last_event_at", "rounds", "tool_calls", "tool_errors"),
    *("input_tokens", "output_tokens", "cost_usd"),
)


def stored(tenant) -> dict[str, dict]:
    """Per run: its figures, the events of its spans by event_id (synthesised run_started apart),
    its model rounds and tool calls as materialised."""
    out = {}
    for run in Run.objects.filter(tenant=tenant):
        events = {e.event_id: e.body for e in Event.objects.filter(run=run)}
        ids = dict(Event.objects.filter(run=run).values_list("seq", "event_id"))
        out[run.run_id] = {
            "figures": {name: getattr(run, name) for name in FIGURES},
            "span_events": {k: v for k, v in events.items() if v["type"] not in SYNTHESISED},
            "run_started": sorted(k for k, v in events.items() if v["type"] == "run_started"),
            "rounds": sorted(
                (ids[r.seq], r.round, r.started_at, r.ts, r.input_tokens)
                for r in ModelRound.objects.filter(run=run)
            ),
            "calls": sorted(
                (c.call_id, c.round, c.tool, c.result_status, c.result is None)
                for c in ToolCall.objects.filter(run=run)
            ),
        }
    return out


def expected_counts(spans: list) -> dict[str, tuple[int, int]]:
    """Per trace: (model spans, tool spans) as the SDK recorded them."""
    counts: dict[str, list[int]] = {}
    for span in spans:
        figure = counts.setdefault(trace_of(span), [0, 0])
        operation = span.attributes.get("gen_ai.operation.name")
        figure[0] += operation == "chat"
        figure[1] += operation == "execute_tool"
    return {trace: (rounds, calls) for trace, (rounds, calls) in counts.items()}


def assert_complete(runs: dict[str, dict], spans: list) -> None:
    """Every span mapped once: rounds and calls as sent, every run ended by its root span, rounds
    numbered 1..n by start time, each call in the round of the last model span started before it."""
    assert set(runs) == set(expected_counts(spans))
    by_id = {span.context.span_id.to_bytes(8, "big").hex(): span for span in spans}
    for trace, (rounds, calls) in expected_counts(spans).items():
        run = runs[trace]
        figures = run["figures"]
        assert (figures["rounds"], figures["tool_calls"]) == (rounds, calls), trace
        assert figures["status"] in ("succeeded", "failed") and figures["finished_at"] is not None
        assert len(run["rounds"]) == rounds and len(run["calls"]) == calls
        assert "otel:run_started" in run["run_started"]
        model = sorted((by_id[r[0].split(":")[2]].start_time, r[0]) for r in run["rounds"])
        number = {event_id: n for n, (_, event_id) in enumerate(model, start=1)}
        assert sorted(r[1] for r in run["rounds"]) == list(range(1, rounds + 1))
        assert all(r[1] == number[r[0]] for r in run["rounds"]), run["rounds"]
        for event_id, body in run["span_events"].items():
            if body["type"] == "model_round":
                assert body["round"] == number[event_id]
            if body["type"] == "tool_call":
                start = by_id[body["call_id"]].start_time
                before = [t for t, _ in model if t <= start]
                assert body["round"] == max(len(before), 1), (event_id, body)
        root = next(s for s in spans if trace_of(s) == trace and s.parent is None)
        assert figures["started_at"].timestamp() == pytest.approx(root.start_time / 1e9, abs=1e-6)


# --- sending --------------------------------------------------------------------------------------


def post(url: str, key: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(
        url + URL, data=body, headers={"Authorization": f"Bearer {key}", "Content-Type": PROTOBUF}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.read() == b"", "no partial success expected"
        return response.status, response.headers["X-Loopwatch-Spans"]


def send_concurrently(url: str, key: str, bodies: list[bytes], threads: int) -> None:
    """bodies POSTed by `threads` clients at once, each taking the next from a shared list."""
    todo = list(bodies)
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def client() -> None:
        start.wait()
        while True:
            with lock:
                if not todo:
                    return
                body = todo.pop()
            try:
                assert post(url, key, body)[0] == 200
            except BaseException as exc:
                errors.append(exc)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert not errors, errors[:3]


# --- the tests ----------------------------------------------------------------------------------------


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant)


@pytest.mark.django_db
def test_a_root_span_exported_before_its_children_waits_and_ends_the_run(api, tenant, key):
    agent, memory = recorded()
    shop(agent)
    spans = list(memory.get_finished_spans())
    root = [s for s in spans if s.parent is None]
    children = [s for s in spans if s.parent is not None]

    response = api.post(URL, request_bytes(root), key, content_type=PROTOBUF)
    assert response.status_code == 200 and response.content == b""
    assert response["X-Loopwatch-Spans"] == "spans=1 accepted=0 duplicate=0 waiting=1 ignored=0 rejected=0"
    assert not Run.objects.exists()  # nothing to run yet: no model or tool span

    response = api.post(URL, request_bytes(children), key, content_type=PROTOBUF)
    assert response["X-Loopwatch-Spans"] == "spans=6 accepted=6 duplicate=0 waiting=0 ignored=0 rejected=0"
    run = Run.objects.get(tenant=tenant)
    assert run.status == "succeeded" and run.finished_at is not None
    assert (run.agent, run.rounds, run.tool_calls) == ("shop", 3, 3)
    assert_complete(stored(tenant), spans)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "order",
    ["as_ended", "reversed", "root_first", "root_alone_last", "one_span_each_reversed"],
)
def test_any_order_of_a_traces_exports_stores_the_same_run(api, tenant, other_tenant, make_key, order):
    spans = recorded_spans(3)
    reference_key, key = make_key(other_tenant), make_key(tenant)
    for body in exports_of(spans, 4):
        assert api.post(URL, body, reference_key, content_type=PROTOBUF).status_code == 200

    roots = [s for s in spans if s.parent is None]
    rest = [s for s in spans if s.parent is not None]
    bodies = {
        "as_ended": exports_of(spans, 4),
        "reversed": exports_of(spans, 4)[::-1],
        "root_first": exports_of(roots + rest, 4),
        "root_alone_last": exports_of(rest, 5) + exports_of(roots, 1),
        "one_span_each_reversed": exports_of(spans[::-1], 1),
    }[order]
    for body in bodies:
        response = api.post(URL, body, key, content_type=PROTOBUF)
        assert response.status_code == 200 and response.content == b"", response.content

    runs = stored(tenant)
    assert_complete(runs, spans)
    reference = stored(other_tenant)
    for run_id, run in runs.items():
        assert run["figures"] == reference[run_id]["figures"], run_id
        assert run["span_events"] == reference[run_id]["span_events"], run_id
        assert run["rounds"] == reference[run_id]["rounds"]
        assert run["calls"] == reference[run_id]["calls"]


@pytest.mark.django_db
def test_every_export_sent_again_in_another_split_stores_nothing_more(api, tenant, key):
    spans = recorded_spans(3)
    for body in exports_of(spans, 3):
        api.post(URL, body, key, content_type=PROTOBUF)
    before = (Event.objects.count(), stored(tenant))
    for size in (1, 5, len(spans)):
        for body in exports_of(spans, size)[::-1]:
            response = api.post(URL, body, key, content_type=PROTOBUF)
            assert response.status_code == 200
            assert " accepted=0 " in response["X-Loopwatch-Spans"], response["X-Loopwatch-Spans"]
    assert (Event.objects.count(), stored(tenant)) == before
    assert_complete(before[1], spans)


@pytest.mark.django_db
def test_a_span_twice_in_one_export_is_one_round(api, tenant, key):
    agent, memory = recorded()
    shop(agent)
    spans = list(memory.get_finished_spans())
    response = api.post(URL, request_bytes(spans + spans[:2]), key, content_type=PROTOBUF)
    assert response["X-Loopwatch-Spans"] == "spans=9 accepted=7 duplicate=2 waiting=0 ignored=0 rejected=0"
    assert_complete(stored(tenant), spans)


@pytest.mark.django_db(transaction=True)
def test_two_exports_of_one_new_trace_racing(live_server, tenant, make_key, needs_postgres):
    """Both find the run new at the same moment: one creates it, the other continues it."""
    key = make_key(tenant)
    for _ in range(5):
        spans = recorded_spans(1)
        half = len(spans) // 2
        bodies = [request_bytes(spans[:half]), request_bytes(spans[half:])]
        send_concurrently(live_server.url, key, bodies, threads=2)
        run = Run.objects.get(tenant=tenant, run_id=trace_of(spans[0]))
        assert_complete({run.run_id: stored(tenant)[run.run_id]}, spans)
        assert Event.objects.filter(run=run, type="run_started", event_id="otel:run_started").count() == 1
        # Sent again, whole or as it was split: nothing more, not even a run_started.
        events = Event.objects.filter(run=run).count()
        for body in [request_bytes(spans), *bodies]:
            assert " accepted=0 " in post(live_server.url, key, body)[1]
        assert Event.objects.filter(run=run).count() == events


@pytest.mark.django_db(transaction=True)
def test_four_threads_sending_shuffled_exports_twice_store_what_one_by_one_does(
    live_server, other_tenant, make_key, needs_postgres
):
    """The recorded exports of several agent runs, from 4 client threads at once, in shuffled order,
    every export twice; against the same exports sent one by one, in order, to another tenant.
    Three shuffles, each to a tenant of its own."""
    from ingest.services import tenant_get_or_create

    spans = recorded_spans(12)
    bodies = exports_of(spans, 5)
    one_by_one = make_key(other_tenant)
    for body in bodies:
        assert post(live_server.url, one_by_one, body)[0] == 200
    reference = stored(other_tenant)
    assert_complete(reference, spans)
    for run in reference.values():
        # The run_started events the bridge adds say what it knew when (the run's name once its
        # root span came): their number may differ. Everything else must be the same.
        del run["run_started"]

    for seed in (17, 18, 19):
        tenant = tenant_get_or_create(slug=f"shuffled-{seed}")
        shuffled = bodies * 2
        random.Random(seed).shuffle(shuffled)
        key = make_key(tenant)
        send_concurrently(live_server.url, key, shuffled, threads=4)
        runs = stored(tenant)
        assert_complete(runs, spans)
        # A third time, one by one: nothing more is stored, not even a run_started.
        events = Event.objects.filter(run__tenant=tenant).count()
        for body in bodies:
            assert " accepted=0 " in post(live_server.url, key, body)[1]
        assert Event.objects.filter(run__tenant=tenant).count() == events
        for run in runs.values():
            del run["run_started"]
        assert runs == reference, seed


@pytest.mark.django_db
def test_the_sweep_places_a_waiting_root_span_once_its_run_exists_and_drops_old_ones(
    api, tenant, key, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from ingest.models import ParkedSpan
    from ingest.tasks import otlp_parked_sweep

    agent, memory = recorded()
    shop(agent)
    root = [s for s in memory.get_finished_spans() if s.parent is None]
    assert (
        " waiting=1 " in api.post(URL, request_bytes(root), key, content_type=PROTOBUF)["X-Loopwatch-Spans"]
    )
    # The runtime starts its run over REST and sends no other span: only the sweep places the root.
    started = {
        "type": "run_started",
        "run_id": trace_of(root[0]),
        "ts": "2026-11-29T10:59:00Z",
        "agent": "shop",
    }
    assert api.post("/api/v1/events", [started], key).status_code == 200
    assert otlp_parked_sweep() == 1
    run = Run.objects.get(tenant=tenant)
    assert run.status == "succeeded" and run.finished_at is not None
    assert not ParkedSpan.objects.exists()
    assert otlp_parked_sweep() == 0

    # A root span whose run never comes (a trace without agent semantics) is dropped in the end.
    agent, memory = recorded()
    with agent.span("GET /healthz", {"http.request.method": "GET"}):
        pass
    api.post(URL, request_bytes(memory.get_finished_spans()), key, content_type=PROTOBUF)
    assert ParkedSpan.objects.count() == 1
    assert otlp_parked_sweep() == 0
    ParkedSpan.objects.update(
        parked_at=timezone.now() - timedelta(seconds=settings.LOOPWATCH_OTLP_PARK_S + 1)
    )
    assert otlp_parked_sweep() == 1 and not ParkedSpan.objects.exists()


@pytest.mark.django_db
def test_a_span_parked_twice_is_parked_once(api, tenant, key):
    from ingest.models import ParkedSpan

    agent, memory = recorded()
    shop(agent)
    root = [s for s in memory.get_finished_spans() if s.parent is None]
    for _ in range(2):
        response = api.post(URL, request_bytes(root), key, content_type=PROTOBUF)
        assert " waiting=1 " in response["X-Loopwatch-Spans"]
    assert ParkedSpan.objects.count() == 1


@pytest.mark.django_db
def test_an_export_of_many_traces_holds_its_runs_without_filling_the_lock_table(
    api, tenant, key, needs_postgres
):
    """PostgreSQL's lock table is shared by every session and sized for ~64 locks a transaction:
    one lock per run of an export (a collector's batch of 2,000 agents' traces) would make this
    export, and everyone else's statements, fail with "out of shared memory". Runs are held by
    their rows, as a REST batch holds them, which uses no slot of that table."""
    agent, memory = recorded()
    for n in range(2000):
        with agent.span(f"invoke_agent a{n}", genai_agent(f"a{n}")):
            agent.leaf("chat gpt-4o", genai_chat(100, 10))
    spans = list(memory.get_finished_spans())
    assert len({span.context.trace_id for span in spans}) == 2000
    response = api.post(URL, request_bytes(spans), key, content_type=PROTOBUF)
    assert response.status_code == 200
    assert Run.objects.filter(tenant=tenant, events_count__gt=0).count() == 2000
    # The test's transaction is still open: locks the export took for its transaction are still held.
    with connection.cursor() as cursor:
        cursor.execute("SELECT locktype, count(*) FROM pg_locks WHERE pid = pg_backend_pid() GROUP BY 1")
        held = dict(cursor.fetchall())
    assert held.get("advisory", 0) == 0 and sum(held.values()) < 200, held


@pytest.mark.django_db
def test_a_trace_whose_spans_all_wait_leaves_no_empty_run(api, tenant, key):
    """The root of a trace with no agent spans waits for a run that may never come: holding its run
    id for the export must not leave an empty run behind."""
    agent, memory = recorded()
    with agent.span("GET /health", {"http.method": "GET"}):
        pass
    response = api.post(URL, request_bytes(list(memory.get_finished_spans())), key, content_type=PROTOBUF)
    assert response.status_code == 200
    assert not Run.objects.filter(tenant=tenant).exists()


@pytest.mark.django_db
def test_exports_stored_before_detection_runs_number_their_rounds_after_each_other(client, tenant, key):
    """A run's rounds figure is counted by the detection pass: an export that comes before the pass
    has seen the previous one numbers its rounds after the stored rounds all the same (unique
    numbers: detection's round budgets count them as they arrive)."""
    agent, memory = recorded()
    shop(agent)
    spans = list(memory.get_finished_spans())
    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    for chat in chats:  # one export each, in the order they ended; no pass in between
        # (the test client outside django_capture_on_commit_callbacks: detection is not queued)
        response = client.generic(
            "POST", URL, request_bytes([chat]), content_type=PROTOBUF, HTTP_AUTHORIZATION=f"Bearer {key}"
        )
        assert response.status_code == 200
    run = Run.objects.get(tenant=tenant)
    assert run.rounds == 0  # nothing counted yet
    stored = Event.objects.filter(run=run, type="model_round").order_by("seq")
    assert [e.body["round"] for e in stored] == [1, 2, 3]
