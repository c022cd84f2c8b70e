"""Generate the labelled loop-detection corpus (one run per JSON Lines file, beside this module).

Run it from the repository root and commit what it writes:

    .venv/bin/python -m tests.ingest.detection.corpus.make_corpus [OUTPUT_DIR]

The runs are declared in `scenarios/` (one module per family) and built by `builder.py`.
Deterministic: stdlib only, one `random.Random` per run seeded from the run's name, no clock, no
Django. Every run carries its label in `run_started.labels` (see README.md, which this module writes
too): `expect` (loop|ok), `loop_kind`, `intervene_by_call` or `intervene_by_round`, `pattern`, `note`.
The scenarios are written from the detection issue's rules and from how real agents behave, not
from the engine's code.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from tests.ingest.detection.corpus.builder import LOOP_KINDS, Run
from tests.ingest.detection.corpus.scenarios import scenarios_all

HERE = Path(__file__).resolve().parent

README_HEAD = """\
# Loop-detection corpus

One agent run per `<name>.jsonl` file (JSON Lines, trace events v1 — see
[docs/trace-events.md](../../../../docs/trace-events.md)), written by `make_corpus.py`; do not edit the
files by hand. Each run is a short play function in `scenarios/` (one module per family: exact repeats,
oscillation, interval loops, perturbation, errors, conversation, no progress, polling, duplicate writes,
budgets, and the legitimate runs by family), declared with `@loop(...)` or `@ok(...)`; its docstring is
its `note`. `builder.py` turns what the scenario does into events. Regenerate from the repository root
with

    .venv/bin/python -m tests.ingest.detection.corpus.make_corpus [OUTPUT_DIR]

(deterministic: each run draws its noise from its own RNG seeded with its name, so the same scenarios
write the same bytes and editing one changes no other run). `tests/ingest/detection/test_corpus_files.py`
checks that every file parses, every event validates, every run is labelled and the files are what the
generator writes.

## Labels (`run_started.labels`, all strings)

| label | meaning |
|---|---|
| `expect` | `loop`: an intervention (a correction hint or anything stronger: hand-off, stop) must happen by the label point. `ok`: legitimate; **no** intervention of any strength may happen anywhere in the run. |
| `loop_kind` | loops only: `exact_repeat`, `oscillation`, `interval_loop`, `perturbation`, `repeated_error`, `clarification`, `monologue`, `empty_responses`, `no_progress`, `poll_budget`, `duplicate_write`, `budget`. It says what the scenario is built around; a detection of any kind that is on time counts. |
| `intervene_by_call` | loops labelled by tool call: **N = 1-based index of a tool call, counting only this run's `tool_call` events in stream order** (the calls of a parallel batch count one by one, in the order they appear). The intervention is on time when **at most N `tool_call` events have been seen** when it fires: at call N itself, after call N's `tool_result`, or anywhere before the (N+1)-th `tool_call` event. A detection that fires after the result of call N counts as "at call N". |
| `intervene_by_round` | loops in model output only (clarification, monologue, empty responses) and round/token/cost budgets: **N = the `round` of a `model_round` event**. On time when at most N `model_round` events have been seen when the intervention fires (i.e. before model round N+1 arrives). |
| `pattern` | short scenario name (several runs may share one). |
| `note` | one sentence on what the run is. |

Every loop keeps looping (or at least makes one more call/round) after its label point, so a late
detector is caught; it then ends truncated, abandoned, failed, or succeeds after the user steps in.

### Where the label point is put, per kind

| kind | label point |
|---|---|
| exact_repeat | the 3rd consecutive identical read (same canonical signature, unchanged result). Identical parallel batches in consecutive rounds count by round: the last call of the 3rd identical batch. One run (`loop_repeat_result_noise`) has noise in the *result* too and gets +2 slack. |
| oscillation | the call that completes the 3rd full cycle (A-B: 6th call of the pattern; A-B-C: 9th). |
| interval_loop | the returning action's first return with only repeated results since its previous occurrence (and at least its 3rd occurrence), **+2 calls** of slack. |
| perturbation | the 3rd nearly-equal call without new information, **+2 calls** (= the 5th call of the perturbed sequence). |
| repeated_error | non-retryable classes (`invalid_argument`, `permission`, `not_found`, `empty_result`, `parse_error`): **the call that produced the 2nd identical failure** (the detector sees that result and corrects; under the counting rule above that is "at" the 2nd attempt). Retryable classes (`transient`, `rate_limited`, quota 2): the 4th attempt (quota + 2, the same rule with a quota of 2 instead of 0). |
| clarification, monologue | the round of the 2nd asking/announcement when it is word for word (modulo whitespace/case), the 3rd when it is paraphrased. |
| empty_responses | the 3rd empty model response in a row (no text, `""` or whitespace only; no tool call). |
| no_progress | K = 10 assumed for non-polling task types: the 10th consecutive call without progress **+2** (= the 12th call of the stall). |
| poll_budget | with `budgets.max_same_tool_retries = R` declared: poll R+1 (R re-polls consumed). Without a declared budget: the 20th identical poll. Legitimate polling in this corpus stays at ≤ 6 identical polls in a row, ≤ 12 polls in all and ≤ ~5 minutes; `ok_polling_inside_declared_budget` ends one poll inside its declared budget (7 polls = 6 re-polls, limit 8). |
| duplicate_write | the retried write itself: the 2nd call with the same idempotency key (`operation_key`, else `step_id`) after the first timed out. |
| budget | the call (`max_tool_calls`, `max_wall_s`: first call at or after the wall limit) or round (`max_rounds`, `max_tokens` = cumulative input+output tokens, `max_cost_usd` = cumulative `cost_usd`) at which consumption reaches the declared limit. |

