"""`manage.py replay FILE... [--json] [--thresholds FILE] [--labels FILE]`: the detection engine over
trace files.

Offline and without the database: it reads JSON Lines (trace events v1, any number of runs per
file, `-` for standard input), groups the events by run_id, feeds each run's events to the engine
in file order and prints what fired, as a table or one JSON line per run. It imports no model and
opens no connection, so it works with the embedded settings on a laptop holding only a corpus.

1. Read every file; a line that is not a valid event is reported as `FILE:LINE: reason` and
   skipped; a second event with the same (run_id, event_id) is skipped as the server would.
2. Replay each run, in the order of its first event, with one engine and a fresh state.
3. Print the table and a summary (or the JSON lines); with --labels, the score instead: per source
   and per kind, loops caught on time / late / missed and healthy runs intervened on, with the run
   ids (or the same as one JSON object). Exit 1 when any line was bad.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, TypedDict

import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from ingest.detection import ACTIONS, Config, Detection, Engine, RunState, Thresholds, ToolSpec
from ingest.detection.scoring import Fired, Label, Position, Scoreboard, Tally, run_source
from ingest.schema import EventError, validate_event

STDIN = "-"
STDIN_NAME = "<stdin>"
BAD_LINES_SHOWN = 100  # past this only counted: a wrong file would otherwise bury the output
HINT_WIDTH = 80
PROGRESS_MIN_RUNS = 200  # fewer runs replay in about a second: a bar would only flicker
PROGRESS_EVERY_S = 0.1
PROGRESS_WIDTH = 24
INTERVENTION = ACTIONS.index("correct")  # this action or a stronger one changes what the agent does
CONFIG_SECTIONS = ("thresholds", "tools")


class DetectionOut(TypedDict):
    kind: str
    action: str
    at_call: int
    at_round: int
    signature: str
    evidence: dict[str, Any]
    hint: str


class RunOut(TypedDict):
    run_id: str
    detections: list[DetectionOut]
    terminated_by: str | None
    budget_type: str | None


@dataclass
class _Run:
    """One run's valid events in file order, and where each came from (for engine failures)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    event_ids: set[str] = field(default_factory=set)
    path: str = ""  # the file of its first event: labels may name runs by file


@dataclass
class Input:
    """What the files held: runs in order of first appearance, and what was skipped."""

    runs: dict[str, _Run] = field(default_factory=dict)
    lines: int = 0
    bad: int = 0
    duplicates: int = 0


@dataclass(frozen=True)
class Replayed:
    run_id: str
    calls: int
    rounds: int
    terminated_by: str | None
    budget_type: str | None
    detections: list[Detection]
    source: str = "-"
    path: str = ""
    first: Fired | None = None  # the first intervention, with the calls and rounds seen then

    @property
    def intervened(self) -> bool:
        return any(ACTIONS.index(d.action) >= INTERVENTION for d in self.detections)

    def as_json(self) -> RunOut:
        return {
            "run_id": self.run_id,
            "detections": [
                {
                    "kind": d.kind,
                    "action": d.action,
                    "at_call": d.at_call,
                    "at_round": d.at_round,
                    "signature": d.signature,
                    "evidence": d.evidence,
                    "hint": d.hint,
                }
                for d in self.detections
            ],
            "terminated_by": self.terminated_by,
            "budget_type": self.budget_type,
        }


# --- configuration ----------------------------------------------------------------------------


