"""The scenarios: ordinary runs, the loops loopwatch detects, legitimate repetition it must leave
alone, budget truncations and writes that time out. Each is a function
`(rng, start, *, run_prefix) -> list[Event]` giving one run's events in sending order."""

from __future__ import annotations

import dataclasses
import math
import random
import string
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal

from demo.simulation.catalogue import AGENTS, TASK_TYPES, rounds_sample
from demo.simulation.content import DOMAINS, ORDER_STATUS_SYNONYMS
from demo.simulation.plans import Step
from demo.simulation.runs import Event, RunBuilder


def _begin(
    rng: random.Random,
    start: datetime,
    scenario: str,
    expect: str,
    task_types: Sequence[str],
    run_prefix: str,
    *,
    exclude_backends: Sequence[str] = (),
    reports_cost: bool | None = None,
    ask: bool = True,
) -> RunBuilder:
    task_type = rng.choices(list(task_types), weights=[TASK_TYPES[t] for t in task_types])[0]
    agents = [a for a in AGENTS if task_type in a.task_types and a.backend not in exclude_backends]
    agent = rng.choice(agents)
    run = RunBuilder(
        rng,
        start,
        scenario=scenario,
        expect=expect,
        task_type=task_type,
        agent=agent,
        run_prefix=run_prefix,
        reports_cost=reports_cost,
    )
    if ask:
        run.user(run.plan.prompt)
    return run


def _end_loop(run: RunBuilder, *, repeats: int, tool: str, retries: int | None = None) -> list[Event]:
    """How a runtime ends a run stuck in a loop: a budget, its own guard, or the user leaves.

    `repeats` calls made up the loop; `retries` is how many of them repeated one tool
    (default repeats - 1).
    """
    rng = run.rng
    how = rng.choices(("budget", "guard", "user"), weights=(50, 30, 20))[0]
    if how == "budget":
        budget_type = rng.choice(("max_tool_calls", "max_same_tool_retries", "max_rounds"))
        limit = {
            "max_tool_calls": run.tool_calls,
            "max_rounds": run.round,
            "max_same_tool_retries": retries if retries is not None else repeats - 1,
        }[budget_type]
        run.declare_budgets(hit=budget_type, limit=limit)
        return run.finish(
            "truncated",
            terminated_by="budget",
            budget_type=budget_type,
            reason=f"{budget_type} exhausted ({limit}/{limit}). No progress in the last {repeats} tool calls.",
        )
    if rng.random() < 0.5:
        run.declare_budgets()
    if how == "guard":
        return run.finish(
            "failed",
            terminated_by="loop",
            reason=f"runtime loop guard: {tool} {repeats} times without new information",
        )
    run.wait(rng.uniform(60, 900))
    return run.finish("abandoned", terminated_by="user", reason="the user closed the conversation")


# --- scenarios: ordinary runs ------------------------------------------------------------------


