"""Outages with real processes: uvicorn (2 workers) and a Celery worker (2 pool processes) on a
PostgreSQL and a Redis of the module's own, which each scenario stops, kills, freezes or empties
while agent traffic flows (~1,800 events a scenario, from four senders, with a probe of the read
API and of a dashboard page every 0.2 s). No beat runs, except in the scenario about two beats: the
workers find lost runs themselves (LOOPWATCH_SWEEP_EVERY_S, here SWEEP_EVERY_S).

Every scenario asserts that each event sent was stored and processed once and that the stored
detections are `manage.py replay`'s for the same events; then what the outage may look like from
outside: the HTTP codes seen while it lasted, how long an answer took, and how soon service came
back after it. The processes are shared by the scenarios, in order: each one starts from the
previous one's recovery, which is itself checked. The table of figures is printed at the end of
the session (and written for bench/faults.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults.scenario import FaultRun
from tests.faults.servers import (
    App,
    Database,
    PrivatePostgres,
    PrivateRedis,
    Service,
    app_on,
    database_copy,
    redis_server,
    workdir,
)
from tests.faults.traffic import pipeline_state

pytestmark = pytest.mark.faults

RUNS = 70  # ~1,800 events a scenario
TRAFFIC_S = 7.0
BEFORE_FAULT_S = 1.5
OUTAGE_S = 4.0  # past psycopg_pool's first reconnect delays (1 + 2 s): its next try came at 7 s
SWEEP_EVERY_S = 3  # the workers' own sweep, short here so that the suite stays short (default 30)
ANSWER_WITHIN_S = 5.0  # "within a few seconds": a request during a database outage is answered by then
BACK_WITHIN_S = 2.0  # service after the database is back
ENQUEUE_WITHIN_S = 0.5  # "a few hundred ms": what a frozen or absent Redis may add to an ingest request
SLACK_S = 1.0  # a loaded 2-core machine (seven test suites at once) may add this much


@dataclass
class Stack:
    postgres: PrivatePostgres
    redis: PrivateRedis
    db: Database
    app: App
    workdir: Path
    worker: Service

    def heal(self) -> None:
        """Both servers up and answering, a worker running: how every scenario starts and ends."""
        self.postgres.ensure_running()
        if self.redis.running():
            self.redis.thaw()
        else:
            self.redis.start()
        if not self.worker.alive():
            self.worker = self.app.worker()


@pytest.fixture(scope="module")
def stack(_postgres_cluster, _template) -> Iterator[Stack]:
    with (
        workdir() as folder,
        database_copy(_postgres_cluster, _template) as db,
        redis_server() as redis,
        app_on(db, redis, folder, LOOPWATCH_SWEEP_EVERY_S=str(SWEEP_EVERY_S)) as app,
    ):
        app.web()
        yield Stack(_postgres_cluster, redis, db, app, folder, app.worker())


@pytest.fixture
def healthy(stack) -> Iterator[Stack]:
    stack.heal()
    yield stack
    stack.heal()


def _start(name: str, stack: Stack, *, seed: int) -> FaultRun:
    workdir = stack.workdir / f"scenario-{seed}"
    workdir.mkdir()
    run = FaultRun(name=name, app=stack.app, db=stack.db, postgres=stack.postgres, workdir=workdir)
    return run.start(runs=RUNS, seed=seed, duration_s=TRAFFIC_S)


def _finish(run: FaultRun, fault_table) -> None:
    run.finish()
    run.check_pipeline()
    fault_table(run.row())


def _assert_database_outage(run: FaultRun) -> None:
    """503 with Retry-After, quickly, and nothing else; back soon after the database is."""
    during = run.answers.between(run.fault_start, run.fault_end)
    statuses = {a.status for a in during}
    assert statuses <= {200, 503}, run.codes()
    assert 503 in statuses, run.codes()
    assert all(a.retry_after for a in during if a.status == 503), "a 503 without Retry-After"
    slow = sorted(a.seconds for a in during)[-5:]
    assert slow[-1] < ANSWER_WITHIN_S + SLACK_S, f"answers during the outage took up to {slow} s"
    back = run.answer_back_s()
    assert back is not None and back < BACK_WITHIN_S + SLACK_S, (
        f"the API answered again {back} s after the database"
    )


def _assert_ingest_unaffected(run: FaultRun) -> None:
    """Every request answered 200, no ingest request held for more than ENQUEUE_WITHIN_S."""
    during = run.answers.between(run.fault_start, run.fault_end)
    assert {a.status for a in during} == {200}, run.codes()
    ingest = sorted(a.seconds for a in during if a.kind == "ingest")[-5:]
    assert ingest and ingest[-1] < ENQUEUE_WITHIN_S + SLACK_S, (
        f"ingest answers during the fault took up to {ingest} s"
    )


def _assert_detection_back(run: FaultRun, within_s: float) -> None:
    resumed = run.detection_back_s()
    assert resumed is not None and resumed < within_s + SLACK_S, (
        f"detection resumed {resumed} s after the fault"
    )


# --- PostgreSQL -------------------------------------------------------------------------------------


def test_postgres_stopped(healthy, fault_table):
    run = _start("postgres stopped", healthy, seed=1)
    time.sleep(BEFORE_FAULT_S)
    with run.fault():
        healthy.postgres.stop("fast")
        time.sleep(OUTAGE_S)
        healthy.postgres.start()
    _finish(run, fault_table)
    _assert_database_outage(run)


def test_postgres_killed(healthy, fault_table):
    run = _start("postgres killed", healthy, seed=2)
    time.sleep(BEFORE_FAULT_S)
    with run.fault():
        healthy.postgres.kill()  # SIGKILL to every process of the cluster: start() recovers from the WAL
        time.sleep(OUTAGE_S)
        healthy.postgres.start()
    _finish(run, fault_table)
    _assert_database_outage(run)


def test_postgres_frozen(healthy, fault_table):
    run = _start("postgres frozen", healthy, seed=3)
    time.sleep(BEFORE_FAULT_S)
    with run.fault():
        healthy.postgres.freeze()  # SIGSTOP: connections stay open, nothing answers
        time.sleep(OUTAGE_S)
        healthy.postgres.thaw()
    _finish(run, fault_table)
    _assert_database_outage(run)


# --- Redis --------------------------------------------------------------------------------------------


def test_redis_frozen(healthy, fault_table):
    run = _start("redis frozen", healthy, seed=4)
    time.sleep(BEFORE_FAULT_S)
    with run.fault():
        healthy.redis.freeze()
        time.sleep(OUTAGE_S)
        healthy.redis.thaw()
    _finish(run, fault_table)
    _assert_ingest_unaffected(run)
    # The runs kept by the web processes are added again at once; the worker's connection lived on.
    _assert_detection_back(run, 2.0)


def test_redis_restarted_empty(healthy, fault_table):
    run = _start("redis down, back empty", healthy, seed=5)
    time.sleep(BEFORE_FAULT_S)
    with run.fault():
        healthy.redis.kill()  # its queue, the runs waiting and the flags are gone with it
        time.sleep(OUTAGE_S)
        healthy.redis.start()
    _finish(run, fault_table)
    _assert_ingest_unaffected(run)
    # Celery's worker reconnects on its own schedule (2, 4, 6 … s apart); then the runs are there:
    # the web processes add theirs again, and the sweep finds those the lost tasks had taken.
    _assert_detection_back(run, 6.0 + SWEEP_EVERY_S)


def test_enqueues_lost_without_beat(healthy, fault_table):
    """Beat is not the only safety net. No beat runs. The worker stops (a warm shutdown: its tasks
    finish) while the traffic goes on, so that the last runs wait in Redis; then the runs waiting,
    the flag and the queued tasks vanish (FLUSHALL) and a new worker starts: nothing tells it about
    those runs but a sweep, and the workers' own finds them within SWEEP_EVERY_S."""
    run = _start("enqueues lost, no beat", healthy, seed=6)
    time.sleep(BEFORE_FAULT_S)
    with run.fault():
        healthy.worker.stop()
        run.traffic.join(60)
        time.sleep(0.5)  # the last enqueues reach Redis
        healthy.redis.client().flushall()
        with healthy.postgres.connect(healthy.db.name) as conn:
            lost = pipeline_state(conn, run.traffic.prefix)
        healthy.worker = healthy.app.worker()
    assert lost.position < lost.stored, f"nothing was waiting when Redis was emptied: {lost}"
    assert not [s for s in healthy.app.services if s.name.startswith("beat") and s.alive()]
    _finish(run, fault_table)
    _assert_ingest_unaffected(run)
    caught_up = run.caught_up_at - run.fault_end
    assert caught_up < SWEEP_EVERY_S + 2.0 + SLACK_S, f"the lost runs were processed {caught_up:.1f} s later"


