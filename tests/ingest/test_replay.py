"""`manage.py replay`: no database mark anywhere, so pytest-django fails any query it would make."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import CommandError, call_command

from tests.ingest.events import model_round, run_finished, run_started, tool_call, tool_result, with_ids

ROOT = Path(__file__).resolve().parents[2]


def _interleaved() -> list[dict[str, Any]]:
    """Two runs, event by event: `loop` reads the same thing 4 times, `legit` reads 4 new things."""
    events = [run_started("loop"), run_started("legit")]
    for n in range(1, 5):
        events += [
            model_round("loop", n),
            tool_call("loop", f"c{n}", n, args={"customer": "42"}),
            tool_result("loop", f"c{n}", n, result={"orders": [{"id": "O-1", "status": "open"}]}),
            model_round("legit", n),
            tool_call("legit", f"c{n}", n, tool="get_order", args={"order_id": f"O-{n}"}),
            tool_result("legit", f"c{n}", n, result={"id": f"O-{n}", "status": "shipped", "total": n * 10}),
        ]
    return [*events, run_finished("loop"), run_finished("legit")]


def _jsonl(events: list[Any]) -> str:
    return "".join(orjson.dumps(e).decode() + "\n" for e in events)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text(_jsonl(_interleaved()))
    return path


def _replay(*args: str, **options: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("replay", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def _runs(out: str) -> dict[str, dict[str, Any]]:
    lines = out.splitlines()
    runs = [orjson.loads(line) for line in lines]
    assert len(runs) == len(lines) == len({r["run_id"] for r in runs})
    return {r["run_id"]: r for r in runs}


def _corrections(run: dict[str, Any]) -> list[tuple[str, str, int, int]]:
    return [
        (d["kind"], d["action"], d["at_call"], d["at_round"])
        for d in run["detections"]
        if d["action"] != "observe"
    ]


def test_replay_json_gives_one_line_per_run_in_order_of_first_appearance(trace: Path):
    out, _ = _replay(str(trace), "--json")
    runs = _runs(out)
    assert list(runs) == ["loop", "legit"]
    loop, legit = runs["loop"], runs["legit"]
    assert _corrections(loop) == [("exact_repeat", "correct", 3, 3)]
    detection = next(d for d in loop["detections"] if d["action"] == "correct")
    assert set(detection) == {"kind", "action", "at_call", "at_round", "signature", "evidence", "hint"}
    assert detection["signature"] and "search_orders" in detection["hint"]
    assert legit["detections"] == []
    for run in (loop, legit):
        assert set(run) == {"run_id", "detections", "terminated_by", "budget_type"}
        assert run["terminated_by"] is None and run["budget_type"] is None


def test_replay_reads_standard_input_for_a_dash(trace: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(trace.read_text()))
    from_stdin, _ = _replay("-", "--json")
    from_file, _ = _replay(str(trace), "--json")
    assert from_stdin == from_file
    assert _corrections(_runs(from_stdin)["loop"]) == [("exact_repeat", "correct", 3, 3)]


def test_replay_takes_the_stdin_option_too(trace: Path):
    out, _ = _replay("-", "--json", stdin=io.StringIO(trace.read_text()))
    assert list(_runs(out)) == ["loop", "legit"]


@pytest.mark.parametrize(
    "content",
    [
        {"thresholds": {"repeat_tolerance": 4}},
        {"repeat_tolerance": 4},  # the flat form
        {"thresholds": {"repeat_tolerance": 4}, "tools": {"search_orders": {"kind": "read"}}},
    ],
)
def test_replay_thresholds_file_moves_the_correction(trace: Path, tmp_path: Path, content: dict):
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_bytes(orjson.dumps(content))
    out, _ = _replay(str(trace), "--json", "--thresholds", str(thresholds))
    runs = _runs(out)
    assert _corrections(runs["loop"]) == [("exact_repeat", "correct", 4, 4)]
    assert runs["legit"]["detections"] == []


def test_replay_tool_descriptions_change_what_counts_as_the_same_call(tmp_path: Path):
    # The same order asked for in other letter case: the same call only for a case-blind tool.
    events = [run_started("r")]
    for n, order in enumerate(("o-1", "O-1", "o-1", "O-1"), 1):
        events += [
            model_round("r", n),
            tool_call("r", f"c{n}", n, tool="get_order", args={"order_id": order}),
            tool_result("r", f"c{n}", n, result={"id": "O-1", "status": "open"}),
        ]
    trace = tmp_path / "case.jsonl"
    trace.write_text(_jsonl(events))
    thresholds = tmp_path / "tools.json"
    thresholds.write_bytes(orjson.dumps({"tools": {"get_order": {"kind": "read", "casefold": True}}}))
    plain, _ = _replay(str(trace), "--json")
    casefolded, _ = _replay(str(trace), "--json", "--thresholds", str(thresholds))
    assert not any(d["kind"] == "exact_repeat" for d in _runs(plain)["r"]["detections"])
    assert ("exact_repeat", "correct", 3, 3) in _corrections(_runs(casefolded)["r"])


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"thresholds": {"repeat_tolerance": 1}}, "repeat_tolerance"),
        ({"thresholds": {"repeat_tolerence": 4}}, "repeat_tolerence"),
        ({"similarity": "high"}, "similarity"),
        ({"thresholds": {}, "tool": {}}, "tool"),
        ({"tools": {"search_orders": {"core_args": "customer"}}}, "tools.search_orders.core_args"),
        ({"tools": {"search_orders": {"kind": "delete"}}}, "tools.search_orders.kind"),
        ({"tools": {"search_orders": {"casefold": "yes"}}}, "tools.search_orders.casefold"),
        ([4], "must be a JSON object"),
    ],
)
def test_replay_bad_thresholds_file_names_the_file_and_the_field(
    trace: Path, tmp_path: Path, content: Any, field: str
):
    thresholds = tmp_path / "bad.json"
    thresholds.write_bytes(orjson.dumps(content))
    with pytest.raises(CommandError) as caught:
        _replay(str(trace), "--json", "--thresholds", str(thresholds))
    message = str(caught.value)
    assert str(thresholds) in message and field in message


def test_replay_unreadable_thresholds_file_is_a_command_error(trace: Path, tmp_path: Path):
    with pytest.raises(CommandError, match=r"missing\.json"):
        _replay(str(trace), "--thresholds", str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{repeat_tolerance: 4")
    with pytest.raises(CommandError, match=r"broken\.json: not JSON"):
        _replay(str(trace), "--thresholds", str(broken))


def test_replay_reports_bad_lines_with_file_and_line_and_goes_on(tmp_path: Path):
    lines = _jsonl(_interleaved()).splitlines(keepends=True)
    lines.insert(2, "{not json\n")  # line 3
    lines.insert(5, '{"type": "tool_call", "run_id": "loop", "ts": "2026-11-29T10:00:01Z"}\n')  # line 6
    lines.insert(7, "\n")  # a blank line is not an error
    trace = tmp_path / "mixed.jsonl"
    trace.write_text("".join(lines))
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="2 of"):
        call_command("replay", str(trace), "--json", stdout=out, stderr=err)
    reported = err.getvalue().splitlines()
    assert reported[0].startswith(f"{trace}:3: not JSON")
    assert reported[1] == f"{trace}:6: round: is required"
    # The valid events were still replayed, and the verdicts printed before the error.
    runs = _runs(out.getvalue())
    assert _corrections(runs["loop"]) == [("exact_repeat", "correct", 3, 3)]


def test_replay_missing_file_is_a_command_error(tmp_path: Path):
    with pytest.raises(CommandError, match=r"nothing\.jsonl"):
        _replay(str(tmp_path / "nothing.jsonl"))


def test_replay_says_so_when_the_input_is_empty(tmp_path: Path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out, err = _replay(str(empty), "--json")
    assert out == ""
    assert "no events" in err


def test_replay_sees_a_duplicate_delivery_once(tmp_path: Path):
    # The legit run's events delivered twice (same event_ids): stored once, so no repeat either.
    legit = with_ids([e for e in _interleaved() if e["run_id"] == "legit"])
    trace = tmp_path / "twice.jsonl"
    trace.write_text(_jsonl(legit + legit))
    out, err = _replay(str(trace), "--json")
    assert _runs(out)["legit"]["detections"] == []
    assert f"{len(legit)} duplicate events" in err


def test_replay_table_shows_each_run_and_a_summary(trace: Path):
    out, _ = _replay(str(trace))
    assert "run loop  ·  4 calls  ·  4 rounds" in out
    assert "run legit  ·  4 calls  ·  4 rounds  ·  no detections" in out
    correction = next(line for line in out.splitlines() if "correct " in line)
    assert correction.split()[:4] == ["3", "3", "exact_repeat", "correct"]
    assert "You have called search_orders 3 times" in correction
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("replay: 2 runs, 1 with an intervention")
    assert "exact_repeat 2 (observe 1, correct 1)" in summary


def test_replay_command_line_needs_no_database(trace: Path):
    # An unreachable database: the command must not even try it (no checks, no model queries).
    env = {**os.environ, "DATABASE_URL": "postgres://nobody:nothing@127.0.0.1:9/none"}
    done = subprocess.run(
        [sys.executable, "manage.py", "replay", "--json", "-"],
        cwd=ROOT,
        env=env,
        input=trace.read_bytes(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert list(_runs(done.stdout.decode())) == ["loop", "legit"]
    bad = subprocess.run(
        [sys.executable, "manage.py", "replay", "-"],
        cwd=ROOT,
        env=env,
        input=b"[]\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1
    assert "<stdin>:1: must be an object" in bad.stderr.decode()


# --- scoring against labels ---------------------------------------------------------------------


def _scored_runs() -> list[dict[str, Any]]:
    """Five runs of two sources: three repeat one read 4 times (a correction at call 3), two read
    new things; `nolabel` has no label."""
    events = []
    for run_id, source, loops in (
        ("on-time", "a", True),
        ("late", "a", True),
        ("missed", "b", False),
        ("noisy", "b", True),
        ("quiet", "b", False),
        ("nolabel", "b", False),
    ):
        events.append(run_started(run_id, labels={"source": source}))
        for n in range(1, 5):
            args = {"customer": "42"} if loops else {"customer": f"{run_id}-{n}"}
            events += [
                model_round(run_id, n),
                tool_call(run_id, f"c{n}", n, args=args),
                tool_result(run_id, f"c{n}", n, result={"orders": [{"id": f"O-{n if not loops else 1}"}]}),
            ]
    return events


LABELS = {
    "on-time": {"loop": True, "kind": "exact_repeat", "flag_by_call": 3},
    "late": {"loop": True, "kind": "exact_repeat", "flag_by_call": 2},
    # Counted by model round: the correction at call 3 came with 3 rounds seen.
    "missed.jsonl": {"loop": True, "kind": "monologue", "flag_by_call": 3, "count": "round"},
    "noisy": {"loop": False, "kind": "none", "flag_by_call": None},
    "quiet": {"loop": False},
}


@pytest.fixture
def scored(tmp_path: Path) -> tuple[Path, Path]:
    trace = tmp_path / "runs.jsonl"
    trace.write_text(_jsonl(_scored_runs()))
    labels = tmp_path / "labels.json"
    labels.write_bytes(orjson.dumps(LABELS))
    return trace, labels


def test_replay_labels_json_scores_per_source_and_kind(scored: tuple[Path, Path]):
    trace, labels = scored
    out, _ = _replay(str(trace), "--labels", str(labels), "--json")
    lines = out.splitlines()
    assert len(lines) == 1  # one object
    score = orjson.loads(lines[0])
    total = score["total"]
    assert (total["loops"], total["on_time"], total["late"], total["missed"]) == (3, 1, 1, 1)
    assert total["late_runs"] == ["late"] and total["missed_runs"] == ["missed"]
    assert (total["healthy"], total["intervened"], total["intervened_runs"]) == (2, 1, ["noisy"])
    assert total["recall"] == pytest.approx(1 / 3) and total["false_rate"] == 0.5
    a, b = score["sources"]["a"], score["sources"]["b"]
    assert (a["loops"], a["on_time"], a["late"], a["healthy"]) == (2, 1, 1, 0)
    assert (b["loops"], b["missed"], b["healthy"], b["intervened_runs"]) == (1, 1, 2, ["noisy"])
    # Loops under their label's kind, a healthy run under its first intervention's.
    assert score["kinds"]["exact_repeat"]["loops"] == 2
    assert score["kinds"]["exact_repeat"]["intervened_runs"] == ["noisy"]
    assert score["kinds"]["monologue"]["missed_runs"] == ["missed"]
    assert score["unlabelled"] == ["nolabel"]
    late = next(r for r in score["runs"] if r["run_id"] == "late")
    assert late["first"] == {"kind": "exact_repeat", "action": "correct", "calls": 3, "rounds": 3}


def test_replay_labels_table_lists_the_runs_behind_each_count(scored: tuple[Path, Path]):
    trace, labels = scored
    out, _ = _replay(str(trace), "--labels", str(labels))
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.strip():
            rows.setdefault(line.split()[0], line.split()[1:])  # the first: the source table's
    assert rows["a"] == ["2", "1", "1", "0", "0.50", "0", "0", "-"]
    assert rows["b"] == ["1", "0", "0", "1", "0.00", "2", "1", "50.0%"]
    assert rows["all"] == ["3", "1", "1", "1", "0.33", "2", "1", "50.0%"]
    assert "1 runs without a label" in out
    assert "  a  late  exact_repeat correct at call 3, round 3; label exact_repeat by call 2" in out
    assert "  b  missed  label monologue by round 3" in out
    assert "  b  noisy  exact_repeat correct at call 3, round 3" in out


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ([1], "must be a JSON object"),
        ({"r": {"loop": "yes"}}, "r.loop"),
        ({"r": {"loop": True}}, "r.flag_by_call"),
        ({"r": {"loop": True, "flag_by_call": 2, "count": "step"}}, "r.count"),
    ],
)
def test_replay_bad_labels_file_names_the_field(trace: Path, tmp_path: Path, content: Any, field: str):
    labels = tmp_path / "labels.json"
    labels.write_bytes(orjson.dumps(content))
    with pytest.raises(CommandError) as caught:
        _replay(str(trace), "--labels", str(labels))
    assert str(labels) in str(caught.value) and field in str(caught.value)


def test_replay_shows_what_a_kind_in_shadow_would_have_done(trace: Path, tmp_path: Path):
    thresholds = tmp_path / "modes.json"
    thresholds.write_bytes(orjson.dumps({"mode_exact_repeat": "shadow"}))
    out, _ = _replay(str(trace), "--thresholds", str(thresholds))
    line = next(line for line in out.splitlines() if "(in shadow: correct)" in line)
    assert line.split()[:4] == ["3", "3", "exact_repeat", "observe"]
    assert "replay: 2 runs, 0 with an intervention" in out
