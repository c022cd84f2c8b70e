"""A run under construction: the events a runtime would send for it, with its clock, counters and a
context window that grows round after round."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import string
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from demo.simulation.catalogue import DEPLOYMENTS, PROMPT_VERSIONS, TASK_BUDGETS, Agent
from demo.simulation.content import NARRATION
from demo.simulation.plans import PLANS, Step

Event = dict[str, Any]


def _ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _tokens(value: Any) -> int:
    if value is None:
        return 0
    text = value if isinstance(value, str) else json.dumps(value)
    return 12 + len(text) // 4  # ~4 characters a token, plus the message wrapper


class RunBuilder:
    """A run under construction: its clock, counters, and a context window that grows each round."""

    def __init__(
        self,
        rng: random.Random,
        start: datetime,
        *,
        scenario: str,
        expect: str,
        task_type: str,
        agent: Agent,
        run_prefix: str,
        reports_cost: bool | None = None,
    ) -> None:
        self.rng = rng
        self.agent = agent
        self.task_type = task_type
        self.now = (start if start.tzinfo else start.replace(tzinfo=UTC)).astimezone(UTC)
        self.start = self.now
        self.run_id = f"{run_prefix}-{scenario.replace('_', '-')}-{rng.getrandbits(48):012x}"
        self.events: list[Event] = []
        self.round = 0
        self.tool_calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd = 0.0
        self.context = rng.randint(900, 2600)  # system prompt and tool schemas
        self.reports_cost = rng.random() < agent.cost_share if reports_cost is None else reports_cost
        self._calls_in_round = 0
        self._narration = list(NARRATION)
        rng.shuffle(self._narration)
        labels = {
            "deployment": rng.choice(DEPLOYMENTS),
            "prompt_version": rng.choice(PROMPT_VERSIONS),
            "sim_scenario": scenario,
            "sim_expect": expect,
            **dict(agent.labels),
        }
        self.started = self.emit(
            "run_started",
            agent=agent.name,
            task_type=task_type,
            backend=agent.backend,
            model=agent.model,
            labels=labels,
        )
        self.plan = PLANS[task_type](self)

    # -- plumbing

    def emit(self, event_type: str, /, **fields: Any) -> Event:
        event = {
            "type": event_type,
            "run_id": self.run_id,
            "ts": _ts(self.now),
            "event_id": f"{self.run_id}.{len(self.events) + 1}",
            **fields,
        }
        self.events.append(event)
        return event

    def wait(self, seconds: float) -> None:
        self.now += timedelta(seconds=max(0.0, seconds))

    def token(self, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(self.rng.choices(alphabet, k=n))

    def _call_id(self) -> str:
        style = self.agent.call_ids
        if style == "reused":
            return f"call_{self._calls_in_round}"
        if style == "anthropic":
            return "toolu_01" + self.token(22)
        if style == "deepseek":
            return f"call_{self._calls_in_round}_{self.token(8, '0123456789abcdef')}"
        return "call_" + self.token(24)

    def _latency(self, step: Step) -> float:
        if step.latency_ms is not None:
            return step.latency_ms
        median = {"write": 600.0, "poll": 90.0}.get(step.kind, 220.0)
        return round(min(25_000.0, self.rng.lognormvariate(math.log(median), 0.6)), 1)

    # -- events

    def user(self, text: str) -> None:
        self.wait(self.rng.uniform(0.05, 0.3) if len(self.events) == 1 else self.rng.uniform(4, 40))
        self.emit("user_message", text=text)

    def think(self, *, text: str | None = None, output_tokens: int | None = None) -> int:
        """One model round; returns its number. The prompt is the whole context so far."""
        rng = self.rng
        self.round += 1
        self._calls_in_round = 0
        if self.context > self.agent.context_limit:
            self.context = self.context // 3  # the runtime summarised the conversation
        out = (
            output_tokens
            if output_tokens is not None
            else rng.randint(60, 420)
            if text
            else rng.randint(18, 140)
        )
        # Time to first token grows with the prompt; then the backend's decoding speed.
        self.wait(0.3 + self.context / rng.uniform(8_000, 20_000) + out / self.agent.tokens_per_s)
        fields: dict[str, Any] = {"round": self.round, "input_tokens": self.context, "output_tokens": out}
        cost = self.agent.cost(self.context, out)
        if self.reports_cost:
            cost = round(cost, 6)
            fields["cost_usd"] = cost
        if text is not None:
            fields["text"] = text
        self.emit("model_round", **fields)
        self.input_tokens += self.context
        self.output_tokens += out
        self.cost_usd += cost
        self.context += out
        return self.round

    def narration(self) -> str | None:
        # A few rounds say something to the user; never the same line twice in one run, so that
        # narration is not mistaken for a repeated clarification question.
        if self._narration and self.rng.random() < 0.2:
            return self._narration.pop()
        return None

    def calls(self, steps: Sequence[Step], *, text: str | None = None, think: bool = True) -> list[str]:
        """A model round emitting `steps` as one batch, then their results in order of completion."""
        if think:
            self.think(text=text if text is not None else self.narration())
        call_ids: list[str] = []
        for step in steps:
            call_id = step.call_id or self._call_id()
            self._calls_in_round += 1
            self.tool_calls += 1
            self.wait(self.rng.uniform(0.002, 0.03))
            fields: dict[str, Any] = {
                "round": self.round,
                "call_id": call_id,
                "tool": step.tool,
                "kind": step.kind,
                "args": copy.deepcopy(step.args),
            }
            if step.step_id:
                fields["step_id"] = step.step_id
            if step.operation_key:
                fields["operation_key"] = step.operation_key
            self.emit("tool_call", **fields)
            call_ids.append(call_id)
        sent = self.now
        timed = sorted(
            ((self._latency(step), i) for i, step in enumerate(steps)), key=lambda pair: (pair[0], pair[1])
        )
        for latency, i in timed:
            self.now = max(self.now, sent + timedelta(milliseconds=latency))
            self._result(call_ids[i], steps[i], latency)
        return call_ids

    def step(self, step: Step, *, text: str | None = None) -> str:
        return self.calls([step], text=text)[0]

    def _result(self, call_id: str, step: Step, latency: float) -> None:
        fields: dict[str, Any] = {"call_id": call_id, "status": step.status}
        if step.full_text is not None:
            cut = step.full_text[:1500]
            fields["result"] = cut
            if len(cut) < len(step.full_text):
                fields["result_truncated"] = True
                fields["result_sha256"] = hashlib.sha256(step.full_text.encode()).hexdigest()
        elif step.result is not None:
            fields["result"] = copy.deepcopy(step.result)
        if step.error_class:
            fields["error_class"] = step.error_class
        fields["latency_ms"] = latency
        if step.external_request_id:
            fields["external_request_id"] = step.external_request_id
        self.emit("tool_result", **fields)
        self.context += _tokens(fields.get("result"))

    def answer(self, text: str) -> None:
        self.think(text=text)

    def finish(
        self,
        status: str,
        *,
        terminated_by: str | None = None,
        budget_type: str | None = None,
        reason: str | None = None,
    ) -> list[Event]:
        self.wait(self.rng.uniform(0.02, 0.4))
        fields: dict[str, Any] = {"status": status}
        if terminated_by:
            fields["terminated_by"] = terminated_by
        if budget_type:
            fields["budget_type"] = budget_type
        if reason:
            fields["reason"] = reason
        self.emit("run_finished", **fields)
        return self.events

    # -- budgets

    def usage(self) -> dict[str, float]:
        return {
            "max_rounds": self.round,
            "max_tool_calls": self.tool_calls,
            "max_tokens": self.input_tokens + self.output_tokens,
            "max_cost_usd": self.cost_usd,
        }

    def declare_budgets(self, *, hit: str | None = None, limit: float | None = None) -> None:
        """Put budgets in run_started: `hit` at `limit`, the others above what the run used.

        Written after the run is built (the dict is the first event's) so that a budget the
        run ran out of matches what it consumed.
        """
        used = self.usage()
        budgets: dict[str, float] = {}
        for key, default in TASK_BUDGETS[self.task_type].items():
            if default > used[key]:
                budgets[key] = default
            elif key == "max_cost_usd":
                budgets[key] = round(used[key] * 2 + 0.01, 2)
            else:
                budgets[key] = int(used[key]) * 2 + 1
        if hit is not None and limit is not None:
            budgets[hit] = limit
        self.started["budgets"] = budgets

    # -- plans

    def next_read(self) -> Step:
        if self.plan.reads:
            return self.plan.reads.pop(0)
        return next(self.plan.fillers)

    def work(self, tool_rounds: int) -> None:
        """Ordinary progress: the plan's reads, fillers, then its writes, one round each."""
        plan = self.plan
        core = len(plan.reads) + len(plan.writes)
        if tool_rounds <= core:
            steps = (plan.reads + plan.writes)[:tool_rounds]
        else:
            steps = plan.reads + [next(plan.fillers) for _ in range(tool_rounds - core)] + plan.writes
        plan.reads, plan.writes = [], []
        for step in steps:
            batch = [step]
            # Parallel-capable backends sometimes fetch two or three things in one round.
            if self.agent.parallel and step.kind == "read" and self.rng.random() < 0.25:
                batch += [next(plan.fillers) for _ in range(self.rng.randint(1, 2))]
            self.calls(batch)

    def warmup(self, tool_rounds: int) -> None:
        for _ in range(tool_rounds):
            self.step(self.next_read())
