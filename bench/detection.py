"""The detection engine alone: events/s on one core, short runs against one very long run.

    .venv/bin/python bench/detection.py [--long-calls 20000] [--short-calls 100] [--min-seconds 1]
        [--checkpoint-every 1000] [--seed 1] [--no-pin]

No Django, no database, no I/O in the timed loops: `ingest.detection` only.

1. Pins the process to one CPU (os.sched_setaffinity) so the figures are one core's.
2. Builds the event dicts before any clock starts: a run is N tool calls, each a model_round +
   tool_call + tool_result, with realistic arguments and results (orders, customers, knowledge
   base, web pages, SQL, polls, ticket writes). Most calls are new requests with new results; some
   repeat a call exactly (adjacent or later), some nudge a search (perturbation), some alternate
   two calls, some fail (transient then retried, not_found), some poll a job; rounds now and then
   say something, rarely a question; the user now and then says something. No signature is repeated often enough to reach `terminate`,
   and the budgets are raised (CONFIG) so that the long run goes to its end: a terminated run
   would still be processed, but it is not the case being measured.
3. Short: distinct runs of --short-calls calls, each with a fresh RunState, replayed round after
   round until --min-seconds have passed. Long: one run of --long-calls calls, once.
4. Long again, serialising and restoring the state every --checkpoint-every events
   (orjson.dumps(state.to_dict()) then RunState.from_dict(orjson.loads(...))), as the Celery
   pipeline does per batch; its detections must equal the uninterrupted run's.
5. Replays the runs real agents recorded (`<root>/../shared/corpus/real-dev/runs/*.jsonl`, read
   and parsed before the clock starts; skipped when they are not beside the checkout) with the
   shipped defaults, all of them in turn until --min-seconds have passed: conversations with user
   turns, harness messages, long tool results.
6. Prints the table: events/s, the long/short ratio against the targets, the serialised state
   size at the end of each run and the time of one to_dict/from_dict round trip.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import string
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ingest.detection import DEFAULT_CONFIG, Config, Detection, Engine, RunState, Thresholds

TARGET_EVENTS_S = 20_000  # one core must keep up with a busy tenant's stream with room to spare
TARGET_RATIO = 0.8  # the cost of an event must not grow with the run's length (bounded state)
ROUND_TRIPS = 20  # state round trips timed, the median reported
START = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
# Budgets out of reach: the long run must not be cut short (see step 2 above).
CONFIG = Config(
    thresholds=Thresholds(
        max_tool_calls=10**9,
        max_rounds=10**9,
        max_goal_calls=10**9,
        max_same_tool_retries=10**9,
        max_tokens=10**12,
        max_cost_usd=10**9,
        max_wall_s=10**9,
        no_progress_steps=10**6,
    )
)
REAL_CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "real-dev"
MAX_REISSUES = 3  # an identical call at most 4 times: `correct`, never `handoff`/`terminate`

Event = dict[str, Any]

# --- content ----------------------------------------------------------------------------------

WORDS = (
    "order customer ticket status refund shipping invoice account payment address delivery "
    "warehouse carrier tracking number pending open closed escalate priority summary report "
    "found please check again later update record confirm request latest page result error retry "
    "timeout quota limit region europe billing plan annual monthly discount coupon applied "
    "cancelled returned damaged missing item product sku quantity battery regulation recycling "
    "targets heat pump adoption nordics inference price trends container freight rates lithium "
    "supply outlook urban bike lane safety evidence market policy forecast methodology analysts"
).split()
FIRST = ("Ana", "Ben", "Chloe", "Dmitri", "Emma", "Farah", "Gustav", "Hana", "Ivan", "Jules", "Kofi")
LAST = ("Silva", "Okafor", "Martin", "Novak", "Schmidt", "Haddad", "Larsen", "Tanaka", "Rossi")
PRODUCTS = (
    ("SKU-TR2-42", "Trail Runner 2 shoes, size 42", 129.0),
    ("SKU-HP-X9", "X9 noise-cancelling headphones", 249.0),
    ("SKU-MUG-BL", "blue ceramic mug", 14.5),
    ("SKU-KB-75", "75% mechanical keyboard", 159.0),
    ("SKU-BAG-30", "30 L hiking backpack", 89.0),
    ("SKU-JKT-M", "rain jacket, size M", 119.0),
)
CARRIERS = ("DHL", "UPS", "PostNord", "GLS", "DPD")
DOMAINS = ("reuters.com", "ec.europa.eu", "arxiv.org", "iea.org", "oecd.org", "en.wikipedia.org")
NARRATION = (
    "Let me check that for you.",
    "I'll look this up.",
    "Looking at the details now.",
    "One moment while I check the records.",
    "Checking a second source.",
)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _sentences(rng: random.Random, n: int) -> str:
    return " ".join(_words(rng, rng.randint(6, 14)).capitalize() + "." for _ in range(n))


def _customer(rng: random.Random) -> dict[str, Any]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return {
        "customer_id": f"C-{rng.randint(10_000, 99_999)}",
        "name": f"{first} {last}",
        "email": f"{first.lower()}.{last.lower()}{rng.randint(1, 999)}@example.com",
        "tier": rng.choice(("standard", "standard", "plus", "gold")),
        "created_at": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T08:00:00Z",
    }


def _order(rng: random.Random, customer_id: str) -> dict[str, Any]:
    items = [
        {"sku": sku, "name": name, "qty": rng.randint(1, 2), "price": price}
        for sku, name, price in rng.sample(PRODUCTS, rng.randint(1, 3))
    ]
    return {
        "order_id": f"ORD-{rng.randint(100_000, 999_999)}",
        "customer_id": customer_id,
        "placed": f"2026-11-{rng.randint(1, 28):02d}",
        "items": items,
        "total": round(sum(i["qty"] * i["price"] for i in items), 2),
        "currency": "EUR",
        "status": rng.choice(("shipped", "delivered", "processing")),
    }


def _fresh_read(rng: random.Random) -> tuple[str, str, dict[str, Any], Any]:
    """A new request with a new answer: (tool, kind, args, result)."""
    pick = rng.random()
    if pick < 0.2:
        customer = _customer(rng)
        return "get_customer", "read", {"email": customer["email"]}, customer
    if pick < 0.4:
        customer_id = f"C-{rng.randint(10_000, 99_999)}"
        orders = [_order(rng, customer_id) for _ in range(rng.randint(0, 4))]
        summary = [{"order_id": o["order_id"], "placed": o["placed"], "total": o["total"]} for o in orders]
        return (
            "search_orders",
            "read",
            {"customer_id": customer_id, "status": rng.choice(("open", "any")), "limit": 20},
            {"orders": summary, "count": len(summary)},
        )
    if pick < 0.55:
        order = _order(rng, f"C-{rng.randint(10_000, 99_999)}")
        return "get_order", "read", {"order_id": order["order_id"]}, order
    if pick < 0.65:
        tracking = f"{rng.choice(CARRIERS)}-{rng.randint(10**9, 10**10 - 1)}"
        order_id = f"ORD-{rng.randint(100_000, 999_999)}"
        return (
            "get_shipment",
            "read",
            {"order_id": order_id},
            {
                "order_id": order_id,
                "carrier": tracking.split("-")[0],
                "tracking": tracking,
                "eta": "2026-12-02",
            },
        )
    if pick < 0.8:
        query = _words(rng, rng.randint(3, 6))
        hits = [
            {"id": f"KB-{rng.randint(100, 999)}", "title": _words(rng, 4), "score": round(rng.random(), 2)}
            for _ in range(3)
        ]
        return "search_kb", "read", {"query": query, "limit": 5}, {"hits": hits}
    if pick < 0.9:
        url = f"https://{rng.choice(DOMAINS)}/{_words(rng, 3).replace(' ', '-')}-{rng.randint(1, 10**6)}"
        return (
            "http_get",
            "read",
            {"url": url},
            {"status": 200, "title": _words(rng, 6), "text": _sentences(rng, rng.randint(4, 9))},
        )
    customer_id = rng.randint(10_000, 99_999)
    rows = [
        {
            "id": rng.randint(1, 10**7),
            "status": rng.choice(("open", "closed")),
            "total": round(rng.uniform(5, 500), 2),
        }
        for _ in range(rng.randint(1, 8))
    ]
    return (
        "query_db",
        "read",
        {
            "sql": "SELECT id, status, total FROM orders WHERE customer_id = $1 ORDER BY created_at DESC",
            "params": [customer_id],
        },
        {"rows": rows, "row_count": len(rows)},
    )


class RunBuilder:
    """One run's events, call by call, in the order a runtime sends them."""

    def __init__(self, rng: random.Random, run_id: str, calls: int) -> None:
        self.rng = rng
        self.run_id = run_id
        self.target = calls
        self.calls = 0
        self.now = START
        self.events: list[Event] = []
        self.history: list[tuple[str, str, dict[str, Any], Any]] = []  # successful reads, for repeats
        self.reissued: Counter[bytes] = Counter()
        self.emit(
            "run_started",
            tenant="bench",
            agent="ops-copilot",
            task_type="research",
            backend="openai",
            model="gpt-4o",
        )

    def emit(self, event_type: str, **fields: Any) -> None:
        stamp = self.now.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self.events.append({"type": event_type, "run_id": self.run_id, "ts": stamp, **fields})

    def call(
        self,
        tool: str,
        kind: str,
        args: dict[str, Any],
        result: Any,
        *,
        status: str = "ok",
        error_class: str | None = None,
        step_id: str | None = None,
        repeatable: bool = True,
    ) -> None:
        rng = self.rng
        self.calls += 1
        self.now += timedelta(seconds=rng.uniform(0.5, 4.0))
        if rng.random() < 0.02:
            # Now and then the user says something: new (an id) or the same again.
            said = f"Please also check order ORD-{rng.randint(100_000, 999_999)} for {rng.choice(FIRST)}."
            self.emit("user_message", text=said if rng.random() < 0.7 else "Any news? Please hurry.")
        text = None
        roll = rng.random()
        if roll < 0.003:
            text = f"Could you tell me which {_words(rng, 3)} you mean, {rng.choice(FIRST)}?"
        elif roll < 0.1:
            text = rng.choice(NARRATION)
        round_fields: dict[str, Any] = {
            "round": self.calls,
            "input_tokens": rng.randint(1_500, 9_000),
            "output_tokens": rng.randint(20, 300),
        }
        if text:
            round_fields["text"] = text
        self.emit("model_round", **round_fields)
        call_id = "call_" + "".join(rng.choices(string.ascii_letters + string.digits, k=24))
        call_fields: dict[str, Any] = {"round": self.calls, "call_id": call_id, "tool": tool, "kind": kind}
        call_fields["args"] = args
        if step_id:
            call_fields["step_id"] = step_id
        self.emit("tool_call", **call_fields)
        self.now += timedelta(milliseconds=rng.uniform(40, 900))
        result_fields: dict[str, Any] = {"call_id": call_id, "status": status, "result": result}
        if error_class:
            result_fields["error_class"] = error_class
        result_fields["latency_ms"] = round(rng.uniform(40, 900), 1)
        self.emit("tool_result", **result_fields)
        if status == "ok" and kind == "read" and repeatable:
            self.history.append((tool, kind, args, result))
            del self.history[:-64]

    def left(self) -> int:
        return self.target - self.calls

    def _may_reissue(self, entry: tuple[str, str, dict[str, Any], Any], times: int = 1) -> bool:
        key = orjson.dumps([entry[0], entry[2]], option=orjson.OPT_SORT_KEYS)
        if self.reissued[key] + times > MAX_REISSUES:
            return False
        self.reissued[key] += times
        return True

    def build(self) -> list[Event]:
        rng = self.rng
        steps: list[tuple[float, Callable[[], None]]] = [
            (0.70, self._fresh),
            (0.07, self._repeat_adjacent),
            (0.05, self._repeat_later),
            (0.04, self._nudged_search),
            (0.04, self._failure),
            (0.03, self._poll),
            (0.03, self._write),
            (0.01, self._alternate),
        ]
        weights = [w for w, _ in steps]
        while self.left() > 0:
            rng.choices(steps, weights)[0][1]()
        self.emit("run_finished", status="succeeded")
        return self.events

    def _fresh(self) -> None:
        self.call(*_fresh_read(self.rng))

    def _repeat_adjacent(self) -> None:
        if not self.history or not self._may_reissue(self.history[-1]):
            return self._fresh()
        self.call(*self.history[-1])

    def _repeat_later(self) -> None:
        entry = self.rng.choice(self.history) if self.history else None
        if entry is None or not self._may_reissue(entry):
            return self._fresh()
        self.call(*entry)

    def _nudged_search(self) -> None:
        # The same search reworded, the same hits: nothing new (perturbation).
        rng = self.rng
        tool, kind, args, result = _fresh_read(rng)
        while tool != "search_kb":
            tool, kind, args, result = _fresh_read(rng)
        # Not offered to the repeaters: a reworded search repeated as well is a loop the engine ends.
        self.call(tool, kind, args, result, repeatable=False)
        query = args["query"]
        for variant in (query + " please", query.capitalize() + "s")[: rng.randint(1, 2)]:
            if self.left() <= 0:
                return
            self.call(tool, kind, {**args, "query": variant}, result, repeatable=False)

    def _failure(self) -> None:
        rng = self.rng
        tool, kind, args, result = _fresh_read(rng)
        if rng.random() < 0.5:
            self.call(
                tool, kind, args, {"error": "upstream timed out"}, status="error", error_class="transient"
            )
            if self.left() > 0:
                self.call(tool, kind, args, result)
        else:
            self.call(tool, kind, args, {"error": "not found"}, status="error", error_class="not_found")

    def _poll(self) -> None:
        rng = self.rng
        job = f"job_{rng.getrandbits(40):010x}"
        running = {"job_id": job, "status": "running", "progress": 0}
        for _ in range(rng.randint(1, 4)):
            if self.left() <= 0:
                return
            self.call("poll_job", "poll", {"job_id": job}, running)
        if self.left() > 0:
            done = {"job_id": job, "status": "done", "progress": 100, "output": f"s3://exports/{job}.csv"}
            self.call("poll_job", "poll", {"job_id": job}, done)

    def _write(self) -> None:
        rng = self.rng
        ticket = f"T-{rng.randint(10_000, 99_999)}"
        self.call(
            "update_ticket",
            "write",
            {"ticket_id": ticket, "status": rng.choice(("pending", "solved")), "comment": _sentences(rng, 2)},
            {"ok": True, "ticket_id": ticket, "updated_at": self.now.isoformat()},
            step_id=f"step-{self.calls}",
        )

    def _alternate(self) -> None:
        # A -> B -> A -> B with unchanged results (two or three cycles: up to `correct`).
        if len(self.history) < 2:
            return self._fresh()
        a, b = self.history[-2], self.history[-1]
        if a[2] == b[2] and a[0] == b[0]:
            return self._fresh()
        cycles = self.rng.randint(1, 2)
        if not (self._may_reissue(a, cycles) and self._may_reissue(b, cycles)):
            return self._fresh()
        for _ in range(cycles):
            for entry in (a, b):
                if self.left() <= 0:
                    return
                self.call(*entry)


