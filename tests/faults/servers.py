"""Private servers for fault tests: a PostgreSQL cluster and a redis-server of the test's own, and
loopwatch's own processes (uvicorn, Celery worker, Celery beat) pointed at them.

The shared servers are never stopped, frozen or restarted: every fault is done to a server started
here, on a free port, in a temporary folder, and removed at the end. Each server class can
stop (graceful), kill (SIGKILL, as a crash), freeze (SIGSTOP: the kernel still accepts connections
and acknowledges bytes, nothing answers) and thaw (SIGCONT), and start again on the same port.

Fixtures (tests/faults/conftest.py makes them available to every module under tests/faults/):
- `private_postgres`: one cluster for the session (initdb takes seconds); a test that breaks it
  gets it back running afterwards, whatever it did.
- `loopwatch_db`: a fresh migrated database on it per test (a copy of a template migrated once,
  with the demo tenant, user demo/demo and an API key).
- `private_redis`: a redis-server per test.
- `app`: starts uvicorn, Celery workers and beats on those (`app.web()`, `app.worker()`,
  `app.beat()`), each with its log kept for the failure message, all stopped at the end.
- For a module that shares one set of servers between its tests (scope="module"):
  `database_copy`, `redis_server` and `app_on` are the same as context managers.

Outside CI, the tests skip when the binaries are missing; under CI=true they fail.
"""

from __future__ import annotations

import contextlib
import glob
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # a loaded 2-core CI machine starts a Django process in seconds, not minutes
STOP_TIMEOUT_S = 20.0
TEMPLATE_DB = "loopwatch_template"
KEEP_ENV = "LOOPWATCH_FAULTS_KEEP"  # set: the processes' logs stay in /tmp/loopwatch-faults-*
DEMO_TENANT = "demo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _missing(what: str) -> None:
    from tests.conftest import IN_CI  # here: the module is used outside pytest too (bench/soak.py)

    message = f"needs {what} for the private servers of the fault tests"
    if IN_CI:
        pytest.fail(f"{message}: CI must run them")
    pytest.skip(message)


def _wait_until(check: Callable[[], bool], *, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = f":\n{log.read_text(errors='replace')[-3000:]}" if log and log.exists() else ""
            raise AssertionError(f"{what} after {timeout:.0f} s{tail}")
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: PostgreSQL's backends and helpers each
    have a process group of their own, so killpg would miss them)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(stat).read_text()
            ppid = int(text[text.rindex(")") + 2 :].split()[1])
            if ppid == pid:
                found.append(int(stat.split("/")[2]))
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


# --- PostgreSQL ---------------------------------------------------------------------------------


def pg_bin() -> Path | None:
    if found := shutil.which("pg_ctl"):
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


