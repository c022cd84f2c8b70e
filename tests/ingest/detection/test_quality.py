"""The quality bar on the labelled corpus, with the thresholds loopwatch ships (the defaults).

A loop counts as caught when an intervention (correct or stronger) fired at or before the label's
point: `intervene_by_call` counts tool_call events seen, `intervene_by_round` model rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from ingest.detection import DEFAULT_CONFIG, Engine, RunState

CORPUS = Path(__file__).parent / "corpus"
RECALL_BAR = 0.95


@dataclass
class Outcome:
    name: str
    labels: dict
    first_call: int | None  # tool calls seen when the first intervention fired
    first_round: int | None
    interventions: list


def replay(path: Path) -> Outcome:
    events = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    engine, state = Engine(DEFAULT_CONFIG), RunState()
    calls = rounds = 0
    first_call = first_round = None
    found = []
    for event in events:
        calls += event["type"] == "tool_call"
        rounds += event["type"] == "model_round"
        for detection in engine.feed(state, event):
            if detection.action == "observe":
                continue
            found.append(detection)
            if first_call is None:
                first_call, first_round = calls, rounds
    return Outcome(path.stem, events[0].get("labels", {}), first_call, first_round, found)


def outcomes() -> list[Outcome]:
    return [replay(p) for p in sorted(CORPUS.glob("*.jsonl"))]


def caught(o: Outcome) -> bool:
    if o.first_call is None:
        return False
    if "intervene_by_call" in o.labels:
        return o.first_call <= int(o.labels["intervene_by_call"])
    return o.first_round <= int(o.labels["intervene_by_round"])


def test_recall_on_loops_and_no_intervention_on_legitimate_runs():
    all_runs = outcomes()
    loops = [o for o in all_runs if o.labels["expect"] == "loop"]
    legit = [o for o in all_runs if o.labels["expect"] == "ok"]
    assert len(all_runs) >= 80 and loops and legit
    missed = [
        (
            o.name,
            o.first_call,
            o.first_round,
            o.labels.get("intervene_by_call"),
            o.labels.get("intervene_by_round"),
        )
        for o in loops
        if not caught(o)
    ]
    false_alarms = [
        (o.name, [(d.kind, d.action, d.at_call) for d in o.interventions[:3]])
        for o in legit
        if o.interventions
    ]
    recall = 1 - len(missed) / len(loops)
    print(
        f"\nrecall {recall:.3f} ({len(loops) - len(missed)}/{len(loops)}), false interventions {len(false_alarms)}/{len(legit)}"
    )
    assert not false_alarms, false_alarms
    assert recall >= RECALL_BAR, missed


@pytest.mark.parametrize(
    "kind", sorted({"exact_repeat", "oscillation", "repeated_error", "duplicate_write", "budget"})
)
def test_each_kind_is_caught_by_its_own_signal(kind):
    runs = [o for o in outcomes() if o.labels.get("loop_kind") == kind]
    assert runs
    for o in runs:
        assert caught(o), o.name
        if kind != "budget":
            assert o.interventions[0].kind in (
                kind,
                "interval_loop",
                "exact_repeat",
                "oscillation",
                "repeated_error",
                "duplicate_write",
            ), (o.name, o.interventions[0].kind)
