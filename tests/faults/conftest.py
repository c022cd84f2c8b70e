"""The fault suite's fixtures (tests/faults/servers.py) and the table it prints at the end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.faults.servers import (  # noqa: F401 - fixtures
    _postgres_cluster,
    _template,
    app,
    loopwatch_db,
    private_postgres,
    private_redis,
)

# bench/faults.py sets it to collect the rows; the terminal summary prints them either way.
REPORT_ENV = "LOOPWATCH_FAULTS_REPORT"
ROWS: list[dict] = []


@pytest.fixture
def fault_table():
    """Append a scenario's row (FaultRun.row()) to the session's table."""
    return ROWS.append


def table(rows: list[dict]) -> str:
    head = f"{'scenario':<22} {'sent':>5} {'stored':>6} {'procd':>6} {'detect':>6}  {'fault s':>7} {'slowest s':>9} {'api back s':>10} {'detect back s':>13} {'caught up s':>11}  codes during the fault"
    lines = [head, "-" * len(head)]
    for r in rows:
        codes = " ".join(f"{code}x{n}" for code, n in r["codes"].items())
        lines.append(
            f"{r['scenario']:<22} {r['sent']:>5} {r['stored']:>6} {r['processed']:>6} {r['detections'] or 0:>6}"
            f"  {r['fault_s']:>7} {r['slowest_s']:>9} {_s(r['api_back_s']):>10} {_s(r['detection_back_s']):>13}"
            f" {r['caught_up_s']:>11}  {codes}"
        )
    return "\n".join(lines)


def _s(value) -> str:
    return "-" if value is None else str(value)


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    terminalreporter.write_sep("=", "fault scenarios")
    terminalreporter.write_line(table(ROWS))
    if path := os.environ.get(REPORT_ENV):
        Path(path).write_text(json.dumps(ROWS, indent=1))
