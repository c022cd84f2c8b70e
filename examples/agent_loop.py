"""An agent loop that gets stopped: a scripted fake model, real tools behind loopwatch's guard.

    .venv/bin/python examples/agent_loop.py --url http://127.0.0.1:8000 --key "$LOOPWATCH_API_KEY"

The key needs the `ingest` and `ledger` scopes (manage.py create_api_key acme --scopes ingest,ledger).
No network but loopwatch: the "model" is a script of the calls a stuck model makes — it looks an
order up, refunds it, sends the refund again, then searches the same thing over and over. The
guard lets the first calls run, gives the repeated refund the ledger's first result without
refunding twice, gives the unchanged search result back instead of calling again, and then hands
the run to a person. Each round prints what the model asked and what loopwatch decided.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # loopwatch_client, from a checkout

from loopwatch_client import Guard, HandoffRequested, LedgerClient, LoopDetected, RunTerminated, Tracer

# What the fake model asks for, round after round: the loop a real model falls into when a search
# comes back empty and it does not know what else to do.
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("get_order", {"order": "A-1001"}),
    ("refund", {"order": "A-1001", "amount": 25}),
    ("refund", {"order": "A-1001", "amount": 25}),  # "did that work? let me send it again"
    *[("search_orders", {"customer": "42", "status": "open"})] * 8,
]


def main(url: str, key: str, *, out=sys.stdout) -> dict[str, Any]:
    """Run the scripted agent once; returns what happened (for tests)."""
    tracer = Tracer(url, key, flush_interval=0.1)
    decided: list[str] = []

    def note(tool: str, decision) -> None:
        ledger = decision.ledger
        decided.append(f"ledger {ledger['decision']}" if ledger else decision.decision)

    guard = Guard(
        url, key, tracer=tracer, ledger=LedgerClient(url, key, worker_id="example-agent"), on_decision=note
    )
    run_id = f"example-{uuid.uuid4().hex[:8]}"
    executed: list[str] = []

    # --- the tools: plain functions, decorated -----------------------------------------------------

    @guard.tool(kind="read")
    def get_order(order: str) -> dict:
        executed.append("get_order")
        return {"order": order, "status": "delivered", "total": 25}

    @guard.tool(kind="write", key=lambda args: f"{run_id}:refund:{args['order']}")
    def refund(order: str, amount: int, idempotency_key: str | None = None) -> dict:
        executed.append("refund")  # a payment API would get idempotency_key too
        return {"refund": f"re_{order}", "amount": amount}

    @guard.tool(kind="read")
    def search_orders(customer: str, status: str) -> dict:
        executed.append("search_orders")
        return {"orders": []}

    tools = {"get_order": get_order, "refund": refund, "search_orders": search_orders}

    # --- the agent loop ------------------------------------------------------------------------------

    def say(text: str) -> None:
        print(text, file=out)

    outcome = "finished"
    say(f"run {run_id}")
    try:
        with guard.run(
            run_id, agent="support-bot", task_type="refund", backend="openai", model="gpt-4o"
        ) as run:
            for tool, args in SCRIPT:
                round_ = run.model_round(input_tokens=1200, output_tokens=60)
                before = len(executed)
                try:
                    result = tools[tool](**args)
                except LoopDetected as stop:
                    if stop.decision != "correct":
                        raise
                    say(f"round {round_:2}  {tool}{_args(args)}  -> correct: {stop.hint}")
                    continue  # the hint goes to the model instead of a result
                ran = "ran" if len(executed) > before else "not run"
                say(f"round {round_:2}  {tool}{_args(args)}  -> {decided[-1]}, {ran}: {_short(result)}")
    except HandoffRequested as stop:
        outcome = "handoff"
        say(f"round {run.round:2}  {tool}{_args(args)}  -> handoff: {stop.hint}")
        say("handed to a person; what was tried:")
        for call in stop.handoff["tried"]:
            say(f"    {call['tool']}{_args(call['args'])}  {call['status']}")
    except RunTerminated as stop:
        outcome = "terminate"
        say(f"round {run.round:2}  {tool}{_args(args)}  -> terminate: {json.dumps(stop.diagnosis)}")
    tracer.close()
    say(f"tools really executed: {', '.join(f'{t} x{executed.count(t)}' for t in dict.fromkeys(executed))}")
    stats = tracer.stats
    say(f"tracer: {stats['sent']} events sent, {stats['dropped']} dropped; guard: {_counts(guard.stats)}")
    return {"run_id": run_id, "outcome": outcome, "executed": executed, "guard": guard.stats, "tracer": stats}


def _args(args: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _counts(stats: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in stats.items() if v)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", required=True, help="an API key with the ingest and ledger scopes")
    options = parser.parse_args()
    main(options.url, options.key)
