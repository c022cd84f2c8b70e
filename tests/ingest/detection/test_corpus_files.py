"""Sanity of the labelled loop-detection corpus (tests/ingest/detection/corpus/): files, events, labels.

No database and no Django: plain functions over the JSON Lines files. The engine's quality test
(recall on loops, no intervention on legitimate runs) lives elsewhere; this only guards the corpus.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ingest.schema import validate_event
from tests.ingest.detection.corpus.make_corpus import write

CORPUS = Path(__file__).resolve().parent / "corpus"
SCHEMA = Path(__file__).resolve().parents[3] / "ingest" / "spec" / "trace-events.schema.json"

LOOP_KINDS = {
    "exact_repeat",
    "oscillation",
    "interval_loop",
    "perturbation",
    "repeated_error",
    "clarification",
    "monologue",
    "empty_responses",
    "no_progress",
    "poll_budget",
    "duplicate_write",
    "budget",
}
# Legitimate patterns the corpus must keep covering (the quality bar).
LEGIT_PATTERNS = {
    "polling_ends",
    "polling_identical_short",
    "polling_identical_inside_budget",
    "paging_page",
    "paging_offset",
    "paging_cursor",
    "paging_since_tail",
    "paging_restart_after_filter",
    "double_purchase",
    "identical_writes_user_intended",
    "retry_transient_backoff",
    "retry_rate_limited_backoff",
    "explore_many_files",
    "parallel_batch_distinct",
    "parallel_same_tool_distinct_ids",
    "tail_log_changing",
    "scroll_changing",
    "same_read_twice",
    "user_repeats_question",
    "long_research",
    "reread_after_change",
    "clarify_once",
    "refine_loop_converges",
    "alternation_results_change",
}


@cache
def runs() -> dict[str, list[dict[str, Any]]]:
    out = {}
    for path in sorted(CORPUS.glob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            out[path.stem] = [json.loads(line) for line in f if line.strip()]
    return out


def labels(events: list[dict[str, Any]]) -> dict[str, str]:
    return events[0].get("labels", {})


def count(events: list[dict[str, Any]], event_type: str) -> int:
    return sum(1 for e in events if e["type"] == event_type)


def test_corpus_size_and_balance():
    by_expect = [labels(ev).get("expect") for ev in runs().values()]
    assert len(by_expect) >= 80
    assert by_expect.count("loop") >= 35
    assert by_expect.count("ok") >= 35


def test_every_event_validates():
    for name, events in runs().items():
        for i, event in enumerate(events):
            try:
                validate_event(dict(event))
            except Exception as exc:  # the message names the field
                pytest.fail(f"{name}.jsonl line {i + 1}: {exc}")


def test_every_event_matches_the_json_schema():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(
        json.loads(SCHEMA.read_text()), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for name, events in runs().items():
        for i, event in enumerate(events):
            errors = list(validator.iter_errors(event))
            assert not errors, f"{name}.jsonl line {i + 1}: {errors[0].message}"


def test_runs_are_well_formed_streams():
    seen_ids = set()
    for name, events in runs().items():
        assert events[0]["type"] == "run_started", name
        assert events[-1]["type"] == "run_finished", name
        assert count(events, "run_started") == count(events, "run_finished") == 1, name
        run_id = events[0]["run_id"]
        assert run_id not in seen_ids, f"{name}: run_id reused"
        seen_ids.add(run_id)
        assert all(e["run_id"] == run_id for e in events), name
        stamps = [e["ts"] for e in events]
        assert stamps == sorted(stamps), f"{name}: timestamps go backwards"
        event_ids = [e["event_id"] for e in events if "event_id" in e]
        assert len(event_ids) == len(set(event_ids)), name
        rounds = 0
        open_calls: list[str] = []
        for e in events:
            if e["type"] == "model_round":
                rounds += 1
                assert e["round"] == rounds, f"{name}: rounds must count 1, 2, 3, ..."
            elif e["type"] == "tool_call":
                assert e["round"] == rounds, f"{name}: a call belongs to the latest model round"
                open_calls.append(e["call_id"])
            elif e["type"] == "tool_result":
                assert e["call_id"] in open_calls, f"{name}: result for no open call {e['call_id']}"
                # answers the most recent unanswered call with that id
                del open_calls[len(open_calls) - 1 - open_calls[::-1].index(e["call_id"])]
        assert not open_calls, f"{name}: calls without a result"


def test_labels():
    for name, events in runs().items():
        lab = labels(events)
        assert all(isinstance(v, str) for v in lab.values()), name
        assert lab.get("expect") in ("loop", "ok"), name
        assert lab.get("pattern") and lab.get("note"), name
        assert name.startswith(lab["expect"] + "_"), f"{name}: file name should start with its expect"
        calls, rounds = count(events, "tool_call"), count(events, "model_round")
        if lab["expect"] == "ok":
            assert not {"loop_kind", "intervene_by_call", "intervene_by_round"} & lab.keys(), name
            continue
        assert lab.get("loop_kind") in LOOP_KINDS, name
        points = [k for k in ("intervene_by_call", "intervene_by_round") if k in lab]
        assert len(points) == 1, f"{name}: exactly one label point"
        n = int(lab[points[0]])
        total = calls if points[0] == "intervene_by_call" else rounds
        # inside the run, and the run goes on after it so a late detector is caught
        assert 1 <= n < total, f"{name}: {points[0]}={n} of {total}"


def test_coverage_of_kinds_and_patterns():
    kinds: dict[str, int] = {}
    patterns = set()
    for events in runs().values():
        lab = labels(events)
        if lab["expect"] == "loop":
            kinds[lab["loop_kind"]] = kinds.get(lab["loop_kind"], 0) + 1
        else:
            patterns.add(lab["pattern"])
    assert all(kinds.get(k, 0) >= 3 for k in LOOP_KINDS), kinds
    assert LEGIT_PATTERNS <= patterns, LEGIT_PATTERNS - patterns
    backends = {events[0].get("backend") for events in runs().values()}
    assert {"openai", "anthropic", "deepseek", "local"} <= backends


def test_files_are_what_the_generator_writes(tmp_path):
    write(tmp_path)
    generated = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in CORPUS.iterdir() if p.suffix in (".jsonl", ".md"))
    assert generated == committed, "regenerate: .venv/bin/python -m tests.ingest.detection.corpus.make_corpus"
    for name in generated:
        assert (tmp_path / name).read_bytes() == (CORPUS / name).read_bytes(), f"{name} is stale: regenerate"
