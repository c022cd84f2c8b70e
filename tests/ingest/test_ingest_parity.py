"""The two ways ingest stores a batch give the same rows, both run on PostgreSQL over the same input.

On PostgreSQL a batch is stored with statements of its own, one for all the batch's runs
(ingest.services.ingestion._store_set); elsewhere (SQLite, the embedded mode) through the ORM
(_store_orm). Here the same batches go once through each, to two tenants, each batch followed by
the detection pass that counts the rest of the runs' figures, and every run's figures, cursor and
events must come out the same.
"""

from __future__ import annotations

import random

import pytest

from ingest.models import Backend, Event, ModelPrice, Run, RunCursor
from ingest.services import RUN_FIGURES, events_ingest, ingestion, runs_process, tenant_get_or_create

pytestmark = pytest.mark.django_db

RUNS = [f"run-{n}" for n in range(30)]
STATUSES = ("ok", "ok", "ok", "error", "timeout")


def _ts(rng: random.Random, second: int) -> str:
    # Mostly in order, some late (an earlier ts stored after a later one), some with an offset.
    second = max(0, second - rng.choice((0, 0, 0, 0, 7)))
    if rng.random() < 0.2:
        return f"2026-11-29T12:{second // 60 % 60:02d}:{second % 60:02d}.{rng.randrange(10**6):06d}+02:00"
    return f"2026-11-29T10:{second // 60 % 60:02d}:{second % 60:02d}.{rng.randrange(10**6):06d}Z"


def _batches(seed: int) -> list[list[dict]]:
    """Batches over 30 runs: runs that start in one batch and go on in the next, run_started twice
    (fields given once each), rounds with and without a cost (priced from the table, or free),
    tool errors, finishes, events without an event_id, events sent again (in the same batch and
    in a later one)."""
    rng = random.Random(seed)
    sent: list[dict] = []
    batches = []
    second = 0
    for b in range(6):
        batch: list[dict] = []
        for run_id in rng.sample(RUNS, 12 if b % 2 else 30):
            second += 1
            roll = rng.random()
            base = {"run_id": run_id, "ts": _ts(rng, second)}
            if rng.random() < 0.8:
                base["event_id"] = f"{run_id}-{b}-{len(batch)}"
            if roll < 0.1:
                event = {
                    **base,
                    "type": "run_started",
                    **rng.choice(
                        (
                            {"agent": "shop", "backend": "openai", "model": "gpt-4o"},
                            {"task_type": "refund", "budgets": {"max_rounds": 9}, "labels": {"v": "2"}},
                            {"backend": "vllm", "model": "llama", "agent": "ops"},
                        )
                    ),
                }
            elif roll < 0.45:
                event = {
                    **base,
                    "type": "model_round",
                    "round": rng.randint(1, 9),
                    "input_tokens": rng.randint(0, 5000),
                    "output_tokens": rng.randint(0, 500),
                }
                if rng.random() < 0.4:
                    event["cost_usd"] = rng.choice((0.1, 0.2, 0.3, 1e-7, 0.0123))
            elif roll < 0.65:
                event = {
                    **base,
                    "type": "tool_call",
                    "round": 1,
                    "call_id": f"c{second}",
                    "tool": "t",
                    "args": {},
                }
            elif roll < 0.9:
                event = {
                    **base,
                    "type": "tool_result",
                    "call_id": f"c{second - 1}",
                    "status": rng.choice(STATUSES),
                }
            else:
                event = {
                    **base,
                    "type": "run_finished",
                    "status": rng.choice(("succeeded", "failed")),
                    **rng.choice(
                        ({}, {"reason": "done", "terminated_by": "budget", "budget_type": "rounds"})
                    ),
                }
            batch.append(event)
        # Sent again: an event of this batch and events of earlier ones (stored duplicates).
        batch.append(dict(rng.choice([e for e in batch if "event_id" in e])))
        batch.extend(dict(e) for e in rng.sample(sent, min(3, len(sent))) if "event_id" in e)
        sent.extend(batch)
        batches.append(batch)
    return batches


def _store(monkeypatch, tenant, batches: list[list[dict]], *, set_based: bool) -> list[dict]:
    monkeypatch.setattr(ingestion, "_set_based", lambda: set_based)
    results = []
    for n, batch in enumerate(batches):
        result = events_ingest(
            tenant=tenant, events=[dict(e) for e in batch], max_event_bytes=1 << 20, ledger_scope=n % 3 != 1
        )
        results.append(result.as_dict())
        # The figures ingest leaves to detection are counted by its pass, as a worker would (its
        # own path: the storage parity tests compare those).
        runs_process(run_pks=result.runs_touched)
    return results


def _rows(tenant) -> dict[str, tuple]:
    runs = {}
    for run in Run.objects.filter(tenant=tenant).order_by("run_id"):
        figures = tuple(getattr(run, name) for name in RUN_FIGURES)
        events = tuple(
            Event.objects.filter(run=run).order_by("seq").values_list("seq", "event_id", "type", "ts", "body")
        )
        runs[run.run_id] = (figures, RunCursor.objects.filter(run=run).exists(), events)
    return runs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_set_based_and_orm_paths_store_the_same_rows(needs_postgres, monkeypatch, seed):
    openai, _ = Backend.objects.get_or_create(name="openai", defaults={"markup": "1.300"})
    ModelPrice.objects.get_or_create(
        backend=openai, model="gpt-4o", defaults={"input_usd_per_mtok": 2.5, "output_usd_per_mtok": 10}
    )
    ModelPrice.objects.get_or_create(
        backend=openai, model="", defaults={"input_usd_per_mtok": 0.7, "output_usd_per_mtok": 1.1}
    )
    batches = _batches(seed)
    set_tenant = tenant_get_or_create(slug="by-set")
    orm_tenant = tenant_get_or_create(slug="by-orm")

    set_verdicts = _store(monkeypatch, set_tenant, batches, set_based=True)
    orm_verdicts = _store(monkeypatch, orm_tenant, batches, set_based=False)

    assert set_verdicts == orm_verdicts
    duplicates = sum(v["duplicate"] for v in set_verdicts)
    assert duplicates >= len(batches)  # the input sends events again, in the batch and later
    set_rows, orm_rows = _rows(set_tenant), _rows(orm_tenant)
    assert set(set_rows) == set(RUNS)
    for run_id in RUNS:
        assert set_rows[run_id] == orm_rows[run_id], run_id
    # The input exercises what the paths merge differently: descriptions, prices, the unverified seq.
    figures = {name: [set_rows[r][0][RUN_FIGURES.index(name)] for r in RUNS] for name in RUN_FIGURES}
    assert any(status != "running" for status in figures["status"])
    assert "vllm" in figures["backend"] and "openai" in figures["backend"]
    assert any(seq is not None for seq in figures["unverified_from_seq"])
    assert any(cost and cost != round(cost, 4) for cost in figures["cost_usd"])  # priced from the table
