import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_engine_imports_without_django():
    code = (
        "import sys; import ingest.detection as d; from ingest.detection import replay_run; "
        "replay_run([{'type': 'tool_call', 'run_id': 'r', 'ts': '2026-11-29T10:00:00Z', 'round': 1, "
        "'call_id': 'c', 'tool': 't', 'args': {}}]); "
        "assert 'django' not in sys.modules, sorted(m for m in sys.modules if m.startswith('django'))"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_the_engine_reads_no_clock():
    source = "\n".join(p.read_text() for p in (ROOT / "ingest" / "detection").glob("*.py"))
    for forbidden in (
        "datetime.now",
        "time.time",
        "time.monotonic",
        "utcnow",
        "import django",
        "from django",
    ):
        assert forbidden not in source
