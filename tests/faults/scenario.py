"""One fault scenario from start to verdict, and the table of all of them.

`FaultRun` starts the traffic and the probes against a running `App`, watches the pipeline
(events stored and processed, sampled from the database every MONITOR_EVERY_S), marks the fault's
window (`with run.fault():`), then waits for the traffic to end and the pipeline to catch up, and
checks what every scenario must hold: events sent = stored = processed (once each), stored
detections = replay's. Its `row()` is the scenario's line in the table printed at the end of the
session (tests/faults/conftest.py) and written for bench/faults.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.faults.servers import App, Database, PrivatePostgres
from tests.faults.traffic import (
    Answers,
    PipelineState,
    Probe,
    Traffic,
    pipeline_state,
    replayed_detections,
    stored_detections,
)

MONITOR_EVERY_S = 0.2
CATCH_UP_S = 90.0  # after the traffic: the backlog of a few thousand events takes seconds


@dataclass
class Sample:
    at: float
    state: PipelineState


@dataclass
class FaultRun:
    name: str
    app: App
    db: Database
    postgres: PrivatePostgres
    workdir: Path
    answers: Answers = field(default_factory=Answers)
    samples: list[Sample] = field(default_factory=list)
    fault_start: float = 0.0
    fault_end: float = 0.0
    traffic: Traffic | None = None
    probe: Probe | None = None
    final: PipelineState | None = None
    caught_up_at: float = 0.0
    detections: int | None = None  # the engine's, stored (= replay's), once check_pipeline has run
    _stop: threading.Event = field(default_factory=threading.Event)
    _monitor: threading.Thread | None = None

    def start(self, *, runs: int, seed: int, duration_s: float, senders: int = 4) -> FaultRun:
        assert self.app.base_url, "start the web server first"
        self.traffic = Traffic(
            self.app.base_url,
            self.db.api_key,
            self.answers,
            runs=runs,
            seed=seed,
            senders=senders,
            duration_s=duration_s,
        )
        self.probe = Probe(self.app.base_url, self.db.api_key, self.answers).start()
        self._monitor = threading.Thread(target=self._watch, name="monitor", daemon=True)
        self._monitor.start()
        self.traffic.start()
        return self

    def _watch(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = self.postgres.connect(self.db.name, autocommit=True)
                    conn.execute("SET statement_timeout = 2000")
                self.samples.append(Sample(time.monotonic(), pipeline_state(conn, self.traffic.prefix)))
            except psycopg.Error:
                if conn is not None:
                    conn.close()  # the database is away: no sample, try again
                conn = None
            self._stop.wait(MONITOR_EVERY_S)
        if conn is not None:
            conn.close()

    @contextlib.contextmanager
    def fault(self) -> Iterator[None]:
        """The fault's window: from the first thing done to the server to the moment it is back."""
        self.fault_start = time.monotonic()
        yield
        self.fault_end = time.monotonic()

    def finish(self, *, traffic_timeout: float = 120.0) -> PipelineState:
        """Wait for every batch to be taken and every stored event to be processed."""
        assert self.traffic and self.probe
        self.traffic.join(traffic_timeout)
        self.probe.stop()
        deadline = time.monotonic() + CATCH_UP_S
        with self.postgres.connect(self.db.name, autocommit=True) as conn:
            while True:
                state = pipeline_state(conn, self.traffic.prefix)
                if state.caught_up and state.stored >= self.traffic.events:
                    break
                assert time.monotonic() < deadline, (
                    f"{self.name}: not caught up {CATCH_UP_S:.0f} s after the traffic: {state}\n{self.app.logs()}"
                )
                time.sleep(0.2)
        self.caught_up_at = time.monotonic()
        self._stop.set()
        if self._monitor:
            self._monitor.join(10)
        # The last pass may have come between two of the monitor's samples: this one counts too.
        self.samples.append(Sample(self.caught_up_at, state))
        self.final = state
        return state

    def check_pipeline(self) -> None:
        """Sent = stored = processed, each event once; stored detections = replay's."""
        assert self.traffic and self.final
        sent = self.traffic.events
        assert self.traffic.rejected == 0
        # A batch whose commit the server made but whose answer was lost (a 503 after a frozen
        # server ran the COMMIT it had been sent, say) is sent again and answered `duplicate`.
        assert self.traffic.accepted <= sent <= self.traffic.accepted + self.traffic.duplicate, (
            self.traffic.accepted,
            self.traffic.duplicate,
            sent,
        )
        assert self.final.stored == sent, self.final
        assert self.final.position == sent, self.final
        assert self.final.processed == sent, f"an event processed twice or never: {self.final}"
        with self.postgres.connect(self.db.name) as conn:
            stored = stored_detections(conn, self.traffic.prefix)
        replayed = replayed_detections(self.traffic.jsonl(self.workdir / f"{self.traffic.prefix}sent.jsonl"))
        stored_sorted = {k: sorted(v) for k, v in stored.items()}
        replayed_sorted = {k: sorted(v) for k, v in replayed.items()}
        differ = {
            k: (stored_sorted.get(k), replayed_sorted.get(k))
            for k in stored_sorted.keys() | replayed_sorted.keys()
            if stored_sorted.get(k) != replayed_sorted.get(k)
        }
        assert differ == {}, f"stored detections (left) differ from replay's (right): {differ}"
        self.detections = sum(len(v) for v in stored.values())

    # --- figures -------------------------------------------------------------------------------

    def codes(self) -> Counter[str]:
        """The answers to requests sent during the fault, by kind and status."""
        return self.answers.codes(self.fault_start, self.fault_end)

    def slowest_in_fault(self) -> float:
        return max((a.seconds for a in self.answers.between(self.fault_start, self.fault_end)), default=0.0)

    def answer_back_s(self) -> float | None:
        """From the fault's end to the first 2xx of the read API (it needs the database)."""
        return self.answers.first_success_after(self.fault_end)

    def detection_back_s(self) -> float | None:
        """From the fault's end to the first sample showing more events processed than at its end."""
        before = [s for s in self.samples if s.at <= self.fault_end]
        if not before:
            return None
        base = before[-1].state.position
        after = [s.at for s in self.samples if s.at > self.fault_end and s.state.position > base]
        return (after[0] - self.fault_end) if after else None

    def row(self) -> dict[str, Any]:
        assert self.traffic and self.final
        codes = Counter(a.status for a in self.answers.between(self.fault_start, self.fault_end))
        back = self.answer_back_s()
        resumed = self.detection_back_s()
        return {
            "scenario": self.name,
            "sent": self.traffic.events,
            "stored": self.final.stored,
            "again": self.traffic.duplicate,  # events sent again after an answer was lost: stored once
            "processed": self.final.processed,
            "detections": self.detections,
            "codes": dict(sorted(codes.items())),
            "slowest_s": round(self.slowest_in_fault(), 2),
            "fault_s": round(self.fault_end - self.fault_start, 1),
            "api_back_s": None if back is None else round(back, 2),
            "detection_back_s": None if resumed is None else round(resumed, 2),
            "caught_up_s": round(self.caught_up_at - self.fault_end, 1),
        }