def run_build(seed: int, run_id: str, calls: int) -> list[Event]:
    return RunBuilder(random.Random(seed), run_id, calls).build()


# --- measuring ------------------------------------------------------------------------------


def feed_all(engine: Engine, events: list[Event]) -> tuple[RunState, list[Detection]]:
    state = RunState()
    found: list[Detection] = []
    feed = engine.feed
    for event in events:
        found += feed(state, event)
    return state, found


def feed_checkpointed(engine: Engine, events: list[Event], every: int) -> tuple[RunState, list[Detection]]:
    state = RunState()
    found: list[Detection] = []
    feed = engine.feed
    for start in range(0, len(events), every):
        for event in events[start : start + every]:
            found += feed(state, event)
        state = RunState.from_dict(orjson.loads(orjson.dumps(state.to_dict())))
    return state, found


def round_trip_s(state: RunState) -> float:
    times = []
    for _ in range(ROUND_TRIPS):
        t0 = time.perf_counter()
        RunState.from_dict(orjson.loads(orjson.dumps(state.to_dict())))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def state_size(state: RunState) -> int:
    return len(orjson.dumps(state.to_dict()))


def state_fields(state: RunState, top: int = 5) -> str:
    """The largest fields of the serialised state, in bytes."""
    sizes = {name: len(orjson.dumps(value)) for name, value in state.to_dict().items()}
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{name} {size:,}" for name, size in largest)


