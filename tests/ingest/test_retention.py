"""Retention on real PostgreSQL: partitions made ahead, old ones dropped whole, open runs kept whole,
dedupe across partitions, shorter tenants purged by partition; the plain-table purge (SQLite's) and
the runs' own retention on any database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ingest.models import Detection, Event, ModelRound, RetentionPurge, Run, RunCursor, ToolCall
from ingest.retention import (
    BLOCK,
    RetentionReport,
    day_block,
    events_purge,
    partitions_of,
    retention_apply,
    runs_purge,
)
from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result, with_ids

URL = "/api/v1/events"
pytestmark = pytest.mark.django_db


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant)


@pytest.fixture
def run_ids_restored(needs_postgres):
    """The run id sequence as it was: setval is not undone by the test's rollback (the partitions a
    test makes or drops are)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence('ingest_run', 'id')")
        (sequence,) = cursor.fetchone()
        cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
        last, called = cursor.fetchone()
    yield
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(%s, %s, %s)", [sequence, last, called])


def _loop(run_id: str, n: int, at: str | None = None) -> list[dict]:
    events = [run_started(run_id)]
    for i in range(1, n + 1):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i, args={"customer": "42"}),
            tool_result(run_id, f"c{i}", n=i),
        ]
    if at:
        events = [{**e, "ts": at} for e in events]
    return with_ids(events)


def _more(run_id: str, first: int, last: int) -> list[dict]:
    """More rounds of _loop's run: the same call again."""
    events = []
    for i in range(first, last + 1):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i, args={"customer": "42"}),
            tool_result(run_id, f"c{i}", n=i),
        ]
    return with_ids(events)


def _names(table: str) -> set[str]:
    return {p.name for p in partitions_of(table)}


def test_it_makes_partitions_ahead_and_gives_a_day_its_block_of_run_ids(run_ids_restored, api, key, tenant):
    later = timezone.now() + timedelta(days=5)
    report = retention_apply(now=later)
    for table in ("ingest_event", "ingest_modelround", "ingest_toolcall"):
        for offset in range(3):
            assert f"{table}_d{later.date() + timedelta(days=offset):%Y%m%d}" in _names(table)
    assert report.sequence_moved_to == day_block(later.date())
    assert api.post(URL, _loop("r-later", 2), key).status_code == 200
    run = Run.objects.get(run_id="r-later")
    assert day_block(later.date()) <= run.pk < day_block(later.date()) + BLOCK
    with connection.cursor() as cursor:  # the rows are in that day's partition, not the default one
        cursor.execute(
            f"SELECT count(*) FROM ingest_event_d{later.date():%Y%m%d} WHERE run_id = %s", [run.pk]
        )
        assert cursor.fetchone()[0] == 7 == run.events_count
    assert ModelRound.objects.filter(run=run).count() == 2 and ToolCall.objects.filter(run=run).count() == 2
    again = retention_apply(now=later)  # a second pass finds everything made
    assert again.created == [] and again.sequence_moved_to is None


def test_old_partitions_are_dropped_whole_and_the_runs_figures_stay(run_ids_restored, api, key, tenant):
    api.post(URL, [*_loop("r-old", 3), *with_ids([run_finished("r-old")])], key)
    run = Run.objects.get(run_id="r-old")
    today = f"ingest_event_d{timezone.now().date():%Y%m%d}"
    assert today in _names("ingest_event") and Event.objects.filter(run=run).count() == 11

    report = retention_apply(now=timezone.now() + timedelta(days=40))
    assert today in report.dropped and "ingest_event_before" in report.dropped
    for table in ("ingest_event", "ingest_modelround", "ingest_toolcall"):
        assert not {n for n in _names(table) if n.endswith(f"{timezone.now().date():%Y%m%d}")}
    assert not Event.objects.filter(run=run).exists()
    assert not ModelRound.objects.filter(run=run).exists() and not ToolCall.objects.filter(run=run).exists()
    run.refresh_from_db()  # the run, its figures and its cursor are kept longer
    assert (run.rounds, run.tool_calls, run.events_count, run.status) == (3, 3, 11, "succeeded")
    assert RunCursor.objects.get(run=run).position == 11


