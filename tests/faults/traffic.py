"""Agent traffic for the fault tests, what the server said to it, and what the server then holds.

`Traffic` sends simulated runs (demo.simulation, every event with an event_id) through
POST /api/v1/events from a few sender threads, each run's events in order, and retries what was
not taken (5xx, no answer) until it is: a retried batch the server had stored comes back
`duplicate`. `Probe` asks the read API and a dashboard page (as a logged-in user) every
PROBE_EVERY_S. Every answer is recorded: its kind, when it was asked, how long it took, the HTTP
status (0: none) and its Retry-After.

`pipeline_state` and `replayed_detections` give what the scenarios assert: events stored and
processed, and the stored detections beside `manage.py replay`'s for the same events.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson
import psycopg
from django.core.management import call_command

from demo.simulation import SimRun, run_generate

REQUEST_TIMEOUT_S = 60.0  # far above any answer the server should give: a hang shows as its duration
RETRY_S = 0.25  # a sender retries sooner than Retry-After asks: the outage gets traffic to answer
PROBE_EVERY_S = 0.2
BATCH_MAX = 12  # events per POST at most; a run's next batch is 1..BATCH_MAX of its events
START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
# Detections the engine makes (what replay makes too); duplicate_side_effect is the ledger's.
LEDGER_KINDS = ("duplicate_side_effect",)


@dataclass(frozen=True)
class Answer:
    kind: str  # ingest | api | page
    started: float  # time.monotonic()
    seconds: float
    status: int  # 0: no answer (refused, reset, timed out)
    retry_after: str | None = None

    @property
    def ended(self) -> float:
        return self.started + self.seconds


@dataclass
class Answers:
    """Every answer, from every thread."""

    items: list[Answer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, answer: Answer) -> None:
        with self.lock:
            self.items.append(answer)

    def between(
        self, start: float, end: float, kinds: tuple[str, ...] = ("ingest", "api", "page")
    ) -> list[Answer]:
        with self.lock:
            return [a for a in self.items if start <= a.started <= end and a.kind in kinds]

    def codes(self, start: float, end: float) -> Counter[str]:
        return Counter(f"{a.kind} {a.status}" for a in self.between(start, end))

    def first_success_after(self, moment: float, kinds: tuple[str, ...] = ("api",)) -> float | None:
        """Seconds from `moment` to the end of the first 2xx answer to a request sent after it."""
        ends = [a.ended for a in self.between(moment, float("inf"), kinds) if 200 <= a.status < 300]
        return min(ends) - moment if ends else None


def _request(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, bytes, http.client.HTTPResponse | None]:
    try:
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException):
        conn.close()
        return 0, b"", None
    if response.will_close:
        conn.close()
    return response.status, data, response


class Traffic:
    """`runs` simulated runs sent by `senders` threads, spread over about `duration_s` seconds."""

    def __init__(
        self,
        base_url: str,
        key: str,
        answers: Answers,
        *,
        runs: int,
        seed: int,
        senders: int = 4,
        duration_s: float = 10.0,
    ) -> None:
        rng = random.Random(seed)
        self.prefix = f"f{seed}-"  # run_generate names a run f"{run_prefix}-{scenario}-{hex}"
        self.runs: list[SimRun] = [run_generate(rng, START, run_prefix=f"f{seed}") for _ in range(runs)]
        assert all(run.run_id.startswith(self.prefix) for run in self.runs)
        self.events = sum(len(run.events) for run in self.runs)
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname, parts.port
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self._answers = answers
        self._senders = senders
        self._duration_s = duration_s
        self._seed = seed
        self._threads: list[threading.Thread] = []
        self.accepted = 0
        self.duplicate = 0
        self.rejected = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()

    def start(self) -> Traffic:
        for i in range(self._senders):
            thread = threading.Thread(target=self._send, args=(i,), name=f"sender-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"senders still sending after {timeout:.0f} s: {alive}"
        assert not self.failures, self.failures[:5]

    def _send(self, index: int) -> None:
        rng = random.Random(self._seed * 100 + index)
        mine = [run for i, run in enumerate(self.runs) if i % self._senders == index]
        batches: list[list[dict[str, Any]]] = []
        # Interleave this sender's runs (a few at a time), each run's events in order.
        cursors = {run.run_id: 0 for run in mine}
        active = list(mine[:5])
        waiting = list(mine[5:])
        while active:
            run = rng.choice(active)
            at = cursors[run.run_id]
            size = rng.randint(1, BATCH_MAX)
            batches.append(run.events[at : at + size])
            cursors[run.run_id] = at + size
            if cursors[run.run_id] >= len(run.events):
                active.remove(run)
                if waiting:
                    active.append(waiting.pop(0))
        gap = self._duration_s / max(1, len(batches))
        conn = http.client.HTTPConnection(self._host, self._port, timeout=REQUEST_TIMEOUT_S)
        next_at = time.monotonic()
        for batch in batches:
            next_at += gap
            body = orjson.dumps(batch)
            while True:
                started = time.monotonic()
                status, data, response = _request(conn, "POST", "/api/v1/events", body, self._headers)
                seconds = time.monotonic() - started
                retry_after = response.getheader("Retry-After") if response else None
                self._answers.add(Answer("ingest", started, seconds, status, retry_after))
                if status in (200, 207):
                    verdicts = Counter(v["status"] for v in orjson.loads(data)["results"])
                    with self._lock:
                        self.accepted += verdicts["accepted"]
                        self.duplicate += verdicts["duplicate"]
                        self.rejected += verdicts["rejected"]
                    break
                if status and status < 500:
                    self.failures.append(f"HTTP {status}: {data[:300]!r}")
                    return
                time.sleep(RETRY_S)
            with contextlib.suppress(ValueError):
                time.sleep(max(0.0, next_at - time.monotonic()))
        conn.close()

    def jsonl(self, path: Path) -> Path:
        """The events as sent, one per line: what `manage.py replay` reads."""
        with path.open("wb") as out:
            for run in self.runs:
                for event in run.events:
                    out.write(orjson.dumps(event) + b"\n")
        return path


def login(base_url: str, username: str = "demo", password: str = "demo") -> str:
    """A session cookie for a page request, through the login form (with its CSRF token)."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/accounts/login/")
    response = conn.getresponse()
    page = response.read().decode()
    csrf_cookie = re.search(r"csrftoken=([^;]+)", response.getheader("Set-Cookie") or "")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert csrf_cookie and token, page[:500]
    form = urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)})
    conn.request(
        "POST",
        "/accounts/login/",
        form,
        {
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"csrftoken={csrf_cookie.group(1)}",
            "Referer": f"{base_url}/accounts/login/",
        },
    )
    response = conn.getresponse()
    response.read()
    session = re.search(r"sessionid=([^;]+)", response.getheader("Set-Cookie") or "")
    assert response.status == 302 and session, f"login failed: HTTP {response.status}"
    conn.close()
    return f"sessionid={session.group(1)}"


