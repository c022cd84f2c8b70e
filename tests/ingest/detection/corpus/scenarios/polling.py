"""Polling: loops that poll a stuck job past its budget, and legitimate polls that end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.ingest.detection.corpus.builder import POLL_LOOP_LABEL, Run, loop, ok


def job_status(job_id: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "status": status, **extra}


def _polls(
    r: Run,
    job: str,
    count: int,
    result: Callable[[int], Any],
    *,
    wait: tuple[float, float],
    text: Callable[[int], str | None] | None = None,
    stuck: bool = False,
) -> None:
    """Poll the job `count` times, sleeping `wait` seconds between polls; `result(i)` answers poll i.

    A stuck job's label point: poll R+1 when the run declares max_same_tool_retries=R (R re-polls
    spent), else the POLL_LOOP_LABEL-th identical poll.
    """
    label_at = None
    if stuck:
        declared = (r.scenario.budgets or {}).get("max_same_tool_retries")
        label_at = declared + 1 if declared else POLL_LOOP_LABEL
    for i in range(1, count + 1):
        if i > 1:
            r.advance(*wait)  # the agent sleeps between polls; the result is drawn after the sleep
        r.step(
            "get_job_status", {"job_id": job}, result(i), text=text(i) if text else None, label=i == label_at
        )


@loop(
    "poll_budget",
    "poll_stuck_past_declared_budget",
    "report-bot",
    "report_export",
    "gpt-4o",
    budgets={"max_same_tool_retries": 10},
)
def loop_poll_declared_budget(r: Run) -> None:
    """Export job stays RUNNING at 42% for 32 polls; max_same_tool_retries=10 is spent at poll 11."""
    r.user("Export all 2025 invoices as CSV and send me the link.")
    r.step(
        "start_export",
        {"dataset": "invoices", "year": 2025, "format": "csv"},
        {"job_id": "exp_7Qk2m", "status": "QUEUED"},
    )
    _polls(
        r,
        "exp_7Qk2m",
        32,
        lambda i: job_status("exp_7Qk2m", "RUNNING", progress=0.42, rows_written=1_204_000),
        wait=(18, 22),
        stuck=True,
        text=lambda i: "The export is still running; I'll check again shortly." if i % 4 == 1 else None,
    )
    r.finish("truncated", terminated_by="budget", budget_type="max_same_tool_retries")


@loop("poll_budget", "poll_stuck_running_long", "pipeline-operator", "data_pipeline", "claude-3-5-haiku")
def loop_poll_running_forever(r: Run) -> None:
    """A data pipeline job reports the identical RUNNING status for 40 polls over ~13 minutes."""
    r.user("Re-run yesterday's sales aggregation and tell me when the dashboard is updated.")
    r.step(
        "start_export",
        {"pipeline": "sales_daily_agg", "date": "2026-03-09"},
        {"job_id": "run-20260310-0017", "status": "SUBMITTED"},
    )
    _polls(
        r,
        "run-20260310-0017",
        40,
        lambda i: job_status("run-20260310-0017", "RUNNING", stage="aggregate"),
        wait=(15, 25),
        stuck=True,
    )
    r.finish("abandoned", terminated_by="user", reason="operator cancelled the run")


@loop("poll_budget", "poll_stuck_noisy_result", "release-bot", "default", "deepseek-chat")
def loop_poll_result_noise(r: Run) -> None:
    """Build status frozen at RUNNING 67% for 36 polls; only checked_at/request_id in the result change."""
    r.user("Kick off the release build for v3.2.0 and tell me when it's done.")
    r.step(
        "start_export",
        {"pipeline": "release", "ref": "v3.2.0"},
        {"job_id": "build-88213", "status": "PENDING"},
    )
    _polls(
        r,
        "build-88213",
        36,
        lambda i: job_status(
            "build-88213",
            "RUNNING",
            progress=0.67,
            step="integration-tests",
            checked_at=r.later(2.5),
            request_id=r.req_id(),
        ),
        wait=(10, 16),
        stuck=True,
    )
    r.finish("truncated", terminated_by="loop")


@ok("polling_ends", "report-bot", "report_export", "gpt-4o")
def ok_polling_ends_progress(r: Run) -> None:
    """Export job polled 10 times with rising progress, then SUCCEEDED; the agent sends the link."""
    r.user("Export Q4 2025 orders to CSV.")
    r.step(
        "start_export",
        {"dataset": "orders", "from": "2025-10-01", "to": "2025-12-31", "format": "csv"},
        {"job_id": "exp_41Ld9", "status": "QUEUED"},
    )
    progress = [0.05, 0.14, 0.27, 0.38, 0.51, 0.63, 0.74, 0.86, 0.95]
    _polls(
        r,
        "exp_41Ld9",
        10,
        lambda i: (
            job_status(
                "exp_41Ld9",
                "RUNNING",
                progress=progress[i - 1],
                rows_written=int(progress[i - 1] * 2_410_000),
            )
            if i <= 9
            else job_status(
                "exp_41Ld9",
                "SUCCEEDED",
                progress=1.0,
                rows_written=2_410_000,
                url="https://files.example.com/exp_41Ld9.csv.gz",
            )
        ),
        wait=(12, 18),
        text=lambda i: "Still running, checking again shortly." if i in (2, 5, 8) else None,
    )
    r.finish("succeeded", answer="Done: https://files.example.com/exp_41Ld9.csv.gz (2.41M rows).")


@ok("polling_identical_short", "pipeline-operator", "data_pipeline", "claude-sonnet-4-5")
def ok_polling_identical_then_done(r: Run) -> None:
    """Job status is the identical RUNNING 6 times (about 2 minutes), then SUCCEEDED."""
    r.user("Refresh the customer segments table and let me know when it's ready.")
    r.step("start_export", {"pipeline": "segments_refresh"}, {"job_id": "seg-5521", "status": "SUBMITTED"})
    _polls(
        r,
        "seg-5521",
        7,
        lambda i: (
            job_status("seg-5521", "RUNNING")
            if i <= 6
            else job_status("seg-5521", "SUCCEEDED", finished_at="2026-03-10T10:14:03Z", rows=88213)
        ),
        wait=(17, 22),
        text=lambda i: "The job is still running; I'll check again in about 20 seconds." if i > 1 else None,
    )
    r.finish("succeeded", answer="The customer segments table has been refreshed (88,213 rows).")


@ok(
    "polling_identical_inside_budget",
    "release-bot",
    "deploy",
    "deepseek-chat",
    budgets={"max_same_tool_retries": 8},
)
def ok_polling_inside_declared_budget(r: Run) -> None:
    """6 identical RUNNING polls, SUCCEEDED at poll 7: inside max_same_tool_retries=8 whether the engine
    counts re-polls (6) or calls (7).
    """
    r.user("Deploy build 88190 to staging and confirm it's healthy.")
    r.step(
        "start_export",
        {"pipeline": "deploy", "build": 88190, "env": "staging"},
        {"job_id": "dep-3391", "status": "PENDING"},
    )
    _polls(
        r,
        "dep-3391",
        7,
        lambda i: (
            job_status("dep-3391", "RUNNING", phase="rollout")
            if i < 7
            else job_status("dep-3391", "SUCCEEDED", phase="done", healthy_pods=6)
        ),
        wait=(14, 18),
    )
    r.finish("succeeded", answer="Build 88190 is live on staging; 6/6 pods healthy.")


@ok("polling_ends_failed", "pipeline-operator", "data_pipeline", "qwen2.5-32b-instruct")
def ok_polling_job_fails(r: Run) -> None:
    """A job goes QUEUED -> RUNNING -> FAILED; the agent stops polling and reads the logs."""
    r.user("Run the monthly billing reconciliation.")
    r.step(
        "start_export",
        {"pipeline": "billing_recon", "month": "2026-02"},
        {"job_id": "rec-0211", "status": "QUEUED"},
    )
    states = [("QUEUED", None), ("RUNNING", 0.2), ("RUNNING", 0.55), ("RUNNING", 0.71), ("FAILED", 0.71)]
    _polls(
        r,
        "rec-0211",
        5,
        lambda i: job_status("rec-0211", states[i - 1][0], progress=states[i - 1][1]),
        wait=(20, 30),
    )
    r.step(
        "get_job_logs",
        {"job_id": "rec-0211", "tail": 50},
        {
            "lines": [
                "ERROR ledger mismatch on account 4410: expected 1290.00 got 1209.00",
                "FATAL reconciliation aborted",
            ]
        },
    )
    r.finish(
        "succeeded", answer="The reconciliation failed: ledger mismatch on account 4410 (1290.00 vs 1209.00)."
    )


@ok("polling_ends", "ml-ops", "training", "gpt-4.1-mini")
def ok_polling_queue_position(r: Run) -> None:
    """12 polls: queue position 9,7,4,2,1 then RUNNING with progress, then SUCCEEDED."""
    r.user("Fine-tune the ticket classifier on the March data.")
    r.step(
        "start_export",
        {"pipeline": "finetune", "dataset": "tickets-2026-03", "base": "clf-v7"},
        {"job_id": "ft-90031", "status": "QUEUED", "queue_position": 11},
    )
    seq = [("QUEUED", {"queue_position": q}) for q in (9, 7, 4, 2, 1)]
    seq += [
        ("RUNNING", {"epoch": e, "loss": loss})
        for e, loss in ((1, 0.91), (1, 0.74), (2, 0.52), (2, 0.47), (3, 0.41), (3, 0.39))
    ]
    seq += [("SUCCEEDED", {"model": "clf-v8", "eval_f1": 0.912})]
    _polls(r, "ft-90031", 12, lambda i: job_status("ft-90031", seq[i - 1][0], **seq[i - 1][1]), wait=(20, 30))
    r.finish("succeeded", answer="Fine-tuning finished: clf-v8, F1 0.912.")


@ok("polling_with_wait_tool", "report-bot", "report_export", "claude-3-5-haiku")
def ok_polling_with_wait_tool(r: Run) -> None:
    """wait(30) and get_job_status alternate 6 times: wait's result never changes, the status does."""
    r.user("Generate the February board report PDF.")
    r.step(
        "start_export",
        {"report": "board", "month": "2026-02", "format": "pdf"},
        {"job_id": "rep-2202", "status": "QUEUED"},
    )
    states = ["QUEUED", "RENDERING_CHARTS", "RENDERING_TABLES", "RENDERING_TABLES", "ASSEMBLING", "SUCCEEDED"]
    for i, s in enumerate(states):
        r.step("wait", {"seconds": 30}, {"waited_s": 30}, latency=30.0)
        extra = (
            {"url": "https://files.example.com/board-2026-02.pdf"}
            if s == "SUCCEEDED"
            else {"pages_done": i * 6}
        )
        r.step("get_job_status", {"job_id": "rep-2202"}, job_status("rep-2202", s, **extra))
    r.finish("succeeded", answer="The board report is ready: https://files.example.com/board-2026-02.pdf")
