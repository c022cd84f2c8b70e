"""`manage.py simulate`: realistic demo traffic sent to a loopwatch server, the way agent runtimes
send it.

It goes through HTTP like any agent runtime (never the ORM), so it exercises the whole way in:
authentication, validation, storage, per-run processing. The runs come from demo.simulation;
several are interleaved, each one's events in order. Each agent reaches loopwatch one way
(demo.simulation.AGENT_CHANNELS): most send trace events to POST /api/v1/events, one exports
OpenTelemetry traces to POST /v1/traces (demo.otlp), and some ask the guard before every tool call
through loopwatch_client's Guard (demo.guarded), so their loops end in handoffs that wait for a
person. With --downstream-port it also serves the demo's payment service that the demo tenant's
reconciler asks about refunds whose outcome is unknown (demo.downstream).
"""

from __future__ import annotations

import http.client
import os
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from demo.downstream import PaymentService
from demo.guarded import GuardedAgent
from demo.otlp import OTLP_PATH, OtlpRun, export_body, otlp_run, span_stamp
from demo.simulation import AGENT_CHANNELS, Event, SimRun, run_generate

EVENTS_PATH = "/api/v1/events"
SERVER_WAIT_S = 30.0  # how long to keep retrying an unreachable server (it may be starting)
REQUEST_TIMEOUT_S = 60.0  # one POST; a large batch on a busy server can take seconds
BACKOFF_MAX_S = 2.0
FLUSH_S = 0.1  # at a set rate, send at most every 100 ms: few POSTs, yet the dashboards look live
MAX_BACKLOG_S = 2.0  # a rate schedule more than this far behind is reset instead of bursting
PROGRESS_TTY_S = 0.1
PROGRESS_LINE_S = 5.0  # a progress line this often when stderr is not a terminal
REJECTIONS_SHOWN = 20


class _Unreachable(Exception):
    """The server did not answer, or answered 429/5xx: worth another try."""


@dataclass
class Tally:
    """What was sent and what the server said about it."""

    runs_started: int = 0
    runs_done: int = 0
    events: int = 0
    accepted: int = 0
    duplicate: int = 0
    rejected: int = 0
    posts: int = 0
    retries: int = 0
    spans: int = 0
    spans_rejected: int = 0
    runs_by_scenario: Counter[str] = field(default_factory=Counter)
    events_by_scenario: Counter[str] = field(default_factory=Counter)
    runs_by_channel: Counter[str] = field(default_factory=Counter)


class EventsClient:
    """POSTs batches to /api/v1/events (or `path`: /v1/traces takes OTLP/JSON) on one kept-alive
    connection (http.client, no dependency)."""

    def __init__(self, url: str, key: str, *, wait_s: float = SERVER_WAIT_S, path: str = EVENTS_PATH) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CommandError(f"--url: expected http(s)://host[:port], got {url!r}")
        self.url = url.rstrip("/") + path
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = parts.path.rstrip("/") + path
        self._headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "loopwatch-simulate",
        }
        self._wait_s = wait_s
        self._conn: http.client.HTTPConnection | None = None
        self.retries = 0
        self.waiting: str | None = None  # why the last POST is being retried, for the progress line
        self.on_retry: Callable[[str], None] | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def post(self, payload: list[Event] | dict[str, Any]) -> dict[str, Any]:
        """The server's verdicts on a batch; retries an unreachable or overloaded server.

        Resending a batch the server may already have stored is safe: every event has an
        event_id (every span a span id), so a second delivery is stored once.
        """
        body = orjson.dumps(payload)
        deadline: float | None = None
        delay = 0.25
        attempt = 0
        while True:
            reused = self._conn is not None
            try:
                return self._post_once(body)
            except _Unreachable as exc:
                problem = str(exc)
            now = time.monotonic()
            deadline = deadline or now + self._wait_s
            if now >= deadline:
                raise CommandError(f"POST {self.url}: {problem}; gave up after {self._wait_s:.0f}s")
            self.retries += 1
            self.waiting = problem
            if self.on_retry is not None:
                self.on_retry(problem)
            attempt += 1
            # A kept-alive connection the server closed while idle fails once: retry that at once.
            if reused and attempt == 1:
                continue
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _post_once(self, body: bytes) -> dict[str, Any]:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=REQUEST_TIMEOUT_S)
        try:
            self._conn.request("POST", self._path, body, self._headers)
            response = self._conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise _Unreachable(f"{type(exc).__name__}: {exc}") from None
        if response.will_close:
            self.close()
        status = response.status
        if status in (200, 207, 422):
            self.waiting = None
            return orjson.loads(data or b"{}")
        if status == 429 or status >= 500:
            raise _Unreachable(f"HTTP {status}")
        detail = data[:500].decode(errors="replace")
        hint = {
            401: " (is --key / LOOPWATCH_API_KEY a valid, unrevoked key?)",
            403: " (the key needs the ingest scope)",
            413: " (try a smaller --batch)",
        }.get(status, "")
        raise CommandError(f"POST {self.url}: HTTP {status}{hint}: {detail}")