def real_runs(folder: Path) -> list[list[Event]]:
    """The recorded runs, each parsed into its events (in file order), or [] without them."""
    paths = sorted((folder / "runs").glob("*.jsonl")) if folder.is_dir() else []
    return [[orjson.loads(line) for line in p.read_bytes().splitlines() if line.strip()] for p in paths]


def pin() -> str:
    try:
        cpu = max(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError) as exc:
        return f"not pinned ({exc.__class__.__name__})"
    return f"pinned to CPU {cpu}"


def tally(found: list[Detection]) -> str:
    counts = Counter(f"{d.kind}/{d.action}" for d in found)
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--long-calls", type=int, default=20_000, help="tool calls of the long run")
    parser.add_argument("--short-calls", type=int, default=100, help="tool calls of each short run")
    parser.add_argument("--short-runs", type=int, default=50, help="distinct short runs, replayed in turn")
    parser.add_argument(
        "--min-seconds", type=float, default=1.0, help="least measuring time of the short runs"
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=1_000, help="events between state round trips"
    )
    parser.add_argument(
        "--real-corpus", type=Path, default=REAL_CORPUS, help="folder of recorded runs (runs/*.jsonl)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    args = parser.parse_args(argv)

    pinned = "not pinned (--no-pin)" if args.no_pin else pin()
    engine = Engine(CONFIG)

    t0 = time.perf_counter()
    shorts = [run_build(args.seed * 1000 + i, f"short-{i}", args.short_calls) for i in range(args.short_runs)]
    long_events = run_build(args.seed, "long", args.long_calls)
    built_s = time.perf_counter() - t0

    # Warm-up: imports, rapidfuzz, the first dict resizes.
    for events in shorts[:5]:
        feed_all(engine, events)

    gc.collect()
    short_events = short_runs = 0
    short_state: RunState | None = None
    short_found: list[Detection] = []
    t0 = time.perf_counter()
    while True:
        events = shorts[short_runs % len(shorts)]
        short_state, found = feed_all(engine, events)
        if short_runs < len(shorts):
            short_found += found
        short_runs += 1
        short_events += len(events)
        short_s = time.perf_counter() - t0
        if short_s >= args.min_seconds and short_runs >= len(shorts):
            break
    short_rate = short_events / short_s

    gc.collect()
    t0 = time.perf_counter()
    long_state, long_found = feed_all(engine, long_events)
    long_s = time.perf_counter() - t0
    long_rate = len(long_events) / long_s

    # Drift within the long run: the first and the last tenth, each timed on its own.
    tenth = len(long_events) // 10
    drift_state = RunState()
    t0 = time.perf_counter()
    for event in long_events[:tenth]:
        engine.feed(drift_state, event)
    first_rate = tenth / (time.perf_counter() - t0)
    for event in long_events[tenth:-tenth]:
        engine.feed(drift_state, event)
    t0 = time.perf_counter()
    for event in long_events[-tenth:]:
        engine.feed(drift_state, event)
    last_rate = tenth / (time.perf_counter() - t0)

    gc.collect()
    t0 = time.perf_counter()
    _, cp_found = feed_checkpointed(engine, long_events, args.checkpoint_every)
    cp_s = time.perf_counter() - t0
    cp_rate = len(long_events) / cp_s
    same = [d.as_dict() for d in cp_found] == [d.as_dict() for d in long_found]

    real = real_runs(args.real_corpus)
    real_rate = real_events = real_passes = 0
    real_s = 0.0
    if real:
        gc.collect()
        shipped = Engine(DEFAULT_CONFIG)
        t0 = time.perf_counter()
        while real_s < args.min_seconds or not real_passes:
            for events in real:
                feed_all(shipped, events)
                real_events += len(events)
            real_passes += 1
            real_s = time.perf_counter() - t0
        real_rate = real_events / real_s

    assert short_state is not None
    short_size, long_size = state_size(short_state), state_size(long_state)
    short_trip, long_trip = round_trip_s(short_state), round_trip_s(long_state)

    ratio = long_rate / short_rate
    ok_rate = "ok" if min(short_rate, long_rate) >= TARGET_EVENTS_S else "BELOW TARGET"
    ok_ratio = "ok" if ratio >= TARGET_RATIO else "BELOW TARGET"
    rows = [
        (
            f"events/s, runs of {args.short_calls:,} calls ({short_runs:,} runs, {short_events:,} events, {short_s:.2f} s)",
            f"{short_rate:,.0f}",
            f">= {TARGET_EVENTS_S:,}",
        ),
        (
            f"events/s, one run of {args.long_calls:,} calls ({len(long_events):,} events, {long_s:.2f} s)",
            f"{long_rate:,.0f}",
            f">= {TARGET_EVENTS_S:,} {ok_rate}",
        ),
        ("ratio long / short", f"{ratio:.2f}", f">= {TARGET_RATIO} {ok_ratio}"),
        ("  long run, events/s in its first tenth", f"{first_rate:,.0f}", ""),
        ("  long run, events/s in its last tenth", f"{last_rate:,.0f}", ""),
        (
            f"events/s, long run with a state round trip every {args.checkpoint_every:,} events",
            f"{cp_rate:,.0f}",
            f"same detections: {'yes' if same else 'NO'}",
        ),
        (f"state at the end, {args.short_calls:,} calls (orjson bytes)", f"{short_size:,}", ""),
        (f"state at the end, {args.long_calls:,} calls (orjson bytes)", f"{long_size:,}", ""),
        (
            f"to_dict+dumps+loads+from_dict, {args.short_calls:,}-call state (median of {ROUND_TRIPS})",
            f"{short_trip * 1000:.2f} ms",
            "",
        ),
        (
            f"to_dict+dumps+loads+from_dict, {args.long_calls:,}-call state (median of {ROUND_TRIPS})",
            f"{long_trip * 1000:.2f} ms",
            "",
        ),
    ]
    if real:
        ok_real = "ok" if real_rate >= TARGET_EVENTS_S else "BELOW TARGET"
        rows.append(
            (
                f"events/s, {len(real):,} recorded real runs, shipped defaults "
                f"({real_passes} passes, {real_events:,} events, {real_s:.2f} s)",
                f"{real_rate:,.0f}",
                f">= {TARGET_EVENTS_S:,} {ok_real}",
            )
        )
    else:
        rows.append((f"recorded real runs: none in {args.real_corpus}", "-", "skipped"))
    width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    print(
        f"detection engine, one core ({pinned}), Python {platform.python_version()}, seed {args.seed}, "
        f"events built in {built_s:.1f} s"
    )
    for label, value, target in rows:
        print(f"  {label:<{width}}  {value:>{value_width}}  {target}".rstrip())
    print(f"  detections, first {len(shorts)} short runs: {tally(short_found)}")
    print(f"  detections, long run: {tally(long_found)}")
    print(
        f"  long run end: {long_state.calls:,} calls, terminated_by {long_state.terminated_by or '-'}, "
        f"{len(long_state.facts):,} facts, {len(long_state.sigs):,} signatures, {len(long_state.goals):,} goals, "
        f"{len(long_state.perturbed):,} perturbed goals"
    )
    print(f"  largest state fields at the end of the long run (bytes): {state_fields(long_state)}")
    if "django" in sys.modules:
        print("  WARNING: django was imported: the engine is meant to be pure")
    if long_state.terminated_by:
        print("  WARNING: the long run was terminated: the figures are not the intended case")
    return 0


if __name__ == "__main__":
    sys.exit(main())