def scenario_normal(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """A successful run of any task type; its round count comes from the task type's distribution."""
    run = _begin(rng, start, "normal", "ok", list(TASK_TYPES), run_prefix)
    run.work(rounds_sample(rng, run.task_type) - 1)
    run.answer(run.plan.answer)
    if rng.random() < 0.4:
        run.declare_budgets()
    return run.finish("succeeded")


def scenario_failed_permission(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """A write refused by the downstream system: the run fails once, no repetition."""
    run = _begin(rng, start, "failed_permission", "ok", ("refund", "purchase"), run_prefix)
    run.warmup(rng.randint(1, 2))
    write = run.plan.writes[0]
    refused = Step(
        write.tool,
        write.args,
        {
            "error": "403 Forbidden: this agent's role may not do this above 100 EUR; a supervisor must approve"
        },
        kind="write",
        status="error",
        error_class="permission",
        step_id=write.step_id,
        operation_key=write.operation_key,
    )
    run.step(refused)
    run.answer(
        "I'm not allowed to complete this myself; I've passed your request to a colleague who can approve it."
    )
    return run.finish("failed", terminated_by="error", reason=f"permission denied on {write.tool}")


def scenario_user_abandoned(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """One clarification question the user never answers: abandoned, but not a loop."""
    run = _begin(rng, start, "user_abandoned", "ok", ("order_lookup", "refund", "purchase"), run_prefix)
    run.warmup(rng.randint(0, 2))
    run.think(text="Could you confirm which delivery address you'd like me to use?")
    run.wait(rng.uniform(1800, 3600))
    return run.finish("abandoned", terminated_by="user", reason="no reply from the user for 30 minutes")


# --- scenarios: loops --------------------------------------------------------------------------


def scenario_loop_exact_repeat(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """The same read with the same arguments and the same result, round after round."""
    run = _begin(
        rng, start, "loop_exact_repeat", "loop", ("order_lookup", "refund", "research", "faq"), run_prefix
    )
    run.warmup(rng.randint(0, 2))
    step = run.next_read()
    repeats = rng.randint(4, 10)
    for _ in range(repeats):
        run.step(step)
    return _end_loop(run, repeats=repeats, tool=step.tool)


def scenario_loop_oscillation(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """A→B→A→B: two reads alternate, each giving the same answer every time."""
    run = _begin(
        rng, start, "loop_oscillation", "loop", ("order_lookup", "refund", "research", "faq"), run_prefix
    )
    first, second = run.plan.reads[-2], run.plan.reads[-1]
    run.plan.reads = run.plan.reads[:-2]
    run.warmup(min(len(run.plan.reads), rng.randint(0, 2)))
    cycles = rng.randint(3, 6)
    for _ in range(cycles):
        run.step(first)
        run.step(second)
    return _end_loop(run, repeats=cycles * 2, tool=f"{first.tool}/{second.tool}", retries=cycles - 1)


JitterStyle = Literal["offset", "synonyms", "case_whitespace"]
JITTER_STYLES: tuple[JitterStyle, ...] = ("offset", "synonyms", "case_whitespace")

# Changes a normaliser (case-fold, collapse whitespace) undoes.
_CASE_WHITESPACE: tuple[Callable[[str], str], ...] = (
    str.upper,
    str.title,
    str.capitalize,
    lambda s: f" {s}",
    lambda s: f"{s}  ",
    lambda s: s.replace(" ", "  "),
)


def _distinct_sequence(rng: random.Random, first: Any, pick: Callable[[], Any], n: int) -> list[Any]:
    """n values starting with `first`, no two neighbours equal."""
    values = [first]
    while len(values) < n:
        value = pick()
        if value != values[-1]:
            values.append(value)
    return values


def _jitter_target(
    run: RunBuilder, style: JitterStyle, n: int
) -> tuple[str, dict[str, Any], str, list[Any], Any]:
    """(tool, its arguments, the one argument to jitter, that argument's values, the one result they all get)."""
    rng, ctx = run.rng, run.plan.ctx
    if run.task_type in ("faq", "research"):
        if run.task_type == "faq":
            tool, text, result = "search_kb", ctx["query"], {"hits": ctx["hits"]}
        else:
            tool, text = "web_search", ctx["topic"]
            result = {"results": ctx["results"], "total": rng.randint(200, 90_000)}
        args: dict[str, Any] = {"query": text, "offset": 0}
        text_key, synonyms = "query", ctx["synonyms"]
    elif style == "case_whitespace":
        customer = ctx["customer"]
        tool, args, result = "get_customer", {"email": customer["email"]}, customer
        text_key, synonyms = "email", ()
    else:
        order = ctx["order"]
        tool, result = (
            "search_orders",
            {"orders": [{"order_id": order["order_id"], "placed": order["placed"]}]},
        )
        args = {"customer_id": ctx["customer"]["customer_id"], "status": "open", "offset": 0, "limit": 20}
        text_key, synonyms = "status", ORDER_STATUS_SYNONYMS[1:]
    if style == "offset":
        key, origin = "offset", rng.choice((10, 20, 40))
        values = _distinct_sequence(rng, origin, lambda: origin + rng.choice((-1, 0, 1)), n)
    elif style == "synonyms":
        key, base = text_key, args[text_key]
        values = _distinct_sequence(rng, base, lambda: rng.choice((base, *synonyms)), n)
    else:
        key, base = text_key, args[text_key]
        values = _distinct_sequence(rng, base, lambda: rng.choice(_CASE_WHITESPACE)(base), n)
    return tool, args, key, values, result


def scenario_loop_arg_jitter(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """The same read with an argument nudged (offset ±1, a synonym, case or spaces): nothing new comes back."""
    run = _begin(rng, start, "loop_arg_jitter", "loop", ("faq", "order_lookup", "research"), run_prefix)
    style = rng.choice(JITTER_STYLES)
    run.warmup(rng.randint(0, 2))
    calls = rng.randint(4, 9)
    tool, args, key, values, result = _jitter_target(run, style, calls)
    for value in values:
        run.step(Step(tool, {**args, key: value}, result))
    run.started["labels"]["sim_jitter"] = style
    return _end_loop(run, repeats=calls, tool=tool)


def scenario_loop_same_error(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """The same call failing with the same invalid_argument error, sent again verbatim."""
    run = _begin(
        rng, start, "loop_same_error", "loop", ("order_lookup", "refund", "faq", "research"), run_prefix
    )
    run.warmup(rng.randint(0, 2))
    if run.task_type == "faq":
        args, error = {"article_id": "returns-policy"}, "article_id: must look like KB-123"
        tool = "get_article"
    elif run.task_type == "research":
        args, error = {"url": f"www.{rng.choice(DOMAINS)}/report"}, "url: must start with http:// or https://"
        tool = "fetch_url"
    else:
        tool = "search_orders"
        args = {"customer_id": run.plan.ctx["customer"]["customer_id"], "placed_after": "last tuesday"}
        error = "placed_after: expected a date like 2026-11-24"
    failing = Step(tool, args, {"error": error}, status="error", error_class="invalid_argument")
    repeats = rng.randint(3, 8)
    for _ in range(repeats):
        run.step(failing)
    return _end_loop(run, repeats=repeats, tool=tool)


CLARIFICATIONS = {
    "order_lookup": ("Could you give me your order number? It starts with ORD-.", "It's {oid}."),
    "refund": ("Which order should I refund? Please share the order number.", "The order is {oid}."),
}
USER_INSISTS = (
    "I already told you: {oid}",
    "{oid}! As I said.",
    "Again: {oid}",
    "It is {oid}, please check.",
)


def scenario_loop_clarification(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """The agent asks the user the same question again although the user answered it."""
    run = _begin(rng, start, "loop_clarification", "loop", tuple(CLARIFICATIONS), run_prefix)
    question, first_answer = CLARIFICATIONS[run.task_type]
    oid = run.plan.ctx["order"]["order_id"]
    asked = rng.randint(3, 5)
    for i in range(asked):
        run.think(text=question)
        if i == 0:
            run.user(first_answer.format(oid=oid))
        elif i < asked - 1:
            run.user(rng.choice(USER_INSISTS).format(oid=oid))
    how = rng.choices(("user", "budget", "guard"), weights=(50, 30, 20))[0]
    if how == "budget":
        run.declare_budgets(hit="max_rounds", limit=run.round)
        return run.finish(
            "truncated",
            terminated_by="budget",
            budget_type="max_rounds",
            reason=f"max_rounds exhausted ({run.round}/{run.round}). The same question {asked} times.",
        )
    if how == "guard":
        return run.finish(
            "failed", terminated_by="loop", reason=f"the same question to the user {asked} times"
        )
    run.user("Forget it.")
    return run.finish("abandoned", terminated_by="user", reason="the user gave up")


def scenario_budget_exhausted(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """Busy but going nowhere: distinct calls until a budget (calls, rounds, cost, tokens) runs out."""
    budget_type = rng.choices(
        ("max_tool_calls", "max_rounds", "max_cost_usd", "max_tokens"), weights=(35, 25, 25, 15)
    )[0]
    costly = budget_type == "max_cost_usd"
    run = _begin(
        rng,
        start,
        "budget_exhausted",
        "budget",
        ("research", "refund", "order_lookup"),
        run_prefix,
        # A cost budget needs a priced backend, and rounds that say what they cost.
        exclude_backends=("local",) if costly else (),
        reports_cost=True if costly else None,
    )
    tool_rounds = rng.randint(12, 40)
    progress_until = rng.randint(3, tool_rounds // 2)
    for _ in range(tool_rounds):
        run.step(run.next_read())
    used = run.usage()[budget_type]
    if costly:
        limit: float = math.floor(used * 10_000) / 10_000 or round(used, 6)
        spent = f"{used:.4f} USD of {limit}"
    else:
        limit = int(used)
        spent = f"{limit}/{limit}"
    run.declare_budgets(hit=budget_type, limit=limit)
    return run.finish(
        "truncated",
        terminated_by="budget",
        budget_type=budget_type,
        reason=f"{budget_type} exhausted ({spent}). No progress in the last {tool_rounds - progress_until} tool calls.",
    )


# --- scenarios: legitimate repetition ------------------------------------------------------------


def scenario_legit_polling(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """Start a job, poll it while it is RUNNING, then SUCCEEDED: repeated calls, real progress."""
    run = _begin(rng, start, "legit_polling", "ok", ("research", "order_lookup", "refund"), run_prefix)
    run.warmup(rng.randint(0, 2))
    job_id = f"job_{run.token(12, string.ascii_lowercase + string.digits)}"
    run.step(
        Step(
            "start_export",
            {"dataset": f"{run.task_type}_history", "format": "csv"},
            {"job_id": job_id, "status": "QUEUED"},
            kind="write",
            step_id="start-export",
            operation_key=f"export:{run.run_id}",
        )
    )
    running = rng.randint(3, 12)
    # Half the jobs report no progress figure: the polls then return the very same RUNNING.
    with_progress = rng.random() < 0.5
    delay = 2.0
    for i in range(running + 1):
        run.wait(delay)
        delay = min(delay * 1.6, 30.0)
        if i < running:
            status: dict[str, Any] = {"job_id": job_id, "status": "RUNNING"}
            if with_progress:
                status["progress"] = round((i + 1) / (running + 1), 2)
        else:
            status = {
                "job_id": job_id,
                "status": "SUCCEEDED",
                "url": f"https://exports.example.com/{job_id}.csv",
            }
        run.think(output_tokens=rng.randint(15, 40))
        run.calls([Step("get_job_status", {"job_id": job_id}, status, kind="poll")], think=False)
    run.step(
        Step(
            "download_export",
            {"job_id": job_id},
            {"rows": rng.randint(100, 90_000), "bytes": rng.randint(10**4, 10**7)},
        )
    )
    run.answer(f"The export is ready: https://exports.example.com/{job_id}.csv")
    return run.finish("succeeded")


def scenario_legit_paging(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """The same list call, page after page with an advancing page number or cursor."""
    run = _begin(rng, start, "legit_paging", "ok", ("order_lookup", "refund", "purchase"), run_prefix)
    run.warmup(rng.randint(0, 1))
    pages = rng.randint(3, 9)
    by_cursor = rng.random() < 0.4
    customer = run.plan.ctx["customer"]
    cursor: str | None = None
    for page in range(1, pages + 1):
        items = [
            f"ORD-{rng.randint(100_000, 999_999)}" for _ in range(20 if page < pages else rng.randint(1, 20))
        ]
        last = page == pages
        if by_cursor:
            args: dict[str, Any] = {"customer_id": customer["customer_id"], "limit": 20}
            if cursor is not None:
                args["cursor"] = cursor
            cursor_next = None if last else run.token(16, string.ascii_letters + string.digits + "-_")
            result: dict[str, Any] = {"items": items, "next_cursor": cursor_next}
            cursor = cursor_next
        else:
            args = {"customer_id": customer["customer_id"], "page": page, "page_size": 20}
            result = {"orders": items, "page": page, "next_page": None if last else page + 1}
        run.step(Step("list_orders", args, result))
    run.answer(f"I went through all {pages} pages of your order history; nothing else is open.")
    return run.finish("succeeded")


def scenario_legit_double_purchase(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """The user asks for two of the same item: two identical writes, two steps, two operation keys."""
    run = _begin(rng, start, "legit_double_purchase", "ok", ("purchase",), run_prefix, ask=False)
    ctx = run.plan.ctx
    run.user(
        f"Please order two of the {ctx['name']} for me, as two separate orders: one is a gift. "
        f"I'm {ctx['customer']['email']}."
    )
    run.warmup(rng.randint(1, 2))
    base = run.plan.writes[0]
    orders = [
        Step(
            base.tool,
            base.args,
            {
                "order_id": f"ORD-{rng.randint(100_000, 999_999)}",
                "status": "confirmed",
                "total": ctx["price"],
            },
            kind="write",
            step_id=f"place-order-{n}",
            operation_key=f"{base.operation_key}:{n}",
            external_request_id=f"po_{run.token(16)}",
        )
        for n in (1, 2)
    ]
    if run.agent.parallel and rng.random() < 0.5:
        run.calls(orders)
    else:
        run.step(orders[0])
        run.step(orders[1])
    run.answer(f"Both orders are placed: {orders[0].result['order_id']} and {orders[1].result['order_id']}.")
    return run.finish("succeeded")


def scenario_legit_transient_retry(
    rng: random.Random, start: datetime, *, run_prefix: str = "sim"
) -> list[Event]:
    """A 503 (transient), a backoff, the same call again, and it works."""
    run = _begin(
        rng,
        start,
        "legit_transient_retry",
        "ok",
        ("order_lookup", "refund", "purchase", "research"),
        run_prefix,
    )
    run.warmup(rng.randint(0, 2))
    target = run.plan.writes[0] if run.plan.writes and rng.random() < 0.3 else run.next_read()
    if target in run.plan.writes:
        run.plan.writes.remove(target)
    failures = 1 if rng.random() < 0.7 else 2
    failed = Step(
        target.tool,
        target.args,
        {"error": "503 Service Unavailable", "retry_after_s": 2},
        kind=target.kind,
        status="error",
        error_class="transient",
        step_id=target.step_id,
        operation_key=target.operation_key,
    )
    # Half the time the runtime retries by itself within the round, under the model's call id;
    # otherwise the model sees the error and calls again in a new round.
    by_runtime = rng.random() < 0.5
    call_id = run.step(failed)
    for attempt in range(failures):
        run.wait(2 * 2**attempt + rng.uniform(0, 0.5))
        step = target if attempt == failures - 1 else failed
        if by_runtime:
            run.calls([dataclasses.replace(step, call_id=call_id)], think=False)
        else:
            run.step(step)
    run.work(rng.randint(0, 2))
    run.answer(run.plan.answer)
    return run.finish("succeeded")


def scenario_write_timeout(rng: random.Random, start: datetime, *, run_prefix: str = "sim") -> list[Event]:
    """A write times out: its outcome is UNKNOWN. The agent checks, gives up, or tells the user it is pending."""
    run = _begin(rng, start, "write_timeout", "unknown_write", ("refund", "purchase"), run_prefix)
    run.warmup(rng.randint(1, 2))
    write = run.plan.writes[0]
    request_id = f"req_{run.token(20)}" if rng.random() < 0.5 else None
    run.step(
        Step(
            write.tool,
            write.args,
            kind="write",
            status="timeout",
            step_id=write.step_id,
            operation_key=write.operation_key,
            external_request_id=request_id,
            latency_ms=float(rng.choice((15_000, 30_000, 60_000))),
        )
    )
    outcome = rng.choices(("checked", "failed", "pending"), weights=(40, 30, 30))[0]
    if outcome == "checked":
        lookup = "get_refund" if write.tool == "create_refund" else "get_order_by_key"
        run.step(Step(lookup, {"operation_key": write.operation_key}, {**write.result, "found": True}))
        run.answer(run.plan.answer)
        return run.finish("succeeded")
    if outcome == "failed":
        return run.finish(
            "failed",
            terminated_by="error",
            reason=f"{write.tool} timed out; outcome unknown, needs reconciliation",
        )
    run.answer(
        "Your request was sent, but the confirmation timed out. We'll email you as soon as it is confirmed."
    )
    return run.finish("succeeded")