class PrivatePostgres:
    """A PostgreSQL cluster in a temporary folder, on a free port, listening on 127.0.0.1 only.

    initdb refuses to run as root: as root, the cluster belongs to the `postgres` user and every
    pg_ctl runs through runuser. fsync is off (a test's data need not survive the machine; it
    survives a killed server, the page cache keeps it).
    """

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="loopwatch-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres")

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    def start(self, **settings: str) -> None:
        """Start the server; `settings` add to or replace the defaults (fsync off, 200 connections)."""
        settings = {"listen_addresses": HOST, "fsync": "off", "max_connections": "200", **settings}
        options = f"-p {self.port} -k {self.dir} " + " ".join(f"-c {k}={v}" for k, v in settings.items())
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        """A clean shutdown: `fast` ends the sessions, `immediate` skips the checkpoint."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    @property
    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
            return pid
        return None

    def _processes(self) -> list[int]:
        pid = self.postmaster_pid
        return [pid, *_children(pid)] if pid else []

    def kill(self) -> None:
        """SIGKILL to the postmaster and every backend: a crash. start() then runs crash recovery."""
        pids = self._processes()
        _signal(pids, signal.SIGKILL)
        _wait_until(lambda: not any(_alive(p) for p in pids), timeout=10, what="PostgreSQL still alive")

    def freeze(self) -> None:
        """SIGSTOP to the postmaster, then to every child (the postmaster first: it forks no more)."""
        pid = self.postmaster_pid
        assert pid, "PostgreSQL is not running"
        os.kill(pid, signal.SIGSTOP)
        _signal(_children(pid), signal.SIGSTOP)

    def thaw(self) -> None:
        pids = self._processes()
        _signal(pids[1:], signal.SIGCONT)
        _signal(pids[:1], signal.SIGCONT)

    def running(self) -> bool:
        return self.postmaster_pid is not None

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@{HOST}:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres", **kwargs) -> psycopg.Connection:
        return psycopg.connect(
            host=HOST, port=self.port, user="postgres", dbname=dbname, connect_timeout=5, **kwargs
        )

    def ensure_running(self) -> None:
        """After a test: thaw a frozen server, start a stopped or killed one."""
        self.thaw()
        if not self.running():
            self.start()
        _wait_until(self._answers, timeout=30, what="PostgreSQL does not answer", log=self.log)

    def _answers(self) -> bool:
        try:
            with self.connect(autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.thaw()
            if self.running():
                self.stop("immediate")
        pids = self._processes()
        _signal(pids, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
            return False  # a zombie: dead, waiting for its parent
    return True


# --- Redis --------------------------------------------------------------------------------------


class PrivateRedis:
    """A redis-server on a free port, without persistence: a restart comes back empty, as a Redis
    that lost its memory does (queued Celery messages, pending runs and flags all gone)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="loopwatch-redis-"))
        self.log = self.dir / "redis.log"
        self.proc: subprocess.Popen | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--logfile",
                str(self.log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_until(self._answers, timeout=20, what="redis-server does not answer", log=self.log)

    def _answers(self) -> bool:
        assert self.proc and self.proc.poll() is None, f"redis-server exited:\n{self.log.read_text()[-2000:]}"
        try:
            return bool(self.client(timeout=1).ping())
        except redis.RedisError:
            return False

    def client(self, db: int = 0, timeout: float = 5) -> redis.Redis:
        return redis.Redis(
            host=HOST, port=self.port, db=db, socket_timeout=timeout, socket_connect_timeout=timeout
        )

    def url(self, db: int = 0) -> str:
        return f"redis://{HOST}:{self.port}/{db}"

    def stop(self) -> None:
        assert self.proc
        self.proc.terminate()
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def kill(self) -> None:
        assert self.proc
        self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def freeze(self) -> None:
        assert self.proc
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc
        self.proc.send_signal(signal.SIGCONT)

    def remove(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        shutil.rmtree(self.dir, ignore_errors=True)


# --- loopwatch's processes ------------------------------------------------------------------------


class Service:
    """One of loopwatch's processes (with its children), in a session of its own, logging to a file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.cmd, self.env, self.log = name, cmd, env, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> Service:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                self.cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc
        return self.proc.pid

    def children(self) -> list[int]:
        return _children(self.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def freeze(self) -> None:
        """SIGSTOP to the whole group: it holds its connections, and whatever locks it held in the
        database, and does nothing."""
        os.killpg(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL to the whole group (the process and its children): a crash."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL after STOP_TIMEOUT_S."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what the supervisor left behind, too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def tail(self, chars: int = 3000) -> str:
        return f"--- {self.name} ({self.log}) ---\n{self.log.read_text(errors='replace')[-chars:]}"


@dataclass
class App:
    """loopwatch pointed at a private database and Redis: start what a scenario needs."""

    database_url: str
    redis_url: str
    workdir: Path
    api_key: str
    queue: str = field(default_factory=lambda: f"faults-{uuid.uuid4().hex[:8]}")
    extra_env: dict[str, str] = field(default_factory=dict)
    services: list[Service] = field(default_factory=list)
    base_url: str = ""

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DATABASE_URL", "REDIS_URL", "LOOPWATCH_", "CELERY_", "PYTEST"))
        }
        return {
            **env,
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "CELERY_QUEUE": self.queue,
            "DEBUG": "false",
            "SECRET_KEY": "faults-" + "x" * 40,
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
            **extra,
        }

    def _service(self, name: str, cmd: list[str], **env: str) -> Service:
        log = self.workdir / f"{name}.log"
        for n in range(2, 100):  # a process started again logs to a file of its own
            if not log.exists():
                break
            log = self.workdir / f"{name}-{n}.log"
        service = Service(name, cmd, self.env(**env), log)
        self.services.append(service)
        return service.start()

    def web(self, *, workers: int = 2, **env: str) -> Service:
        """uvicorn serving loopwatch.asgi, as in production: several worker processes."""
        port = free_port()
        uvicorn = str(Path(sys.executable).parent / "uvicorn")
        cmd = [uvicorn, "loopwatch.asgi:application", "--host", HOST, "--port", str(port)]
        cmd += ["--workers", str(workers), "--no-access-log", "--log-level", "warning"]
        service = self._service("web", cmd, **env)
        self.base_url = f"http://{HOST}:{port}"

        def up() -> bool:
            assert service.alive(), service.tail()
            conn = http.client.HTTPConnection(HOST, port, timeout=5)
            try:
                conn.request("GET", "/api/v1/runs")
                return conn.getresponse().status in (401, 403)  # up: it asks for a key
            except OSError:
                return False
            finally:
                conn.close()

        _wait_until(up, timeout=START_TIMEOUT_S, what="uvicorn does not answer", log=service.log)
        # Every worker process answers before the test starts: each must have loaded Django.
        _wait_until(
            lambda: len(service.children()) >= workers,
            timeout=START_TIMEOUT_S,
            what="uvicorn's workers",
            log=service.log,
        )
        time.sleep(1.0)  # the later worker still imports
        return service

    def worker(self, *, concurrency: int = 2, name: str = "worker", **env: str) -> Service:
        cmd = [sys.executable, "-m", "celery", "-A", "loopwatch", "worker", "-Q", self.queue]
        cmd += ["-c", str(concurrency), "-P", "prefork", "-n", f"{name}-{self.queue}@%h"]
        cmd += ["--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]
        service = self._service(name, cmd, **env)
        _wait_until(
            lambda: "ready." in service.log.read_text(errors="replace"),
            timeout=START_TIMEOUT_S,
            what=f"{name} not ready",
            log=service.log,
        )
        return service

    def beat(self, *, name: str = "beat", **env: str) -> Service:
        schedule = self.workdir / f"{name}-schedule"
        cmd = [sys.executable, "-m", "celery", "-A", "loopwatch", "beat", "-s", str(schedule), "-l", "INFO"]
        cmd += ["--pidfile", ""]
        service = self._service(name, cmd, **env)
        _wait_until(
            lambda: "beat: Starting" in service.log.read_text(errors="replace"),
            timeout=START_TIMEOUT_S,
            what=f"{name} not started",
            log=service.log,
        )
        return service

    def logs(self) -> str:
        return "\n".join(service.tail() for service in self.services)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


# --- fixtures ---------------------------------------------------------------------------------------


def _manage(*args: str, database_url: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**env, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def _postgres_cluster() -> Iterator[PrivatePostgres]:
    bindir = pg_bin()
    if bindir is None or (os.geteuid() == 0 and not shutil.which("runuser")):
        _missing("PostgreSQL's server binaries (initdb, pg_ctl)")
    cluster = PrivatePostgres(bindir)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def private_postgres(_postgres_cluster) -> Iterator[PrivatePostgres]:
    """The session's private cluster, running; running again after the test, whatever it did."""
    _postgres_cluster.ensure_running()
    yield _postgres_cluster
    _postgres_cluster.ensure_running()


@pytest.fixture(scope="session")
def _template(_postgres_cluster) -> str:
    """A database migrated once, with the demo tenant, user demo/demo and an API key. Returns the key."""
    with _postgres_cluster.connect(autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    key_file = _postgres_cluster.dir / "template-api-key"
    # Both commands in one process: a Django start-up is seconds on a busy machine.
    script = (
        "from pathlib import Path; from django.core.management import call_command as c; "
        "c('migrate', interactive=False, verbosity=0); "
        f"c('demo_setup', key_file=Path({str(key_file)!r}), tenant={DEMO_TENANT!r})"
    )
    _manage("shell", "-c", script, database_url=_postgres_cluster.url(TEMPLATE_DB))
    return key_file.read_text().strip()


@dataclass(frozen=True)
class Database:
    name: str
    url: str
    api_key: str


@contextlib.contextmanager
def database_copy(cluster: PrivatePostgres, api_key: str) -> Iterator[Database]:
    """A fresh copy of the template (migrated, demo user and key), dropped afterwards."""
    name = f"lw_{uuid.uuid4().hex[:10]}"
    with cluster.connect(autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
    try:
        yield Database(name=name, url=cluster.url(name), api_key=api_key)
    finally:
        cluster.ensure_running()
        with cluster.connect(autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def redis_server() -> Iterator[PrivateRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("redis-server")
    server = PrivateRedis(binary)
    try:
        server.start()
        yield server
    finally:
        server.remove()


@contextlib.contextmanager
def app_on(database: Database, redis_server: PrivateRedis, workdir: Path, **env: str) -> Iterator[App]:
    """loopwatch on the private servers; nothing started yet. Every process is stopped afterwards."""
    started = App(
        database_url=database.url,
        redis_url=redis_server.url(),
        workdir=workdir,
        api_key=database.api_key,
        extra_env=env,
    )
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def loopwatch_db(private_postgres, _template) -> Iterator[Database]:
    with database_copy(private_postgres, _template) as database:
        yield database


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    with redis_server() as server:
        yield server


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    """A folder for logs and schedules, of our own: pytest's tmp_path lives under a folder that
    other pytest sessions of the same user prune (they keep the last three), mid-run too."""
    folder = Path(tempfile.mkdtemp(prefix="loopwatch-faults-"))
    try:
        yield folder
    finally:
        if not os.environ.get(KEEP_ENV):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def app(loopwatch_db, private_redis) -> Iterator[App]:
    with workdir() as folder, app_on(loopwatch_db, private_redis, folder) as started:
        yield started