class Pacer:
    """Releases events at `rate` per second (0: no limit), in batches of at most `batch`."""

    def __init__(self, rate: float, batch: int) -> None:
        self.rate = rate
        self.batch = batch
        self._t0 = time.monotonic()
        self._released = 0
        self._last = 0.0

    def unlimited(self) -> None:
        self.rate = 0

    def due(self) -> int:
        """Wait until events are due; how many may go now."""
        if self.rate <= 0:
            return self.batch
        while True:
            now = time.monotonic()
            due = int((now - self._t0) * self.rate) - self._released
            if due > self.rate * MAX_BACKLOG_S + self.batch:
                # Far behind (a slow or restarting server): start the schedule again rather than
                # make up for the lost time in one burst.
                self._t0 = now - (self._released + self.batch) / self.rate
                due = self.batch
            if due >= self.batch or (due >= 1 and now - self._last >= FLUSH_S):
                self._last = now
                return min(due, self.batch)
            until_one = (self._released + 1) / self.rate - (now - self._t0)
            until_flush = self._last + FLUSH_S - now
            time.sleep(max(0.001, min(FLUSH_S, max(until_one, until_flush))))

    def sent(self, n: int) -> None:
        self._released += n


class Progress:
    """A self-drawn bar on a terminal; otherwise a plain line every few seconds."""

    def __init__(self, stream: OutputWrapper, *, enabled: bool, runs: int, duration: float) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = enabled and stream.isatty()
        self.runs = runs
        self.duration = duration
        self.t0 = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def update(self, tally: Tally, *, waiting: str | None = None, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < (PROGRESS_TTY_S if self.tty else PROGRESS_LINE_S):
            return
        self._last = now
        elapsed = max(now - self.t0, 1e-9)
        runs = f"runs {tally.runs_done}/{self.runs}" if self.runs else f"runs {tally.runs_done}"
        line = (
            f"{runs} | events {tally.events:,} | {tally.events / elapsed:,.1f} ev/s | rejected {tally.rejected}"
            f" | {elapsed:,.0f}s"
        )
        if waiting:
            line += f" | waiting for the server: {waiting}"
        if not self.tty:
            self._write(f"simulate: {line}\n")
            return
        fraction = None
        if self.runs:
            fraction = tally.runs_done / self.runs
        elif self.duration:
            fraction = elapsed / self.duration
        bar = ""
        if fraction is not None:
            filled = int(min(1.0, fraction) * 24)
            bar = "[" + "#" * filled + "." * (24 - filled) + "] "
        self._write(f"\r{bar}{line}\x1b[K")
        self._drawn = True

    def break_line(self) -> None:
        """End the bar's line, so that a message printed next does not land on it."""
        if self._drawn:
            self._write("\n")
            self._drawn = False

    def close(self, tally: Tally) -> None:
        if self._drawn:
            self.update(tally, force=True)  # the bar's final state, not the last throttled one
            self._write("\n")
            self._drawn = False

    def _write(self, text: str) -> None:
        # Plain text, no trailing newline added: stderr's default style would paint the bar red.
        self.stream.write(text, style_func=lambda s: s, ending="")
        self.stream.flush()


@dataclass
class _Flight:
    """A run being sent: the next of its events (or, exported over OTLP, of its spans) to go."""

    run: SimRun
    otlp: OtlpRun | None = None
    next: int = 0

    @property
    def left(self) -> int:
        units = self.otlp.spans if self.otlp is not None else self.run.events
        return len(units) - self.next


@dataclass
class _Guarded:
    """The agents that use the guard: their threads, the runs waiting for one, how runs ended."""

    agents: list[GuardedAgent]
    runs: queue.Queue[SimRun]
    outcomes: Counter[str]
    lock: threading.Lock
    stop: threading.Event

    def alive(self) -> bool:
        return any(agent.is_alive() for agent in self.agents)

    def busy(self) -> bool:
        return self.runs.qsize() >= len(self.agents)

    def done(self) -> int:
        with self.lock:
            return sum(self.outcomes[k] for k in ("finished", "handoff", "terminated"))

    def close(self, *, wait: bool) -> None:
        self.stop.set()
        for agent in self.agents:
            if wait:
                agent.join()
            else:
                agent.aborted.set()
        for agent in self.agents:
            if agent.error is not None:
                raise CommandError(f"{agent.name}: {type(agent.error).__name__}: {agent.error}")


class Command(BaseCommand):
    help = (
        "Send realistic demo traffic — simulated agent runs, loops, legitimate repetition, budget "
        "truncations, write timeouts — to a loopwatch server through POST /api/v1/events."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
        parser.add_argument(
            "--key", default=None, help="an API key with the ingest scope (default: $LOOPWATCH_API_KEY)"
        )
        parser.add_argument(
            "--rate", type=float, default=50.0, help="events per second; 0 = as fast as possible (default 50)"
        )
        parser.add_argument(
            "--duration",
            type=float,
            default=0.0,
            help="seconds to start new runs for, then finish the runs in flight at full speed; "
            "0 = until interrupted (default)",
        )
        parser.add_argument(
            "--runs", type=int, default=0, help="stop after this many runs; 0 = no limit (default)"
        )
        parser.add_argument("--seed", type=int, default=None, help="random seed, for the same runs again")
        parser.add_argument(
            "--concurrent-runs",
            type=int,
            default=8,
            help="runs interleaved at once; each run's events stay in order (default 8)",
        )
        parser.add_argument(
            "--batch", type=int, default=50, help="at most this many events a POST (default 50)"
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
        parser.add_argument(
            "--keep-timestamps",
            action="store_true",
            help="send the generated ts (a run spread over its realistic duration) instead of the send time "
            "(REST only: OTLP spans are stamped when sent)",
        )
        parser.add_argument(
            "--guarded-agents",
            type=int,
            default=2,
            help="threads playing the runs of agents that ask the guard before each tool call "
            "(refund-desk, shop-assistant) through loopwatch_client's Guard (default 2)",
        )
        parser.add_argument(
            "--rest-only",
            action="store_true",
            help="send every run as trace events over REST: no OTLP export, no guard",
        )
        parser.add_argument(
            "--downstream-port",
            type=int,
            default=0,
            help="serve the demo's payment service on 127.0.0.1:PORT for the demo reconciler "
            "(manage.py demo_setup --downstream-url); 0 = not served (default)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["key"] or os.environ.get("LOOPWATCH_API_KEY", "")
        if not key:
            raise CommandError(
                "no API key: pass --key or set LOOPWATCH_API_KEY "
                "(make one with: manage.py create_api_key TENANT --scopes ingest,read)"
            )
        rate, duration, runs = options["rate"], options["duration"], options["runs"]
        concurrent, batch = options["concurrent_runs"], options["batch"]
        for name, value, minimum in (
            ("--rate", rate, 0),
            ("--duration", duration, 0),
            ("--runs", runs, 0),
            ("--concurrent-runs", concurrent, 1),
            ("--batch", batch, 1),
            ("--guarded-agents", options["guarded_agents"], 0),
            ("--downstream-port", options["downstream_port"], 0),
        ):
            if value < minimum:
                raise CommandError(f"{name}: must be at least {minimum} (got {value})")
        seed = options["seed"] if options["seed"] is not None else random.SystemRandom().randrange(2**31)

        client = EventsClient(options["url"], key)
        otlp_client = EventsClient(options["url"], key, path=OTLP_PATH)
        progress = Progress(self.stderr, enabled=not options["no_progress"], runs=runs, duration=duration)
        tally = Tally()
        client.on_retry = otlp_client.on_retry = lambda problem: progress.update(tally, waiting=problem)
        payments = PaymentService(options["downstream_port"]) if options["downstream_port"] else None
        rest_only = options["rest_only"]
        guarded = self._guarded(
            options["url"], key, options["guarded_agents"] if not rest_only else 0, seed, rate
        )
        started = time.monotonic()
        interrupted = False
        try:
            self._send(
                client,
                otlp_client,
                guarded,
                progress,
                tally,
                seed=seed,
                rate=rate,
                duration=duration,
                runs=runs,
                concurrent=concurrent,
                batch=batch,
                restamp=not options["keep_timestamps"],
                rest_only=rest_only,
            )
            if guarded is not None:
                guarded.close(wait=True)  # the guarded runs under way end (at full speed)
        except KeyboardInterrupt:
            interrupted = True
            if guarded is not None:
                guarded.close(wait=False)
        finally:
            client.close()
            otlp_client.close()
            if payments is not None:
                payments.close()
            progress.close(tally)
        tally.retries = client.retries + otlp_client.retries
        self._summary(tally, guarded, seed=seed, elapsed=time.monotonic() - started, interrupted=interrupted)
        rejected = tally.rejected + tally.spans_rejected
        if guarded is not None:
            rejected += sum(agent.tracer.stats["rejected"] for agent in guarded.agents)
        if rejected:
            raise CommandError(
                f"{rejected} events were rejected: the simulation made invalid events, which is a bug"
            )

    def _guarded(self, url: str, key: str, agents: int, seed: int, rate: float) -> _Guarded | None:
        if not agents:
            return None
        outcomes: Counter[str] = Counter()
        lock, stop = threading.Lock(), threading.Event()
        runs: queue.Queue[SimRun] = queue.Queue()
        threads = [
            GuardedAgent(
                url,
                key,
                runs,
                name=f"guarded-agent-{n + 1}",
                paced=rate > 0,
                seed=seed + 2 + n,
                outcomes=outcomes,
                lock=lock,
                stop=stop,
            )
            for n in range(agents)
        ]
        for thread in threads:
            thread.start()
        return _Guarded(threads, runs, outcomes, lock, stop)

    def _send(
        self,
        client: EventsClient,
        otlp_client: EventsClient,
        guarded: _Guarded | None,
        progress: Progress,
        tally: Tally,
        *,
        seed: int,
        rate: float,
        duration: float,
        runs: int,
        concurrent: int,
        batch: int,
        restamp: bool,
        rest_only: bool,
    ) -> None:
        """The sending loop.

        1. Keep `concurrent` runs in flight: generate a new run when one is fully sent, until
           --runs runs were started or --duration has passed. A run of an agent that uses the
           guard goes to the guarded agents' queue instead (while they are all busy it waits
           with --runs, else it is not made); a run of an agent that exports OTLP is sent as
           spans.
        2. Wait for the rate to allow events; take that many (at most --batch), each from a
           random run in flight, so runs interleave while each run keeps its order.
        3. POST them (events to /api/v1/events, spans to /v1/traces), count the verdicts, print
           rejected ones; a run is done once its last event was answered.
        """
        # Two generators: the interleaving varies with timing, the runs themselves must not.
        runs_rng = random.Random(seed)
        mix_rng = random.Random(seed + 1)
        # A random run_id prefix per invocation (outside the seed): the same --seed twice makes the
        # same runs under new ids, not duplicates of the first ones.
        prefix = f"sim{random.SystemRandom().getrandbits(32):08x}"
        pacer = Pacer(rate, batch)
        deadline = time.monotonic() + duration if duration else None
        flights: list[_Flight] = []
        while True:
            stopping = deadline is not None and time.monotonic() >= deadline
            if stopping:
                pacer.unlimited()  # finish the runs in flight promptly
            while len(flights) < concurrent and not stopping and (not runs or tally.runs_started < runs):
                sim = run_generate(runs_rng, datetime.now(UTC), run_prefix=prefix)
                channel = "rest" if rest_only else AGENT_CHANNELS.get(sim.events[0]["agent"], "rest")
                if channel == "guard":
                    if guarded is None:
                        continue
                    # With --runs every run is played, so it waits for a free agent; otherwise a
                    # run comes along for the guarded agents often enough, and REST must not wait.
                    while runs and guarded.busy() and guarded.alive():
                        time.sleep(0.05)
                    if guarded.busy():
                        continue
                    guarded.runs.put(sim)
                elif channel == "otlp":
                    flights.append(_Flight(sim, otlp=otlp_run(sim)))
                else:
                    flights.append(_Flight(sim))
                tally.runs_started += 1
                tally.runs_by_channel[channel] += 1
            if not flights:
                if (
                    guarded is not None
                    and guarded.alive()
                    and guarded.done() < tally.runs_by_channel["guard"]
                ):
                    time.sleep(0.1)  # the guarded agents' runs are still under way
                    progress.update(tally, waiting=client.waiting)
                    continue
                return
            want = pacer.due()
            taken: list[tuple[_Flight, Event]] = []
            spans: list[tuple[OtlpRun, dict[str, Any]]] = []
            now_ns = time.time_ns()
            while len(taken) + len(spans) < want and flights:
                open_flights = [f for f in flights if f.left]
                if not open_flights:
                    break
                flight = mix_rng.choice(open_flights)
                if flight.otlp is not None:
                    spans.append(
                        (flight.otlp, span_stamp(flight.otlp, flight.otlp.spans[flight.next], now_ns))
                    )
                else:
                    taken.append((flight, flight.run.events[flight.next]))
                flight.next += 1
            events = [event for _, event in taken]
            if restamp:
                # Live demo traffic: the generator spaces a run's events by realistic think and tool
                # times, but they go out faster than that; stamp them as sent so no ts is in the future.
                sent_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
                events = [{**event, "ts": sent_at} for event in events]
            if events:
                answer = client.post(events)
                self._count(tally, taken, answer, progress)
            if spans:
                self._count_spans(tally, spans, otlp_client.post(export_body(spans)), progress)
            pacer.sent(len(events) + len(spans))
            finished = [f for f in flights if not f.left]
            for flight in finished:
                flights.remove(flight)
                tally.runs_done += 1
                tally.runs_by_scenario[flight.run.scenario] += 1
            progress.update(tally, waiting=client.waiting or otlp_client.waiting)

    def _count(
        self, tally: Tally, taken: list[tuple[_Flight, Event]], answer: dict[str, Any], progress: Progress
    ) -> None:
        tally.posts += 1
        tally.events += len(taken)
        for flight, _ in taken:
            tally.events_by_scenario[flight.run.scenario] += 1
        tally.accepted += answer.get("accepted", 0)
        tally.duplicate += answer.get("duplicate", 0)
        for verdict in answer.get("results", []):
            if verdict.get("status") != "rejected":
                continue
            tally.rejected += 1
            if tally.rejected <= REJECTIONS_SHOWN:
                flight, event = taken[verdict["index"]]
                progress.break_line()
                self.stderr.write(
                    f"rejected: run {event.get('run_id')} ({flight.run.scenario}) "
                    f"event {event.get('event_id')} ({event.get('type')}): "
                    f"{verdict.get('error') or verdict.get('reason')}"
                )

    def _count_spans(
        self,
        tally: Tally,
        spans: list[tuple[OtlpRun, dict[str, Any]]],
        answer: dict[str, Any],
        progress: Progress,
    ) -> None:
        tally.posts += 1
        tally.spans += len(spans)
        for run, _ in spans:
            tally.events_by_scenario[run.scenario] += 1
        partial = answer.get("partialSuccess") or {}
        rejected = int(partial.get("rejectedSpans") or 0)
        tally.spans_rejected += rejected
        if rejected and tally.spans_rejected <= REJECTIONS_SHOWN:
            progress.break_line()
            self.stderr.write(f"rejected spans: {partial.get('errorMessage')}")

    def _summary(
        self, tally: Tally, guarded: _Guarded | None, *, seed: int, elapsed: float, interrupted: bool
    ) -> None:
        out = self.stdout
        if guarded is not None:
            with guarded.lock:
                for key, count in guarded.outcomes.items():
                    if key.startswith("scenario:"):
                        tally.runs_by_scenario[key.removeprefix("scenario:")] += count
                tally.runs_done += sum(guarded.outcomes[k] for k in ("finished", "handoff", "terminated"))
                ended = ", ".join(f"{k} {guarded.outcomes[k]}" for k in ("finished", "handoff", "terminated"))
            guard_stats = Counter[str]()
            for agent in guarded.agents:
                guard_stats.update(agent.guard.stats)
                tally.events += agent.tracer.stats["sent"]
            checks = ", ".join(
                f"{k} {guard_stats[k]}"
                for k in ("allow", "reuse", "correct", "handoff", "terminate", "write", "unavailable")
                if guard_stats[k]
            )
        speed = tally.events / elapsed if elapsed > 0 else 0.0
        out.write(
            f"simulate: {tally.runs_done} runs, {tally.events} events in {elapsed:.1f}s "
            f"({speed:,.1f} events/s), {tally.posts} POSTs, seed {seed}"
        )
        out.write(f"accepted {tally.accepted}, duplicate {tally.duplicate}, rejected {tally.rejected}")
        if tally.runs_by_channel["otlp"]:
            out.write(
                f"over OTLP: {tally.runs_by_channel['otlp']} runs, {tally.spans} spans, "
                f"rejected {tally.spans_rejected}"
            )
        if guarded is not None:
            out.write(f"through the guard: {tally.runs_by_channel['guard']} runs ({ended}); checks: {checks}")
        if tally.retries:
            out.write(f"retried POSTs: {tally.retries}")
        unfinished = tally.runs_started - tally.runs_done
        if interrupted:
            out.write(f"interrupted: {unfinished} runs left unfinished (their events so far were sent)")
        names = sorted(set(tally.runs_by_scenario) | set(tally.events_by_scenario))
        if names:
            width = max(len(n) for n in names)
            out.write(f"  {'scenario':<{width}}  {'runs':>5}  {'events':>7}")
            for name in sorted(names, key=lambda n: (-tally.events_by_scenario[n], n)):
                out.write(
                    f"  {name:<{width}}  {tally.runs_by_scenario[name]:>5}  {tally.events_by_scenario[name]:>7}"
                )