class Probe:
    """Asks the read API and the overview page every PROBE_EVERY_S, each on its own thread."""

    def __init__(self, base_url: str, key: str, answers: Answers) -> None:
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname, parts.port
        self._targets = {
            "api": ("/api/v1/runs?limit=1", {"Authorization": f"Bearer {key}"}),
            "page": ("/", {"Cookie": login(base_url)}),
        }
        self._answers = answers
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._ask, args=(kind,), name=f"probe-{kind}", daemon=True)
            for kind in self._targets
        ]

    def start(self) -> Probe:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 5)

    def _ask(self, kind: str) -> None:
        path, headers = self._targets[kind]
        conn = http.client.HTTPConnection(self._host, self._port, timeout=REQUEST_TIMEOUT_S)
        while not self._stop.is_set():
            started = time.monotonic()
            status, _, response = _request(conn, "GET", path, None, headers)
            retry_after = response.getheader("Retry-After") if response else None
            self._answers.add(Answer(kind, started, time.monotonic() - started, status, retry_after))
            self._stop.wait(PROBE_EVERY_S)
        conn.close()


# --- what the server holds --------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineState:
    runs: int
    stored: int  # events stored
    position: int  # events processed (the cursors' positions)
    processed: int  # events handled by every pass together: equal to stored when none twice

    @property
    def caught_up(self) -> bool:
        return self.position == self.stored


def pipeline_state(conn: psycopg.Connection, prefix: str) -> PipelineState:
    """Of the runs whose run_id starts with `prefix` (a scenario's: Traffic's runs are f{seed}-…)."""
    row = conn.execute(
        """
        WITH runs AS (SELECT id FROM ingest_run WHERE run_id LIKE %(like)s)
        SELECT (SELECT count(*) FROM runs),
               (SELECT count(*) FROM ingest_event WHERE run_id IN (SELECT id FROM runs)),
               (SELECT coalesce(sum(position), 0) FROM ingest_runcursor WHERE run_id IN (SELECT id FROM runs)),
               (SELECT coalesce(sum(processed), 0) FROM ingest_runcursor WHERE run_id IN (SELECT id FROM runs))
        """,
        {"like": prefix + "%"},
    ).fetchone()
    return PipelineState(*(int(v) for v in row))


def stored_detections(conn: psycopg.Connection, prefix: str) -> dict[str, list[tuple]]:
    rows = conn.execute(
        """
        SELECT r.run_id, d.kind, d.action, d.at_call, d.at_round, d.signature
        FROM ingest_detection d JOIN ingest_run r ON r.id = d.run_id
        WHERE r.run_id LIKE %s AND d.kind <> ALL(%s)
        ORDER BY r.run_id, d.seq, d.id
        """,
        [prefix + "%", list(LEDGER_KINDS)],
    ).fetchall()
    found: dict[str, list[tuple]] = {}
    for run_id, *detection in rows:
        found.setdefault(run_id, []).append(tuple(detection))
    return found


def replayed_detections(trace: Path) -> dict[str, list[tuple]]:
    """`manage.py replay --json` over the events as sent: the engine alone, no database."""
    out = StringIO()
    call_command("replay", str(trace), "--json", stdout=out, stderr=StringIO())
    found: dict[str, list[tuple]] = {}
    for line in out.getvalue().splitlines():
        run = orjson.loads(line)
        detections = [
            (d["kind"], d["action"], d["at_call"], d["at_round"], d["signature"])
            for d in run["detections"]
            if d["kind"] not in LEDGER_KINDS
        ]
        if detections:
            found[run["run_id"]] = detections
    return found
