"""The fault suite's fixtures (tests/faults/servers.py) and the table it prints at the end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.faults.report import table
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


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    terminalreporter.write_sep("=", "fault scenarios")
    terminalreporter.write_line(table(ROWS))
    if path := os.environ.get(REPORT_ENV):
        Path(path).write_text(json.dumps(ROWS, indent=1))
