"""What the demo's world is made of: task types and their round counts and budgets, backends and
their prices, the deployed agents and their habits."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

# How often each task type is asked for; the round counts below give the long tail.
TASK_TYPES: dict[str, int] = {"faq": 30, "order_lookup": 25, "refund": 15, "purchase": 12, "research": 18}

# (min, max) model rounds of an ordinary run of each task type.
ROUNDS: dict[str, tuple[int, int]] = {
    "faq": (1, 3),
    "order_lookup": (2, 6),
    "refund": (4, 12),
    "purchase": (2, 6),
    "research": (8, 60),
}

# Budgets a runtime declares per task type (the server's config has its own defaults).
TASK_BUDGETS: dict[str, dict[str, float]] = {
    "faq": {"max_rounds": 6, "max_tool_calls": 10, "max_tokens": 60_000, "max_cost_usd": 0.25},
    "order_lookup": {"max_rounds": 12, "max_tool_calls": 25, "max_tokens": 150_000, "max_cost_usd": 0.5},
    "refund": {"max_rounds": 20, "max_tool_calls": 40, "max_tokens": 400_000, "max_cost_usd": 1.0},
    "purchase": {"max_rounds": 12, "max_tool_calls": 25, "max_tokens": 150_000, "max_cost_usd": 0.5},
    "research": {"max_rounds": 80, "max_tool_calls": 200, "max_tokens": 6_000_000, "max_cost_usd": 8.0},
}

# List prices in USD per million tokens (input, output); the local model costs nothing.
PRICES: dict[tuple[str, str], tuple[float, float]] = {
    ("openai", "gpt-4o"): (2.50, 10.00),
    ("openai", "gpt-4o-mini"): (0.15, 0.60),
    ("anthropic", "claude-sonnet-4"): (3.00, 15.00),
    ("deepseek", "deepseek-chat"): (0.27, 1.10),
    ("local", "llama-3.1-8b"): (0.0, 0.0),
}
MARKUP: dict[str, float] = {"deepseek": 1.3}  # reached through an aggregator, which adds its margin

CallIdStyle = Literal["openai", "anthropic", "deepseek", "reused"]


@dataclass(frozen=True)
class Agent:
    """One deployed agent: its backend and model, and the habits of that backend."""

    name: str
    backend: str
    model: str
    task_types: tuple[str, ...]
    call_ids: CallIdStyle  # "reused": call_0, call_1… again every round, as small local servers do
    parallel: bool  # emits parallel batches of reads in one round
    tokens_per_s: float
    context_limit: int  # past it the runtime summarises the conversation
    cost_share: float  # share of its runs whose runtime reports cost_usd itself
    labels: tuple[tuple[str, str], ...] = ()

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        price_in, price_out = PRICES[(self.backend, self.model)]
        return (input_tokens * price_in + output_tokens * price_out) * MARKUP.get(self.backend, 1.0) / 1e6


AGGREGATOR = (("gateway", "openrouter"),)
AGENTS: tuple[Agent, ...] = (
    Agent(
        "support-bot",
        "openai",
        "gpt-4o-mini",
        ("faq", "order_lookup", "purchase"),
        "openai",
        True,
        90,
        120_000,
        0.1,
    ),
    Agent(
        "order-desk",
        "openai",
        "gpt-4o",
        ("order_lookup", "refund", "purchase"),
        "openai",
        True,
        60,
        120_000,
        0.1,
    ),
    Agent("ops-copilot", "openai", "gpt-4o", ("research", "refund"), "openai", True, 60, 120_000, 0.1),
    Agent(
        "refund-desk",
        "anthropic",
        "claude-sonnet-4",
        ("refund", "order_lookup"),
        "anthropic",
        True,
        55,
        180_000,
        0.15,
    ),
    Agent("analyst", "anthropic", "claude-sonnet-4", ("research",), "anthropic", True, 55, 180_000, 0.15),
    # Aggregators return the price with each response, so these runtimes mostly report cost_usd.
    Agent(
        "scout",
        "deepseek",
        "deepseek-chat",
        ("research", "faq"),
        "deepseek",
        False,
        35,
        60_000,
        0.7,
        AGGREGATOR,
    ),
    Agent(
        "shop-assistant",
        "deepseek",
        "deepseek-chat",
        ("purchase", "order_lookup"),
        "deepseek",
        False,
        35,
        60_000,
        0.7,
        AGGREGATOR,
    ),
    Agent(
        "helpdesk-lite", "local", "llama-3.1-8b", ("faq", "order_lookup"), "reused", False, 120, 32_000, 0.3
    ),
)

# How each agent's runtime reaches loopwatch (manage.py simulate): the others send trace events over
# REST; these ask the guard before every tool call (loopwatch_client's Guard), or export
# OpenTelemetry traces (OTLP).
AGENT_CHANNELS: dict[str, Literal["guard", "otlp"]] = {
    "refund-desk": "guard",
    "shop-assistant": "guard",
    "analyst": "otlp",
}

DEPLOYMENTS = ("prod-eu", "prod-us", "staging")
PROMPT_VERSIONS = ("v7", "v8", "v8.1", "v9-beta")


def rounds_sample(rng: random.Random, task_type: str) -> int:
    """Model rounds of an ordinary run: short for most task types, a heavy tail for research."""
    low, high = ROUNDS[task_type]
    if task_type == "faq":
        return rng.choices((1, 2, 3), weights=(50, 35, 15))[0]
    if task_type == "research":
        # Pareto(1.2): half the runs take under ~13 rounds, about one in fifteen reaches the cap.
        return min(high, low + int((rng.paretovariate(1.2) - 1) * 6))
    return round(rng.triangular(low, high, low + 1))