def config_load(path: str) -> Config:
    """The engine's config from a thresholds file; CommandError naming the file and the field.

    Either `{"thresholds": {...}, "tools": {name: {...}}}` or a flat object of threshold overrides.
    """

    def fail(problem: str) -> CommandError:
        return CommandError(f"--thresholds {path}: {problem}")

    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise fail(exc.strerror or str(exc)) from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise fail(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise fail("must be a JSON object")
    if any(name in data for name in CONFIG_SECTIONS):
        for name in data:
            if name not in CONFIG_SECTIONS:
                raise fail(f"{name}: not a section (expected {', '.join(CONFIG_SECTIONS)})")
        overrides, tools = data.get("thresholds", {}), data.get("tools", {})
    else:
        overrides, tools = data, {}
    if not isinstance(overrides, dict):
        raise fail("thresholds: must be an object")
    if not isinstance(tools, dict):
        raise fail("tools: must be an object of tool name to description")
    try:
        # Its message starts with the field: `repeat_tolerance: must be at least 2`.
        thresholds = Thresholds().merged(overrides)
    except ValueError as exc:
        raise fail(str(exc)) from None
    specs = {}
    for name, spec in tools.items():
        try:
            specs[name] = ToolSpec.from_dict(spec)
        except ValueError as exc:  # `kind: must be one of …`, or `: must be an object`
            problem = str(exc)
            raise fail(f"tools.{name}{problem if problem.startswith(':') else '.' + problem}") from None
    return Config(thresholds=thresholds, tools=specs)


def labels_load(path: str) -> dict[str, Label]:
    """`{run: {"loop": bool, "kind": …, "flag_by_call": int, "count": "round"?, …}}` from a file;
    a run is named by its run_id or by the name of its file (with or without `.jsonl`)."""

    def fail(problem: str) -> CommandError:
        return CommandError(f"--labels {path}: {problem}")

    try:
        with open(path, "rb") as fh:
            data = orjson.loads(fh.read())
    except OSError as exc:
        raise fail(exc.strerror or str(exc)) from None
    except orjson.JSONDecodeError as exc:
        raise fail(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise fail("must be a JSON object of run to label")
    labels = {}
    for name, entry in data.items():
        try:
            labels[name] = Label.from_dict(entry)
        except ValueError as exc:
            raise fail(f"{name}.{exc}") from None
    return labels


def _label_for(labels: dict[str, Label], result: Replayed) -> Label | None:
    base = os.path.basename(result.path)
    for name in (result.run_id, f"{result.run_id}.jsonl", base, base.removesuffix(".jsonl")):
        if name and name in labels:
            return labels[name]
    return None


# --- reading ------------------------------------------------------------------------------------


def _lines(path: str, stdin: IO[Any]) -> Iterator[tuple[int, bytes | str]]:
    if path == STDIN:
        # Bytes when there is a real stdin (orjson reads them directly), text from a StringIO.
        yield from enumerate(getattr(stdin, "buffer", stdin), 1)
        return
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror or exc}") from None
    with fh:
        yield from enumerate(fh, 1)


# --- output -------------------------------------------------------------------------------------


def _shorten(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class Progress:
    """A bar on stderr while many runs replay, drawn only when stderr is a terminal."""

    def __init__(self, stream: OutputWrapper, total: int) -> None:
        self.stream = stream
        self.total = total
        self.enabled = total >= PROGRESS_MIN_RUNS and stream.isatty()
        self.t0 = time.monotonic()
        self._last = 0.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY_S and done < self.total:
            return
        self._last = now
        filled = PROGRESS_WIDTH * done // self.total
        bar = "#" * filled + "." * (PROGRESS_WIDTH - filled)
        self._write(f"\r[{bar}] runs {done:,}/{self.total:,} | {now - self.t0:,.1f}s\x1b[K")

    def close(self) -> None:
        if self.enabled:
            self._write("\r\x1b[K")  # the bar goes: what follows on the terminal is the result

    def _write(self, text: str) -> None:
        # Unstyled, no newline: stderr's default style would paint the bar red.
        self.stream.write(text, style_func=lambda s: s, ending="")
        self.stream.flush()


def _rate(value: float | None, *, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if percent else f"{value:.2f}"


def _score_row(tally: Tally, *, rate: bool = True) -> str:
    row = f"{tally.loops:>5}  {tally.on_time:>7}  {len(tally.late):>4}  {len(tally.missed):>6}  {_rate(tally.recall):>6}  "
    if not rate:
        return row + f"{len(tally.intervened):>18}"
    return (
        row + f"{tally.healthy:>7}  {len(tally.intervened):>10}  {_rate(tally.false_rate, percent=True):>6}"
    )


def _score_detail(score) -> str:
    label = score.label
    where = ""
    if score.first is not None:
        where = (
            f"{score.first.kind} {score.first.action} at call {score.first.calls}, round {score.first.rounds}"
        )
    if not label.loop:
        return where
    point = f"label {label.kind} by {'round' if label.by_round else 'call'} {label.flag_by}"
    return f"{where}; {point}" if where else point


class Command(BaseCommand):
    help = (
        "Replay trace files (JSON Lines, trace events v1, many runs per file; - reads standard input) "
        "through the detection engine, without the database, and show what it detects per run."
    )
    # Replay needs neither the database nor the server's configuration to be sound: no checks.
    requires_system_checks: list[str] = []
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "files",
            nargs="+",
            metavar="FILE",
            help="trace files; events of one run_id across files are one run; - is standard input",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="one JSON object a line per run: run_id, detections, terminated_by, budget_type",
        )
        parser.add_argument(
            "--labels",
            metavar="FILE",
            help='JSON: {run_id or file name: {"loop": bool, "kind": …, "flag_by_call": N, "count": '
            '"round"?}}; prints the score per source and per kind instead of each run',
        )
        parser.add_argument(
            "--thresholds",
            metavar="FILE",
            help='JSON: {"thresholds": {name: value}, "tools": {tool: {kind, core_args, noise_args, '
            "cursor_args, casefold}}}, or a flat object of threshold overrides",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = config_load(options["thresholds"]) if options["thresholds"] else Config()
        labels = labels_load(options["labels"]) if options.get("labels") else None
        data = self._read(options["files"], options.get("stdin") or sys.stdin)
        if not data.runs:
            what = "no valid events" if data.bad else "no events"
            names = ", ".join(STDIN_NAME if path == STDIN else path for path in options["files"])
            self.stderr.write(f"replay: {what} in {names}", style_func=lambda s: s)
        else:
            results = self._replay(data, config)
            if labels is not None:
                self._score(results, labels, as_json=options["json"])
            elif options["json"]:
                for result in results:
                    self.stdout.write(orjson.dumps(result.as_json()).decode())
            else:
                self._table(results, data)
        if data.duplicates and options["json"]:
            self.stderr.write(
                f"replay: {data.duplicates} duplicate events (same run_id and event_id) skipped",
                style_func=lambda s: s,
            )
        if data.bad:
            raise CommandError(f"{data.bad} of {data.lines} lines were not valid events and were skipped")

    def _read(self, paths: list[str], stdin: IO[Any]) -> Input:
        data = Input()
        for path in paths:
            name = STDIN_NAME if path == STDIN else path
            for number, line in _lines(path, stdin):
                if not line.strip():
                    continue
                data.lines += 1
                where = f"{name}:{number}"
                try:
                    event = orjson.loads(line)
                    validate_event(event)
                except orjson.JSONDecodeError as exc:
                    self._bad(data, f"{where}: not JSON ({exc})")
                    continue
                except EventError as exc:
                    self._bad(
                        data, f"{where}: {exc.field}: {exc.reason}" if exc.field else f"{where}: {exc.reason}"
                    )
                    continue
                run = data.runs.get(event["run_id"])
                if run is None:
                    run = data.runs[event["run_id"]] = _Run(path=name)
                event_id = event.get("event_id")
                if event_id is not None:
                    # A second delivery is stored once by the server, so the engine sees it once.
                    if event_id in run.event_ids:
                        data.duplicates += 1
                        continue
                    run.event_ids.add(event_id)
                run.events.append(event)
                run.where.append(where)
        return data

    def _bad(self, data: Input, message: str) -> None:
        data.bad += 1
        if data.bad <= BAD_LINES_SHOWN:
            self.stderr.write(message)
        elif data.bad == BAD_LINES_SHOWN + 1:
            self.stderr.write(f"(more invalid lines are only counted after the first {BAD_LINES_SHOWN})")

    def _replay(self, data: Input, config: Config) -> list[Replayed]:
        engine = Engine(config)
        progress = Progress(self.stderr, len(data.runs))
        results = []
        try:
            for done, (run_id, run) in enumerate(data.runs.items(), 1):
                state = RunState()
                found: list[Detection] = []
                position = Position()
                first: Fired | None = None
                for event, where in zip(run.events, run.where, strict=True):
                    position.see(event)
                    try:
                        fired = engine.feed(state, event)
                        found += fired
                        if first is None and fired:
                            first = Fired.first([(d, position.calls, position.rounds) for d in fired])
                    except Exception as exc:
                        progress.close()
                        raise CommandError(
                            f"{where}: run {run_id}: the engine failed on this event: {exc!r}"
                        ) from exc
                results.append(
                    Replayed(
                        run_id=run_id,
                        calls=state.calls,
                        rounds=state.round,
                        terminated_by=state.terminated_by or None,
                        budget_type=state.budget_type or None,
                        detections=found,
                        source=run_source(run.events),
                        path=run.path,
                        first=first,
                    )
                )
                run.events, run.where = [], []  # replayed: only the verdicts are needed from here on
                progress.update(done)
        finally:
            progress.close()
        return results

    def _score(self, results: list[Replayed], labels: dict[str, Label], *, as_json: bool) -> None:
        board = Scoreboard()
        unlabelled = []
        for result in results:
            label = _label_for(labels, result)
            if label is None:
                unlabelled.append(result.run_id)
                continue
            board.add(run_id=result.run_id, source=result.source, label=label, first=result.first)
        if as_json:
            self.stdout.write(orjson.dumps({**board.as_dict(), "unlabelled": unlabelled}).decode())
            return
        out = self.stdout
        total = board.total
        head = (
            f"score: {len(board.runs)} labelled runs ({total.loops} loops, {total.healthy} healthy); "
            "a loop is caught on time by an intervention (correct or stronger) at or before its label's "
            "call (or round)"
        )
        out.write(head + (f"; {len(unlabelled)} runs without a label" if unlabelled else ""))
        for title, rows in (("source", board.sources), ("kind", board.kinds)):
            out.write("")
            width = max(len(title), len("all"), *(len(name) for name in rows))
            head = (
                f"{title:<{width}}  {'loops':>5}  {'on time':>7}  {'late':>4}  {'missed':>6}  {'recall':>6}  "
            )
            if title == "source":
                out.write(head + f"{'healthy':>7}  {'intervened':>10}  {'rate':>6}")
                for name, tally in [*sorted(rows.items()), ("all", total)]:
                    out.write(f"{name:<{width}}  {_score_row(tally)}")
            else:
                # A healthy run counts under the kind of its first intervention: no rate per kind.
                out.write(head + f"{'healthy intervened':>18}")
                for name, tally in sorted(rows.items()):
                    out.write(f"{name:<{width}}  {_score_row(tally, rate=False)}")
                out.write(
                    "(a loop counts under its label's kind, a healthy run under its first intervention's)"
                )
        by_id = {r.run_id: r for r in board.runs}
        for what, pick in (
            ("late", lambda t: t.late),
            ("missed", lambda t: t.missed),
            ("healthy runs intervened on", lambda t: t.intervened),
        ):
            listed = [
                (name, run_id) for name, tally in sorted(board.sources.items()) for run_id in pick(tally)
            ]
            if not listed:
                continue
            out.write("")
            out.write(f"{what}:")
            for name, run_id in listed:
                out.write(f"  {name}  {run_id}  {_score_detail(by_id[run_id])}")

    def _table(self, results: list[Replayed], data: Input) -> None:
        out = self.stdout
        kind_width = max([len("kind"), *(len(d.kind) for r in results for d in r.detections)])
        action_width = max(len(a) for a in ACTIONS)
        for result in results:
            head = f"run {result.run_id}  ·  {result.calls} calls  ·  {result.rounds} rounds"
            if result.terminated_by:
                head += f"  ·  terminated by {result.terminated_by}"
                if result.budget_type:
                    head += f" ({result.budget_type})"
            if not result.detections:
                out.write(f"{head}  ·  no detections")
                continue
            out.write(head)
            out.write(
                f"  {'call':>5}  {'round':>5}  {'kind':<{kind_width}}  {'action':<{action_width}}  hint"
            )
            for d in result.detections:
                # A kind in shadow: observed, with what full would have done before its hint.
                shadow = f"(in shadow: {d.evidence['shadow']}) " if "shadow" in d.evidence else ""
                out.write(
                    f"  {d.at_call:>5}  {d.at_round:>5}  {d.kind:<{kind_width}}  {d.action:<{action_width}}  "
                    f"{shadow}{_shorten(d.hint, HINT_WIDTH)}"
                )
        out.write("")
        out.write(self._summary(results, data))

    def _summary(self, results: list[Replayed], data: Input) -> str:
        detections = [d for r in results for d in r.detections]
        by_kind = Counter(d.kind for d in detections)
        by_pair = Counter((d.kind, d.action) for d in detections)
        by_action = Counter(d.action for d in detections)
        intervened = sum(r.intervened for r in results)
        terminated = sum(bool(r.terminated_by) for r in results)
        line = (
            f"replay: {len(results)} runs, {intervened} with an intervention (correct or stronger), "
            f"{terminated} terminated; {len(detections)} detections"
        )
        if detections:
            kinds = ", ".join(
                f"{kind} {count} ("
                + ", ".join(f"{a} {by_pair[kind, a]}" for a in ACTIONS if by_pair[kind, a])
                + ")"
                for kind, count in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0]))
            )
            actions = ", ".join(f"{a} {by_action[a]}" for a in ACTIONS if by_action[a])
            line += f": {kinds}; by action: {actions}"
        if data.duplicates:
            line += f"; {data.duplicates} duplicate events skipped"
        return line
