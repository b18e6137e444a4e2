"""A worker process for the SIGKILL tests of agent runs (test_agents_sigkill.py).

``python agent_worker.py LIBRARY STORE ORDERS LOG [hang]`` serves a support
agent on the SQLite store at STORE: pydantic-ai's (``pydantic-ai``, the one
of examples/agent_support.py) or the OpenAI Agents SDK's (``openai-agents``,
the one of test_openai_agents.py). It starts (or attaches to) run
``ticket-1`` and prints ``RESULT <output>`` when the run ends. Its model
logs each request to LOG; its order service prints ``REFUNDED`` after each
refund call and, with ``hang``, then blocks (the test kills the process
there, in the middle of the refund's step).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import fusee
from examples.agent_support import (
    OrderService,
    ScriptedModel,
    Ticket,
    build_agent,
    support_workflow,
)

QUESTION = "Please refund my order #1042."


class HangingService(OrderService):
    """The order service; with ``hang``, the process stops after the first refund is recorded."""

    hang = False

    def refund(self, order_id: str, amount: float, key: str) -> str:
        answer = super().refund(order_id, amount, key)
        print(f"REFUNDED {key}", flush=True)
        if self.hang:
            # Blocks the whole process, the engine's loop too: what is not
            # durable yet (the step's result) is lost with the SIGKILL.
            threading.Event().wait()  # until the SIGKILL
        return answer


async def main(library: str, store: str, orders: str, log: str, hang: bool) -> None:
    HangingService.hang = hang
    support: fusee.WorkflowDef[Any, str]
    if library == "pydantic-ai":
        support = support_workflow(build_agent(ScriptedModel(Path(log)).model()), HangingService)
        input: Any = Ticket(QUESTION, orders)
    else:
        # Imported here: a worker loads only its library (the SDK takes seconds).
        from contrib import openai_support

        support = openai_support.support_workflow(
            openai_support.ScriptedModel(Path(log)), service=HangingService
        )
        input = orders
    async with await fusee.Engine.open(store, workflows=[support]) as engine:
        run = await engine.start(support, "ticket-1", input, id_policy=fusee.IdPolicy.ATTACH)
        print("STARTED", flush=True)
        print(f"RESULT {await run.result()}", flush=True)


if __name__ == "__main__":
    library, store, orders, log, *rest = sys.argv[1:]
    asyncio.run(main(library, store, orders, log, rest == ["hang"]))