# --- the worker and beat ----------------------------------------------------------------------------


def test_worker_killed_mid_pass(healthy, fault_table):
    """SIGKILL to pool processes while they process (Celery starts others), then to the whole worker
    (a new one is started): the runs the killed tasks had taken come back through the sweep."""
    run = _start("worker killed", healthy, seed=7)
    time.sleep(BEFORE_FAULT_S)
    with run.fault():
        for _ in range(3):
            for pid in healthy.worker.children():
                _kill(pid)
            time.sleep(1.0)
        killed = healthy.worker
        killed.kill()
        healthy.worker = healthy.app.worker()
    # At least one pass was under way when its process died (Celery says so: WorkerLostError).
    assert "WorkerLostError" in killed.log.read_text(errors="replace"), killed.tail()
    _finish(run, fault_table)
    _assert_ingest_unaffected(run)
    _assert_detection_back(run, SWEEP_EVERY_S)


def test_two_beats(healthy, fault_table):
    """Two beats send every periodic task twice: each is harmless twice."""
    beats = [healthy.app.beat(name="beat-a"), healthy.app.beat(name="beat-b")]
    run = _start("two beats", healthy, seed=8)
    with run.fault():
        time.sleep(TRAFFIC_S)
    for beat in beats:
        beat.stop()
    _finish(run, fault_table)
    _assert_ingest_unaffected(run)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
