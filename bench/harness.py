"""What the benches share: the bench database, the server under test, client processes released
together, where the machine's CPU went, and the figures' arithmetic.

Each bench is a script (`.venv/bin/python bench/NAME.py`) that puts the repository root first on
sys.path (so that `ingest` is the app, not bench/ingest.py) and imports this module as
`bench.harness`. It never imports the app itself: the benches that need Django set it up themselves.
"""

from __future__ import annotations

import contextlib
import http.client
import multiprocessing as mp
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # the only host a bench talks HTTP to
INGEST_PATH = "/api/v1/events"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def interrupted(signum, frame) -> None:
    """A SIGTERM handler: stop as Ctrl-C does (the `finally` blocks stop what the bench started)."""
    raise KeyboardInterrupt(f"signal {signum}")


# --- the bench database and the server under test --------------------------------------------------


class SetupError(Exception):
    pass


def _with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + db))


def ensure_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    if not name:
        raise SetupError(f"--database-url {url!r} names no database")
    with psycopg.connect(_with_db(url, "postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created database {name}")


def server_env(args) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        DEBUG="false",
        SECRET_KEY="bench-" + secrets.token_hex(24),
        LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="loopwatch.settings",
    )
    return env


def manage(env: dict[str, str], *argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise SetupError(f"manage.py {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc.stdout


def reset_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE ingest_event, ingest_run RESTART IDENTITY CASCADE")


def checkpoint(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) != 0


class Server:
    """uvicorn in a session of its own; stop() ends that process group (and only it)."""

    def __init__(self, args, env: dict[str, str], key: str) -> None:
        self.args = args
        self.key = key
        self.log_path = Path(f"/tmp/loopwatch-bench-uvicorn-{args.port}.log")
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "uvicorn"),
                args.app,
                "--host",
                HOST,
                "--port",
                str(args.port),
                "--workers",
                str(args.workers),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SetupError(f"uvicorn exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                conn = http.client.HTTPConnection(HOST, self.args.port, timeout=5)
                conn.request("GET", "/api/v1/runs?limit=1", headers={"Authorization": f"Bearer {self.key}"})
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    # With several workers, give the others the time to finish booting too.
                    time.sleep(0.5 if self.args.workers == 1 else 2.0)
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise SetupError(f"uvicorn did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def worker_pids(self) -> list[int]:
        if self.args.workers == 1:
            return [self.proc.pid]
        pids = []
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return []
        for pid in map(int, children):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"resource_tracker" not in cmdline:
                pids.append(pid)
        return pids

    def log_tail(self) -> str:
        self.log.flush()
        return "".join(self.log_path.read_text(errors="replace").splitlines(keepends=True)[-30:])

    def stop(self) -> None:
        stop_group(self.proc, timeout=15)
        self.log.close()


def stop_group(proc: subprocess.Popen, *, timeout: float) -> None:
    """TERM the process group of `proc` (started with start_new_session), KILL it after `timeout`,
    then KILL what its supervisor left behind in the group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def sign_in(port: int, username: str, password: str) -> str:
    """Sign in through the login form as a browser does; the Cookie header of the session."""
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    conn.request("GET", "/accounts/login/")
    response = conn.getresponse()
    page = response.read().decode()
    csrf_cookie = re.search(r"csrftoken=([^;]+)", response.getheader("Set-Cookie") or "").group(1)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    body = f"username={username}&password={password}&csrfmiddlewaretoken={token}&next=/alerts/"
    conn.request(
        "POST",
        "/accounts/login/",
        body=body,
        headers={"Content-Type": "application/x-www-form-urlencoded", "Cookie": f"csrftoken={csrf_cookie}"},
    )
    response = conn.getresponse()
    response.read()
    session = re.search(r"sessionid=([^;]+)", response.getheader("Set-Cookie") or "")
    if response.status != 302 or session is None:
        raise SetupError(f"sign-in failed: HTTP {response.status}")
    conn.close()
    return f"sessionid={session.group(1)}; csrftoken={csrf_cookie}"


# --- client processes, released together ----------------------------------------------------------


def _post(conn: http.client.HTTPConnection, body: bytes, key: str) -> tuple[int, bytes]:
    conn.request(
        "POST",
        INGEST_PATH,
        body=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    return resp.status, resp.read()


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def run_phase(target, jobs: list[tuple], timeout: float, watch_pids: list[int] = ()) -> dict:
    """Start one process per job, release them together, collect their reports within the timeout."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(jobs) + 1)
    out_q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*job, barrier, out_q), daemon=True) for job in jobs]
    for proc in procs:
        proc.start()
    reports: list[dict] = []
    completed = False
    try:
        try:
            barrier.wait(timeout=timeout)
        except Exception as exc:
            errors = []
            with contextlib.suppress(Exception):
                while len(errors) < len(jobs):
                    errors.append(out_q.get(timeout=2.0).get("error", ""))
            raise SetupError(
                f"the clients did not all start ({exc!r}):\n" + "\n".join(e for e in errors if e)
            ) from None
        busy0, total0 = system_busy()
        watched0 = {pid: _proc_cpu(pid) for pid in watch_pids}
        pg0 = postgres_cpu()
        deadline = time.monotonic() + timeout + 30
        while len(reports) < len(jobs) and time.monotonic() < deadline:
            try:
                reports.append(out_q.get(timeout=1.0))
            except Exception:
                if not any(p.is_alive() for p in procs) and out_q.empty():
                    break
        busy1, total1 = system_busy()
        per_worker = [_proc_cpu(pid) - cpu for pid, cpu in watched0.items()]
        watched = sum(per_worker)
        time.sleep(0.05)  # let the postmaster reap the backends of the connections just closed
        pg = postgres_cpu_delta(pg0, postgres_cpu())
        completed = True
    finally:
        grace = time.monotonic() + (5 if completed else 0)  # interrupted: stop the clients at once
        for proc in procs:
            proc.join(timeout=max(0.0, grace - time.monotonic()))
            if proc.is_alive():
                proc.terminate()  # one of ours, by its own handle
                proc.join(timeout=5)
    return {
        "reports": reports,
        "missing": len(jobs) - len(reports),
        "busy": busy1 - busy0,
        "total": total1 - total0,
        "watched_cpu": watched,
        "per_worker_cpu": per_worker,
        "pg_cpu": pg,
    }


