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
    b = Run.objects.get(tenant=tenant, run_id="r-b")
    c = Run.objects.get(tenant=other_tenant, run_id="r-c")
    # What a process could hold after the database was restored to an earlier point: the pk of
    # another run of the tenant, or of another tenant's run.
    _RUN_PKS.learn(tenant.pk, [("r-a", b.pk), ("r-d", c.pk)])

    _ingest(tenant, "r-a", range(1, 2))
    _ingest(tenant, "r-d", range(1, 4))

    a = Run.objects.get(tenant=tenant, run_id="r-a")
    d = Run.objects.get(tenant=tenant, run_id="r-d")
    assert a.pk not in (b.pk, c.pk) and d.pk not in (b.pk, c.pk)
    assert (a.events_count, d.events_count) == (1, 3)
    b.refresh_from_db()
    c.refresh_from_db()
    assert (b.events_count, c.events_count) == (2, 1)  # untouched
    assert _seqs(tenant, "r-b") == [1, 2] and _seqs(other_tenant, "r-c") == [1]


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
