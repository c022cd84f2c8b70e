#!/usr/bin/env python3
"""The two Quickstart commands, with nothing but python3 on the machine.

    python3 dev.py up      install, migrate, create the demo user and key, serve on :8000 with demo traffic
    python3 dev.py test    install, run the checks (ruff, mypy, manage.py check, makemigrations --check), then the test suite

Both create .venv/ on first use and reinstall only when pyproject.toml changes.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".loopwatch-installed"
DEMO_KEY_FILE = ROOT / "var" / "demo-api-key"


def sh(*args: str | Path, env: dict | None = None) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], cwd=ROOT, env=env, check=True)


def install() -> None:
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted and PY.exists():
        return
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.create(VENV, with_pip=True)
    # -qq: errors only. At -q, every editable install prints setuptools' notice about folders named
    # like packages (nothing to act on); a failure still prints and stops here.
    sh(PY, "-m", "pip", "install", "-qq", "--upgrade", "pip")
    sh(PY, "-m", "pip", "install", "-qq", "-e", ".[dev]")
    STAMP.write_text(wanted)


def up(argv: list[str]) -> int:
    """The server, the demo traffic and — without Redis, so without Celery beat — the beat's jobs.

    1. Migrate; demo_setup makes the demo user, tenant, API key and the tenant's reconciler, which
       asks the demo payment service that `simulate` serves on PORT+1 (an address on 127.0.0.1,
       so LOOPWATCH_RECONCILER_ALLOWED_HOSTS names it unless set).
    2. uvicorn serves the app; `simulate` sends the demo traffic to it (REST, OTLP, the guard);
       `demo_beat` runs CELERY_BEAT_SCHEDULE's jobs (reconciliation, the rollup, ...) in the
       embedded mode, where no beat process runs.
    3. Ctrl-C stops all three; the server keeps running when the traffic ends by itself.
    """
    # Ctrl-C and `kill` end the children too. Explicit handlers, because a shell that starts dev.py
    # in the background without job control makes it ignore SIGINT, and children inherit that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    install()
    port = os.environ.get("PORT", "8000")
    downstream_port = os.environ.get("DEMO_DOWNSTREAM_PORT", str(int(port) + 1))
    # A development server on 127.0.0.1: Django's debug pages, cookies over plain HTTP and an open
    # /metrics (loopwatch's default is DEBUG off; see docs/security.md). DEBUG=false here still wins.
    env = {
        **os.environ,
        "DEBUG": os.environ.get("DEBUG", "true"),
        "LOOPWATCH_RECONCILER_ALLOWED_HOSTS": os.environ.get(
            "LOOPWATCH_RECONCILER_ALLOWED_HOSTS", "127.0.0.1"
        ),
    }
    manage = [PY, "manage.py"]
    sh(*manage, "migrate", "--no-input", "-v", "0", env=env)
    downstream = f"http://127.0.0.1:{downstream_port}"
    sh(*manage, "demo_setup", "--key-file", DEMO_KEY_FILE, "--downstream-url", downstream, env=env)
    key = DEMO_KEY_FILE.read_text().strip()
    server = subprocess.Popen(
        [
            str(BIN / "uvicorn"),
            "loopwatch.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            port,
            "--no-access-log",
            "--lifespan",
            "off",  # Django's ASGI app has no lifespan events: uvicorn would say so at every start
        ],
        cwd=ROOT,
        env=env,
    )
    time.sleep(1.5)
    print(f"\nloopwatch is serving at http://127.0.0.1:{port}/  (login: demo / demo)\n", flush=True)
    simulate = subprocess.Popen(
        [
            str(PY),
            "manage.py",
            "simulate",
            "--url",
            f"http://127.0.0.1:{port}",
            "--key",
            key,
            "--downstream-port",
            downstream_port,
            *argv,
        ],
        cwd=ROOT,
        env=env,
    )
    helpers = [simulate]
    if not env.get("REDIS_URL"):  # eager Celery: no beat; with Redis, run `celery beat` as in production
        helpers.append(subprocess.Popen([str(PY), "manage.py", "demo_beat"], cwd=ROOT, env=env))
    try:
        while server.poll() is None and simulate.poll() is None:
            time.sleep(0.5)
        if simulate.poll() is not None and server.poll() is None:
            print("demo traffic finished; the server keeps running (Ctrl-C to stop)", flush=True)
            server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        # The traffic and beat first (simulate prints its summary), then the server they talk to.
        for group in (helpers, [server]):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            for proc in group:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return server.returncode or 0


# A production-like environment for `manage.py check --deploy`: what docs/security.md tells a
# deployment to set. The check fails on warnings too, so a setting that weakens it fails CI.
DEPLOY_ENV = {
    "DEBUG": "false",
    "SECRET_KEY": "deploy-check-" + "k3y-" * 12,
    "ALLOWED_HOSTS": "loopwatch.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://loopwatch.example.com",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
}


def checks() -> None:
    """What .pre-commit-config.yaml runs before a commit; a failing one stops `dev.py test`."""
    sh(BIN / "ruff", "check", ".")
    sh(BIN / "ruff", "format", "--check", ".")
    sh(BIN / "mypy")  # files and settings in pyproject.toml; its cache in .mypy_cache/
    tests_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}  # as pytest runs them
    sh(PY, "manage.py", "check", "--fail-level", "WARNING", env=tests_env)
    sh(PY, "manage.py", "makemigrations", "--check", "--dry-run", "-v", "0", env=tests_env)


def test(argv: list[str]) -> int:
    install()
    checks()
    deploy_env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    deploy_env |= {"DJANGO_SETTINGS_MODULE": "loopwatch.settings", **DEPLOY_ENV}
    sh(PY, "manage.py", "check", "--deploy", "--fail-level", "WARNING", env=deploy_env)
    return subprocess.run([str(PY), "-m", "pytest", *argv], cwd=ROOT).returncode


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("up", "test"):
        print(__doc__)
        return 2
    command, argv = sys.argv[1], sys.argv[2:]
    try:
        return up(argv) if command == "up" else test(argv)
    except subprocess.CalledProcessError as exc:
        print(
            f"dev.py: {' '.join(map(str, exc.cmd))} failed with exit code {exc.returncode}", file=sys.stderr
        )
        return exc.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