# --- where the CPU went ----------------------------------------------------------------------------


def system_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])
    idle = fields[3] + fields[4]
    return (total - idle) / CLK_TCK, total / CLK_TCK


def background_load(seconds: float = 2.0) -> float:
    """Share of the machine's CPU busy while this script does nothing: other work skews the figures."""
    busy0, total0 = system_busy()
    time.sleep(seconds)
    busy1, total1 = system_busy()
    return (busy1 - busy0) / max(total1 - total0, 1e-9)


def _proc_stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process so far, 0 when it is gone."""
    try:
        fields = _proc_stat(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def postgres_cpu() -> tuple[dict[int, float], float]:
    """CPU seconds so far of every PostgreSQL process, and of the postmaster's ended children.

    The server opens a connection per request (a backend that lives for one batch): when a backend
    ends, the postmaster reaps it and the kernel adds its CPU to the postmaster's cutime/cstime.
    """
    live: dict[int, float] = {}
    reaped = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            fields = _proc_stat(pid)
            live[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
            if Path(f"/proc/{fields[1]}/comm").read_text().strip() != "postgres":  # the postmaster
                reaped += (int(fields[13]) + int(fields[14])) / CLK_TCK
        except OSError:
            continue
    return live, reaped


def postgres_cpu_delta(start: tuple[dict[int, float], float], end: tuple[dict[int, float], float]) -> float:
    (live0, reaped0), (live1, reaped1) = start, end
    alive = sum(cpu - live0.get(pid, 0.0) for pid, cpu in live1.items())
    # An ended process added its whole life to `reaped`: take off what it had used before the start.
    ended = (reaped1 - reaped0) - sum(cpu for pid, cpu in live0.items() if pid not in live1)
    return alive + ended


# --- figures ---------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def cpu_line(phase: dict, count: int, workers_label: str | None, client_cpu: float) -> str:
    """Where the machine's CPU went during a phase, in microseconds per event (row)."""
    us = 1e6 / max(1, count)
    parts = []
    if workers_label:
        parts.append(f"{workers_label} {phase['watched_cpu'] * us:.0f} us")
    parts.append(f"PostgreSQL {phase['pg_cpu'] * us:.0f} us")
    parts.append(f"clients {client_cpu * us:.0f} us")
    other = phase["busy"] - phase["watched_cpu"] - phase["pg_cpu"] - client_cpu
    parts.append(f"other processes {max(0.0, other) * us:.0f} us")
    busy = phase["busy"] / max(phase["total"], 1e-9)
    return ", ".join(parts) + f" (machine {busy:.0%} busy)"


def redis_purge(url: str) -> int:
    import redis  # celery[redis] brings it

    client = redis.Redis.from_url(url)
    try:
        queued = client.dbsize()
        client.flushdb()
        return queued
    finally:
        client.close()
