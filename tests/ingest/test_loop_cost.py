"""Money burned in a loop: Run.cost_after_loop_usd, the rounds after the first intervention."""

from __future__ import annotations

import pytest
from django.db.models import Sum

from ingest.models import Backend, Detection, ModelPrice, ModelRound, Run
from ingest.services import run_reprocess
from tests.ingest.events import model_round, run_started, tool_call, tool_result

URL = "/api/v1/events"
pytestmark = pytest.mark.django_db


def _repeats(n: int, start: int = 1, cost: float | None = 1.0) -> list[dict]:
    """n rounds of the same call; the 3rd call in a row is an exact repeat (correct)."""
    events = []
    for i in range(start, start + n):
        priced = {} if cost is None else {"cost_usd": cost}
        events += [
            model_round("r1", n=i, **priced),
            tool_call("r1", f"c{i}", n=i, args={"customer": "42"}),
            tool_result("r1", f"c{i}", n=i, result={"orders": []}),
        ]
    return events


@pytest.fixture
def key(tenant, make_key):
    return make_key(tenant)


def _first_intervention() -> Detection:
    return Detection.objects.exclude(action="observe").order_by("seq").first()


def test_rounds_after_the_first_intervention_are_burned(api, key):
    # run_started is seq 1; call i is seq 3i, its round 3i - 1: the 3rd call (seq 9) fires.
    api.post(URL, [run_started(), *_repeats(5)], key)
    run = Run.objects.get()
    first = _first_intervention()
    assert (first.seq, first.action) == (9, "correct")
    assert (first.backend, first.task_type, first.agent) == ("openai", "order_lookup", "shop")  # the run's
    assert run.first_loop_seq == 9
    assert run.cost_after_loop_usd == pytest.approx(2.0)  # rounds 4 and 5, not the 3 before
    assert run.cost_usd == pytest.approx(5.0)


def test_rounds_sent_in_later_batches_are_added(api, key):
    api.post(URL, [run_started(), *_repeats(3)], key)
    run = Run.objects.get()
    assert (run.first_loop_seq, run.cost_after_loop_usd) == (9, 0)  # the loop, nothing after it yet
    api.post(URL, _repeats(2, start=4, cost=0.25), key)
    api.post(URL, [model_round("r1", n=6, cost_usd=0.5)], key)
    run.refresh_from_db()
    assert run.first_loop_seq == 9
    assert run.cost_after_loop_usd == pytest.approx(0.25 * 2 + 0.5)


def test_a_run_without_a_loop_burns_nothing(api, key):
    events = [run_started()]
    for i in range(1, 6):
        events += [
            model_round("r1", n=i, cost_usd=1.0),
            tool_call("r1", f"c{i}", n=i, args={"customer": str(i)}),
            tool_result("r1", f"c{i}", n=i, result={"orders": [i]}),
        ]
    api.post(URL, events, key)
    run = Run.objects.get()
    assert not Detection.objects.exclude(action="observe").exists()
    assert (run.first_loop_seq, run.cost_after_loop_usd, run.cost_usd) == (None, 0, pytest.approx(5.0))


def test_processing_a_run_again_counts_each_round_once(api, key):
    api.post(URL, [run_started(), *_repeats(3)], key)
    api.post(URL, _repeats(3, start=4), key)
    before = Run.objects.get().cost_after_loop_usd
    assert before == pytest.approx(3.0)
    run_reprocess(run_pk=Run.objects.get().pk)
    assert Run.objects.get().cost_after_loop_usd == pytest.approx(before)


def test_priced_rounds_burn_what_their_rounds_cost(api, key):
    backend = Backend.objects.create(name="openai", markup=1.3)
    ModelPrice.objects.create(backend=backend, model="gpt-4o", input_usd_per_mtok=2.5, output_usd_per_mtok=10)
    api.post(URL, [run_started(), *_repeats(2, cost=None)], key)
    api.post(URL, _repeats(4, start=3, cost=None), key)
    run = Run.objects.get()
    after = ModelRound.objects.filter(run=run, seq__gt=run.first_loop_seq).aggregate(s=Sum("cost_usd"))["s"]
    # 1000 input and 100 output tokens a round: (1000 * 2.5 + 100 * 10) / 1e6 * 1.3
    assert after == pytest.approx(3 * 0.00455)
    assert run.cost_after_loop_usd == pytest.approx(after)
