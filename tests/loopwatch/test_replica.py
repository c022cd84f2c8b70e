"""The dashboards read from a streaming replica (DATABASE_REPLICA_URL), tested with a real one: a
private primary and a standby made by pg_basebackup -R, on free ports in a temporary folder
(tests/faults/servers.py's clusters). Pausing the standby's replay shows who reads where."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.servers import HOST, ROOT, PrivatePostgres, _missing, pg_bin


def _basebackup(bindir: Path) -> str | None:
    here = Path(os.path.realpath(bindir / "pg_ctl")).parent / "pg_basebackup"
    return str(here) if here.exists() else shutil.which("pg_basebackup")


@pytest.fixture(scope="module")
def primary_and_replica():
    bindir = pg_bin()
    if bindir is None or not (bindir / "initdb").exists():
        _missing("initdb and pg_ctl")
    basebackup = _basebackup(bindir)
    if basebackup is None:
        _missing("pg_basebackup")
    primary = PrivatePostgres(bindir)
    replica = PrivatePostgres(bindir)
    try:
        primary.init()
        primary.start()
        with primary.connect(autocommit=True) as conn:
            conn.execute("CREATE DATABASE loopwatch")
        # The standby: a base backup of the primary that follows it (-R writes primary_conninfo
        # and standby.signal), started on a port of its own.
        _base_backup(basebackup, primary, replica)
        replica.start()
        yield primary, replica
    finally:
        replica.remove()
        primary.remove()


def _base_backup(basebackup: str, primary: PrivatePostgres, replica: PrivatePostgres) -> None:
    cmd = [basebackup, "-h", HOST, "-p", str(primary.port), "-U", "postgres", "-D", str(replica.data)]
    cmd += ["-R", "-X", "stream", "--no-sync"]
    if replica._as_postgres:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)


def test_the_dashboards_read_from_the_replica_and_a_writer_reads_its_writes(primary_and_replica):
    primary, replica = primary_and_replica
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_REPLICA_URL")},
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": primary.url("loopwatch"),
        "DATABASE_REPLICA_URL": replica.url("loopwatch"),
    }
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    run = subprocess.run(
        [sys.executable, "-m", "tests.loopwatch.replica_scenario"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    before, after = "run-alpha-7", "run-bravo-7"
    # The page reads the replica, paused before the second run was stored.
    assert seen["runs page, replica paused"] == {before: True, after: False}
    # The API (and ingest, the guard, the ledger) read the primary.
    assert seen["API, replica paused"] == {before: True, after: True}
    # A verdict written on a page goes to the primary, and that browser then reads the primary.
    assert seen["verdict"] == {"status": 302, "stored": "true_loop"}
    assert seen["runs page after a write"] == {before: True, after: True}
    assert seen["runs page, another browser"] == {before: True, after: False}
    assert seen["runs page, replica resumed"] == {before: True, after: True}