def test_a_run_still_open_is_never_cut_in_half(run_ids_restored, api, key, tenant):
    now = timezone.now()
    later = now + timedelta(days=40)
    # Active: its last event is within the retention at `later` (ts are the agent's).
    active = (later - timedelta(days=1)).isoformat()
    api.post(URL, _loop("r-active", 3, at=active), key)
    api.post(URL, _loop("r-silent", 2), key)  # open, but silent since 2026-11-29
    api.post(URL, [*_loop("r-control", 2), *_more("r-control", 3, 4)], key)  # the same, never cut
    api.post(URL, _loop("r-behind", 1), key)  # finished, but detection has not processed it all
    api.post(URL, with_ids([run_finished("r-behind")]), key)
    behind = Run.objects.get(run_id="r-behind")
    RunCursor.objects.filter(run=behind).update(position=2)
    silent = Run.objects.get(run_id="r-silent")
    state_before = RunCursor.objects.get(run=silent)
    assert state_before.position == 7 and state_before.engine_state

    report = retention_apply(now=later)
    assert report.moved_runs == 2 and f"ingest_event_d{now.date():%Y%m%d}" in report.dropped
    active_run = Run.objects.get(run_id="r-active")
    # The open, active run and the run detection lags are whole, in the default partition.
    assert list(Event.objects.filter(run=active_run).values_list("seq", flat=True).order_by("seq")) == list(
        range(1, 11)
    )
    assert (
        ModelRound.objects.filter(run=active_run).count()
        == 3
        == ToolCall.objects.filter(run=active_run).count()
    )
    assert Event.objects.filter(run=behind).count() == behind.events_count == 5
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM ingest_event_default WHERE run_id = ANY(%s)", [[active_run.pk, behind.pk]]
        )
        assert cursor.fetchone()[0] == 15
    # The silent open run lost its old events, but not its cursor or the engine's state: its next
    # events are numbered on and detected from where it was: the third repeat of the call is
    # corrected, as in a run that lost nothing (a fresh engine would have seen it once or twice).
    assert not Event.objects.filter(run=silent).exists()
    cursor_after = RunCursor.objects.get(run=silent)
    assert (cursor_after.position, cursor_after.engine_state) == (7, state_before.engine_state)
    assert api.post(URL, _more("r-silent", 3, 4), key).status_code == 200
    assert list(Event.objects.filter(run=silent).values_list("seq", flat=True).order_by("seq")) == list(
        range(8, 14)
    )
    assert RunCursor.objects.get(run=silent).position == 13
    found = list(
        Detection.objects.filter(run=silent, seq__gt=7).values_list("seq", "kind", "action").order_by("seq")
    )
    assert ("correct" in {action for _, _, action in found}) and found == list(
        Detection.objects.filter(run__run_id="r-control", seq__gt=7)
        .values_list("seq", "kind", "action")
        .order_by("seq")
    )


def test_dedupe_holds_for_runs_whose_rows_moved_partition(run_ids_restored, api, key, tenant):
    later = timezone.now() + timedelta(days=40)
    batch = _loop("r-kept", 2, at=(later - timedelta(days=1)).isoformat())
    api.post(URL, batch, key)
    other = [{**e, "run_id": "r-other"} for e in batch]  # the same event ids, another run
    api.post(URL, other, key)
    retention_apply(now=later)  # both runs move to the default partition
    before = Event.objects.count()
    answer = api.post(URL, batch, key).json()
    assert {v["status"] for v in answer["results"]} == {"duplicate"}
    assert Event.objects.count() == before == 14
    # A run of the new day (its own partition) with the same event ids is another run: stored.
    fresh = [{**e, "run_id": "r-new-day"} for e in batch]
    assert {v["status"] for v in api.post(URL, fresh, key).json()["results"]} == {"accepted"}
    assert Event.objects.filter(run__run_id="r-new-day").count() == 7
    # And the database itself refuses a second (run, event_id), whichever partition holds the run.
    kept = Run.objects.get(run_id="r-kept")
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(
            tenant=tenant,
            run=kept,
            seq=99,
            event_id=batch[0]["event_id"],
            type="model_round",
            ts=later,
            body={},
        )


