"""The detection engine's cost per event when values are huge: 240 KB arguments, texts and results
against small ones (issue 11: a tool_call with 240 KB arguments cost ~2.8 s of fuzzy matching).

    .venv/bin/python bench/huge_values.py [--kb 240] [--calls 12] [--no-pin]

No Django, no database: `ingest.detection` only, on one core (os.sched_setaffinity).

1. Builds two runs of --calls rounds each: a model round whose text asks the same question in
   other words, a call of one tool whose arguments are a long query nudged a little each time, its
   result (the same each time: nothing new, so the perturbation detector compares the arguments
   with the previous call's, and the clarification detector each question with the earlier ones).
   The small run's values are ~60 characters; the huge run's --kb KB. The nudge is at both ends:
   rapidfuzz skips a common prefix and suffix, so this is its worst case.
2. Feeds each run to a fresh engine, timing every event; prints per event type the median and the
   worst time, for small and huge values, and the ratio of the huge run's mean against the target.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ingest.detection import Engine, RunState

# An event with huge values does linear work (hashing, normalising 240 KB); fuzzy matching must not
# make it quadratic. Target: the huge run's mean cost per event under this (2.8 s before).
TARGET_HUGE_MS = 20.0


def _text(rng: random.Random, chars: int) -> str:
    words = ["order", "status", "refund", "customer", "invoice", "shipping", "address", "delay", "parcel"]
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(words) + str(rng.randrange(1000))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def run_build(chars: int, calls: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    body = _text(rng, chars)
    events: list[dict] = [
        {"type": "run_started", "run_id": "r", "ts": "2026-11-29T10:00:00Z", "backend": "b", "model": "m"}
    ]
    for n in range(1, calls + 1):
        ts = f"2026-11-29T10:{n // 60:02d}:{n % 60:02d}Z"
        question = f"variant {n}: {body} could you tell me the order number please, variant {n}?"
        events.append(
            {
                "type": "model_round",
                "run_id": "r",
                "ts": ts,
                "round": n,
                "output_tokens": 50,
                "text": question,
            }
        )
        events.append(
            {
                "type": "tool_call",
                "run_id": "r",
                "ts": ts,
                "round": n,
                "call_id": f"c{n}",
                "tool": "search_kb",
                "kind": "read",
                "args": {"query": f"nudge {n} {body} nudge {n}"},
            }
        )
        events.append(
            {
                "type": "tool_result",
                "run_id": "r",
                "ts": ts,
                "call_id": f"c{n}",
                "status": "ok",
                "result": body,
            }
        )
    return events


def feed_timed(events: list[dict]) -> dict[str, list[float]]:
    engine, state = Engine(), RunState()
    times: dict[str, list[float]] = {}
    for event in events:
        started = time.perf_counter()
        engine.feed(state, event)
        times.setdefault(event["type"], []).append(time.perf_counter() - started)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=int, default=240)
    parser.add_argument("--calls", type=int, default=12)
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args(argv)
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    small = feed_timed(run_build(60, args.calls))
    huge = feed_timed(run_build(args.kb * 1024, args.calls))
    print(f"detection cost per event, {args.calls} rounds of a question, a nudged call and its result")
    print(
        f"  load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1, 5, 15 min)"
    )
    print(
        f"  {'event':<12} {'small median':>13} {'small worst':>12} {f'{args.kb} KB median':>14} {f'{args.kb} KB worst':>13}"
    )
    for kind in ("model_round", "tool_call", "tool_result"):
        s, h = small[kind], huge[kind]
        print(
            f"  {kind:<12} {statistics.median(s) * 1e3:>10.3f} ms {max(s) * 1e3:>9.3f} ms "
            f"{statistics.median(h) * 1e3:>11.3f} ms {max(h) * 1e3:>10.3f} ms"
        )
    every_small = [t for ts in small.values() for t in ts]
    every_huge = [t for ts in huge.values() for t in ts]
    mean_small, mean_huge = statistics.mean(every_small), statistics.mean(every_huge)
    verdict = "ok" if mean_huge * 1e3 <= TARGET_HUGE_MS else "OVER"
    print(
        f"  mean per event: small {mean_small * 1e3:.3f} ms, {args.kb} KB {mean_huge * 1e3:.3f} ms "
        f"(x{mean_huge / mean_small:.0f}); target {args.kb} KB <= {TARGET_HUGE_MS:.0f} ms: {verdict}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