Legitimate runs that are long (> 40 calls) declare generous budgets in `run_started.budgets` (200 calls,
150 rounds, 8M tokens, 30 USD, 2 h), as a task type for long work would; all other runs rely on defaults.

## Deliberately hard cases

Loops a naive detector misses:
`loop_repeat_get_order_request_id`, `loop_repeat_http_trace_uuid`, `loop_oscillate_web_noise`,
`loop_error_not_found_noise` (request_id / timestamp / nonce / UUID `trace_id` change every call);
`loop_repeat_search_key_order_whitespace`, `loop_repeat_sql_whitespace` (key order, whitespace,
100 vs 100.0 vs 100.00000001); `loop_repeat_parallel_batches` (identical only by round, never two identical
calls in a row); `loop_perturb_offset_jitter` (the offset moves, but only to hits already seen — subsets,
not identical results); `loop_repeat_result_noise` and `loop_poll_result_noise` (the *result* carries a
fresh `as_of`/`checked_at`/`request_id`; the meaningful fields never change); `loop_dup_write_email_same_key`
(new `step_id`, same `operation_key`); `loop_budget_tool_calls_parallel` (the limit falls mid-batch).

Legitimate runs a naive detector stops:
`ok_tail_log`, `ok_scroll_feed`, `ok_parallel_metrics_rounds` (identical calls, results change);
`ok_three_identical_tickets`, `ok_double_purchase_*` (identical writes, different keys);
`ok_polling_identical_then_done`, `ok_polling_inside_declared_budget` (identical RUNNING, ends in budget);
`ok_polling_with_wait_tool` (an identical `wait` call every other step); `ok_refine_converges`,
`ok_oscillation_results_change` (A-B-A-B whose results keep changing); `ok_paging_restart_after_filter`;
`ok_paging_offset_step1` (offset +1 each step, new item each time); `ok_uuid_document_ids` (a UUID under an
id-like key that is the real argument); `ok_noise_fields_distinct_reads`; `ok_single_retry_same_read`,
`ok_user_asks_twice` (the same read twice, not three times); `ok_retry_transient_twice` (two identical
transient failures within the quota); `ok_write_503_retry_same_key` (a write retried after a definite
error, not a timeout); `ok_announce_with_action`, `ok_polling_identical_then_done` (the same sentence every
round, but with a tool call each time); `ok_empty_then_recovers` (one empty response);
`ok_probe_missing_files`, `ok_different_errors_then_success` (errors that are not identical).

## Runs
"""


def build() -> list[Run]:
    """Play every scenario, in README order."""
    runs = []
    for scenario in scenarios_all():
        assert scenario.play is not None, scenario
        run = Run(scenario)
        scenario.play(run)
        run.finalize()
        runs.append(run)
    names = [run.name for run in runs]
    assert len(names) == len(set(names)), "two scenarios share a name"
    return runs


def readme(runs: list[Run]) -> str:
    loops = [run for run in runs if run.scenario.expect == "loop"]
    oks = [run for run in runs if run.scenario.expect == "ok"]
    out = [README_HEAD, f"{len(runs)} runs: {len(loops)} loops, {len(oks)} legitimate.\n"]
    counts = Counter(run.scenario.loop_kind for run in loops)
    out.append("Loops per kind: " + ", ".join(f"{k} {counts[k]}" for k in LOOP_KINDS) + ".\n")
    out.append("| file | expect | kind | label point | calls | rounds | backend | pattern | note |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for run in loops + oks:
        s = run.scenario
        point = ""
        if s.expect == "loop":
            point = f"call {run.by_call}" if run.by_call else f"round {run.by_round}"
        out.append(
            f"| `{run.name}.jsonl` | {s.expect} | {s.loop_kind or ''} | {point} | {run.calls} | {run.rounds} "
            f"| {run.backend} | `{s.pattern}` | {s.note} |"
        )
    return "\n".join(out) + "\n"


def write(out_dir: Path) -> list[str]:
    """Write one `<name>.jsonl` per run and the README into out_dir; remove runs no scenario declares."""
    runs = build()
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {f"{run.name}.jsonl" for run in runs}
    for stale in out_dir.glob("*.jsonl"):
        if stale.name not in wanted:
            stale.unlink()
    for run in runs:
        text = "".join(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n" for e in run.events)
        (out_dir / f"{run.name}.jsonl").write_text(text, encoding="utf-8")
    (out_dir / "README.md").write_text(readme(runs), encoding="utf-8")
    return sorted(wanted)


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else HERE
    files = write(out_dir)
    print(f"wrote {len(files)} runs to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