def test_a_tenant_with_a_shorter_retention_is_purged_by_partition(
    run_ids_restored, api, key, tenant, other_tenant, make_key, settings
):
    settings.LOOPWATCH_RETENTION_DAYS = 30
    tenant.retention_days = 7
    tenant.save()
    api.post(URL, [*_loop("r-short", 2), *with_ids([run_finished("r-short")])], key)
    api.post(URL, [*_loop("r-long", 2), *with_ids([run_finished("r-long")])], make_key(other_tenant))
    today = f"ingest_event_d{timezone.now().date():%Y%m%d}"

    report = retention_apply(now=timezone.now() + timedelta(days=10))
    assert today not in report.dropped  # the other tenant keeps 30 days
    assert report.events_deleted == {"acme": 8}
    assert not Event.objects.filter(run__run_id="r-short").exists()
    assert not ToolCall.objects.filter(run__run_id="r-short").exists()
    assert Event.objects.filter(run__run_id="r-long").count() == 8
    assert RetentionPurge.objects.filter(tenant=tenant, partition=today, events=8).exists()
    assert retention_apply(now=timezone.now() + timedelta(days=10)).events_deleted == {}

    report = retention_apply(now=timezone.now() + timedelta(days=40))
    assert today in report.dropped and not Event.objects.filter(run__run_id="r-long").exists()
    assert not RetentionPurge.objects.filter(partition=today).exists()


def test_the_plain_table_purge_deletes_done_runs_by_date(api, key, tenant):
    """SQLite's purge (here on whatever database the suite runs: it is the ORM's)."""
    later = timezone.now() + timedelta(days=40)
    api.post(URL, [*_loop("r-done", 2), *with_ids([run_finished("r-done")])], key)
    api.post(URL, _loop("r-open", 2, at=(later - timedelta(days=2)).isoformat()), key)
    report = RetentionReport()
    events_purge(now=later, report=report)
    assert report.events_deleted == {"acme": 8}
    assert not Event.objects.filter(run__run_id="r-done").exists()
    assert not ModelRound.objects.filter(run__run_id="r-done").exists()
    assert Event.objects.filter(run__run_id="r-open").count() == 7
    assert RunCursor.objects.get(run__run_id="r-done").position == 8  # figures and cursor stay
    report = RetentionReport()
    events_purge(now=later, report=report)
    assert report.events_deleted == {}


def test_runs_are_deleted_after_their_own_retention(api, key, tenant, settings):
    settings.LOOPWATCH_RUN_RETENTION_DAYS = 100
    events = [run_started("r-loop")]
    for i in range(1, 5):
        events += [
            model_round("r-loop", n=i),
            tool_call("r-loop", f"c{i}", n=i),
            tool_result("r-loop", f"c{i}", n=i),
        ]
    api.post(URL, [*with_ids(events), *with_ids([run_finished("r-loop")])], key)
    assert Detection.objects.filter(run__run_id="r-loop").exists()
    assert runs_purge(now=timezone.now() + timedelta(days=99)) == 0
    assert runs_purge(now=timezone.now() + timedelta(days=101)) == 1
    assert not Run.objects.filter(run_id="r-loop").exists() and not Detection.objects.exists()
    assert not RunCursor.objects.exists() and not Event.objects.exists()


def test_a_pass_while_another_runs_does_nothing(run_ids_restored):
    """Another session (another process's pass) holds the pass's lock."""
    import psycopg

    from ingest.retention import PASS_LOCK

    settings_dict = connection.settings_dict
    other = psycopg.connect(
        host=settings_dict["HOST"],
        port=settings_dict["PORT"] or 5432,
        user=settings_dict["USER"],
        password=settings_dict["PASSWORD"],
        dbname=settings_dict["NAME"],
        autocommit=True,
    )
    with other:
        other.execute("SELECT pg_advisory_lock(%s)", [PASS_LOCK])
        later = timezone.now() + timedelta(days=5)
        report = retention_apply(now=later)
        assert report.kept == {"*": "another retention pass is running"} and report.created == []
        other.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK])
    assert retention_apply(now=later).created  # the lock was let go: the next pass works
