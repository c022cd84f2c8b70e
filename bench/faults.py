"""The fault scenarios' table: what each outage looked like from outside, and how soon it was over.

    .venv/bin/python bench/faults.py [-k EXPR]

1. Samples the machine's load for 2 s (other processes make every time below longer; the table
   says so).
2. Runs the fault suite's scenarios (tests/faults/test_outages.py, through pytest: a private
   PostgreSQL cluster and redis-server, uvicorn with 2 workers, a Celery worker, no beat but in
   the two-beats scenario), asking it to write its rows to a temporary file. `-k` is pytest's.
3. Prints the table: per scenario the events sent / stored / processed (equal, or the scenario
   failed), the engine's detections (equal to replay's), the HTTP codes answered while the fault
   lasted, the slowest answer then, and the recovery: the read API's first 2xx after the fault
   (the database), detection's first progress, the backlog caught up. The targets beside them are
   the issue's (12): a database outage answers 503 with Retry-After within a few seconds (the
   suite asserts < 5 s) and is over 2 s after the database is back; Redis frozen or gone holds an
   ingest request a few hundred ms at most; lost runs are found within LOOPWATCH_SWEEP_EVERY_S
   (3 s in the suite, 30 s by default) without beat.

Needs what the suite needs: PostgreSQL's server binaries (initdb, pg_ctl), redis-server, and
DATABASE_URL / REDIS_URL for the test process itself. Exits with pytest's code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGETS = (
    "targets: database down or frozen: 503 + Retry-After, answered < 5 s, API back < 2 s after the database;\n"
    "         Redis frozen or gone: ingest answered 200 in < 0.5 s; lost runs found within the sweep (3 s here)"
)


def _load() -> str:
    """The machine's load over 2 s: busy CPU share from /proc/stat, and the load averages."""
    try:
        first = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        time.sleep(2)
        second = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        delta = [b - a for a, b in zip(first, second, strict=True)]
        idle = delta[3] + delta[4]
        busy = 100 * (1 - idle / max(1, sum(delta)))
        averages = Path("/proc/loadavg").read_text().split()[:3]
        return f"background load: {busy:.0f} % of the CPUs busy, load average {' '.join(averages)} ({os.cpu_count()} CPUs)"
    except OSError:
        return "background load: unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="pytest's -k: which scenarios")
    options = parser.parse_args()
    load = _load()
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "faults.json"
        cmd = [sys.executable, "-m", "pytest", "tests/faults/test_outages.py", "-q", "-p", "no:cacheprovider"]
        if options.k:
            cmd += ["-k", options.k]
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "LOOPWATCH_FAULTS_REPORT": str(report)})
        took = time.monotonic() - started
        rows = json.loads(report.read_text()) if report.exists() else []
    from tests.faults.report import table

    print()
    print(load)
    print(f"fault scenarios: {len(rows)} in {took:.0f} s (pytest exit code {done.returncode})")
    if rows:
        print(table(rows))
    print(TARGETS)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
