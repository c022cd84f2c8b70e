"""The runs a process knows by pk (ingestion._RUN_PKS): a batch locks them by pk, and a pk that
no longer names the run (deleted since, rolled back, another run's after a restore) is not trusted."""

from __future__ import annotations

import pytest
from django.db import transaction

from ingest.models import Event, Run
from ingest.services import events_ingest
from ingest.services.ingestion import _RUN_PKS

pytestmark = pytest.mark.django_db(transaction=True)


def _ingest(tenant, run_id: str, rounds: range) -> None:
    events = [
        {"type": "model_round", "run_id": run_id, "ts": "2026-11-29T10:00:00Z", "round": r} for r in rounds
    ]
    result = events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)
    assert result.count("accepted") == len(events), result.verdicts


def _seqs(tenant, run_id: str) -> list[int]:
    run = Run.objects.get(tenant=tenant, run_id=run_id)
    return sorted(Event.objects.filter(run=run).values_list("seq", flat=True))


def test_a_run_deleted_since_is_created_again(needs_postgres, tenant):
    _ingest(tenant, "r-1", range(1, 3))
    old_pk = Run.objects.get(tenant=tenant, run_id="r-1").pk
    assert _RUN_PKS.pks[(tenant.pk, "r-1")] == old_pk
    Run.objects.filter(pk=old_pk).delete()  # as retention deletes a run past its days

    _ingest(tenant, "r-1", range(3, 4))

    run = Run.objects.get(tenant=tenant, run_id="r-1")
    assert run.pk != old_pk
    assert (run.events_count, run.rounds) == (1, 3)
    assert _seqs(tenant, "r-1") == [1]
    assert _RUN_PKS.pks[(tenant.pk, "r-1")] == run.pk


def test_a_pk_that_names_another_run_is_not_trusted(needs_postgres, tenant, other_tenant):
    _ingest(tenant, "r-b", range(1, 3))
    _ingest(other_tenant, "r-c", range(1, 2))
    _ingest(other_tenant, "r-e", range(1, 2))
    b = Run.objects.get(tenant=tenant, run_id="r-b")
    c = Run.objects.get(tenant=other_tenant, run_id="r-c")
    e = Run.objects.get(tenant=other_tenant, run_id="r-e")
    # What a process could hold after the database was restored to an earlier point: the pk of
    # another run of the tenant, or of another tenant's run, under another run id or its own.
    _RUN_PKS.learn(tenant.pk, [("r-a", b.pk), ("r-d", c.pk), ("r-e", e.pk)])

    _ingest(tenant, "r-a", range(1, 2))
    _ingest(tenant, "r-d", range(1, 4))
    _ingest(tenant, "r-e", range(1, 3))

    a = Run.objects.get(tenant=tenant, run_id="r-a")
    d = Run.objects.get(tenant=tenant, run_id="r-d")
    mine = Run.objects.get(tenant=tenant, run_id="r-e")
    assert {a.pk, d.pk, mine.pk}.isdisjoint({b.pk, c.pk, e.pk})
    assert (a.events_count, d.events_count, mine.events_count) == (1, 3, 2)
    for run in (b, c, e):
        run.refresh_from_db()
    assert (b.events_count, c.events_count, e.events_count) == (2, 1, 1)  # untouched
    assert _seqs(tenant, "r-b") == [1, 2] and _seqs(other_tenant, "r-c") == [1]
    assert _seqs(other_tenant, "r-e") == [1] and _seqs(tenant, "r-e") == [1, 2]


def test_a_batch_rolled_back_leaves_no_pk_behind(needs_postgres, tenant):
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        _ingest(tenant, "r-gone", range(1, 2))
        assert Run.objects.filter(tenant=tenant, run_id="r-gone").exists()
        raise Abort
    assert (tenant.pk, "r-gone") not in _RUN_PKS.pks

    _ingest(tenant, "r-gone", range(1, 3))
    assert _seqs(tenant, "r-gone") == [1, 2]


def test_the_pks_kept_are_bounded(needs_postgres, tenant):
    pks = type(_RUN_PKS)(size=100)
    pks.learn(tenant.pk, [(f"r-{n}", n) for n in range(250)])
    assert len(pks.pks) <= 100
    assert pks.pks[(tenant.pk, "r-249")] == 249  # the newest stay
    assert (tenant.pk, "r-0") not in pks.pks


