"""The quality bar on runs real agents recorded (others' recordings, labelled blind by two people).

The runs are not in the repository: `LOOPWATCH_REAL_CORPUS` names their folder (`runs/*.jsonl` and
`labels.json`); the maintainers' machines keep it beside the checkout, where it is looked for
without the variable. Without them the test is skipped, except under CI=true where
their absence is a failure. Shipped defaults only: what a new user gets.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from ingest.detection import DEFAULT_CONFIG, Engine, RunState
from ingest.detection.scoring import Fired, Label, Position, Scoreboard, run_source

ROOT = Path(__file__).resolve().parents[3]
CORPUS = Path(os.environ.get("LOOPWATCH_REAL_CORPUS") or ROOT.parent / "shared" / "corpus" / "real-dev")
RECALL_BAR = 0.90  # loops intervened on at or before the label's point
FALSE_BAR = 0.02  # healthy runs intervened on, in all
FALSE_BAR_SOURCE = 0.05  # … and in any one source


def _corpus() -> tuple[list[Path], dict[str, Label]]:
    labels_path = CORPUS / "labels.json"
    if not labels_path.is_file():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the real-run corpus is missing: {CORPUS} (CI=true requires it)")
        pytest.skip(f"the real-run corpus is not beside the repository ({CORPUS})")
    labels = {name: Label.from_dict(entry) for name, entry in orjson.loads(labels_path.read_bytes()).items()}
    return sorted((CORPUS / "runs").glob("*.jsonl")), labels


def score(paths: list[Path], labels: dict[str, Label]) -> Scoreboard:
    board = Scoreboard()
    engine = Engine(DEFAULT_CONFIG)
    for path in paths:
        label = labels.get(path.name)
        if label is None:
            continue  # the labellers disagreed: left out
        events = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        state, position, found = RunState(), Position(), []
        for event in events:
            position.see(event)
            found += [(d, position.calls, position.rounds) for d in engine.feed(state, event)]
        board.add(run_id=path.stem, source=run_source(events), label=label, first=Fired.first(found))
    return board


def test_real_runs_loops_caught_on_time_and_healthy_runs_left_alone():
    paths, labels = _corpus()
    board = score(paths, labels)
    total = board.total
    assert total.loops >= 40 and total.healthy >= 200, "the corpus is not the one expected"
    table = "\n".join(
        f"{name:12} loops {t.loops:3} on time {t.on_time:3} late {len(t.late):2} missed {len(t.missed):2}  "
        f"healthy {t.healthy:3} intervened {len(t.intervened):2}"
        for name, t in [*sorted(board.sources.items()), ("all", total)]
    )
    print("\n" + table)
    assert total.recall is not None and total.recall >= RECALL_BAR, (
        f"recall {total.recall:.3f}; late {total.late}; missed {total.missed}\n{table}"
    )
    assert total.false_rate is not None and total.false_rate <= FALSE_BAR, (
        f"false interventions {total.false_rate:.3f}: {total.intervened}\n{table}"
    )
    for name, tally in board.sources.items():
        if tally.healthy:
            assert tally.false_rate <= FALSE_BAR_SOURCE, f"{name}: {tally.intervened}\n{table}"