def test_threads_learning_and_forgetting_at_once_lose_nothing_they_keep(needs_postgres, tenant):
    """Requests run on several threads of a process: without the lock, an eviction iterating the
    dict while another thread adds to it raised (24 times in 5 rounds here)."""
    import sys
    import threading

    pks = type(_RUN_PKS)(size=100)
    errors: list[BaseException] = []

    def churn(worker: int) -> None:
        try:
            for n in range(3_000):
                pks.learn(tenant.pk, [(f"w{worker}-r{n}", n)])
                if n % 7 == 0:
                    pks.forget(tenant.pk, [f"w{worker}-r{n - 3}"])
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=churn, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert 60 <= len(pks.pks) <= 100  # evicted down to three quarters (then a few forgotten)
    assert all(pk == int(run_id.rsplit("-r", 1)[1]) for (_, run_id), pk in pks.pks.items())


# Another client's transaction, in a process of its own: it creates run `new` (a copy of an empty
# run), says so, then after a while locks run `held` and commits.
_OTHER_BATCH = """
import sys, time, psycopg
params, table, columns, template, new, held = eval(sys.argv[1])
with psycopg.connect(**params) as conn:
    conn.execute(
        f"INSERT INTO {table} ({columns}, run_id) SELECT {columns}, %s FROM {table} WHERE id = %s",
        [new, template],
    )
    print("inserted", flush=True)
    time.sleep(0.5)
    conn.execute(f"SELECT id FROM {table} WHERE id = %s FOR NO KEY UPDATE", [held])
print("committed", flush=True)
"""


def test_a_stale_pk_does_not_make_a_batch_lock_out_of_order(needs_postgres, tenant):
    """A batch whose run r-a was deleted since this process saw it, beside run r-b: another batch
    creates r-a first and then needs r-b. Taking r-a again while holding r-b waited for that batch
    while it waited for r-b: a deadlock (PostgreSQL aborted one of them; CI saw it with OTLP
    exports, whose runs created for a waiting span are dropped again). Now the take lets r-b go
    and starts again: both batches pass."""
    import subprocess
    import sys

    from django.db import connection

    _ingest(tenant, "r-a", range(1, 2))
    _ingest(tenant, "r-b", range(1, 2))
    stale = Run.objects.get(tenant=tenant, run_id="r-a").pk
    held = Run.objects.get(tenant=tenant, run_id="r-b").pk
    template = Run.objects.create(tenant=tenant, run_id="r-empty").pk
    Run.objects.filter(pk=stale).delete()
    assert _RUN_PKS.pks[(tenant.pk, "r-a")] == stale

    columns = ", ".join(
        connection.ops.quote_name(f.column)
        for f in Run._meta.concrete_fields
        if f.attname != "run_id" and f is not Run._meta.auto_field
    )
    params = connection.get_connection_params()
    params = {k: v for k, v in params.items() if k in ("dbname", "user", "password", "host", "port")}
    args = repr((params, Run._meta.db_table, columns, template, "r-a", held))
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_BATCH, args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None
        assert other.stdout.readline().strip() == "inserted"
        events = [
            {"type": "model_round", "run_id": run_id, "ts": "2026-11-29T10:00:00Z", "round": 5}
            for run_id in ("r-a", "r-b")
        ]
        result = events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)
        _, errors = other.communicate(timeout=30)
    finally:
        other.kill()
    assert result.count("accepted") == 2, result.verdicts
    assert other.returncode == 0, errors
    run = Run.objects.get(tenant=tenant, run_id="r-a")
    assert run.pk not in (stale, template)  # the other batch's run, found and used
    assert (run.events_count, run.rounds) == (1, 5)
    assert _seqs(tenant, "r-a") == [1] and _seqs(tenant, "r-b") == [1, 2]
    assert _RUN_PKS.pks[(tenant.pk, "r-a")] == run.pk


def test_runs_dropped_empty_are_forgotten(needs_postgres, tenant):
    from ingest.services import runs_drop_empty, runs_hold

    with transaction.atomic():
        created = runs_hold(tenant=tenant, run_ids=["r-waiting"])
        assert len(created) == 1
        runs_drop_empty(run_pks=created)
    assert (tenant.pk, "r-waiting") not in _RUN_PKS.pks
    assert not Run.objects.filter(tenant=tenant, run_id="r-waiting").exists()

    _ingest(tenant, "r-waiting", range(1, 3))
    assert _seqs(tenant, "r-waiting") == [1, 2]
    assert _RUN_PKS.pks[(tenant.pk, "r-waiting")] == Run.objects.get(tenant=tenant, run_id="r-waiting").pk
