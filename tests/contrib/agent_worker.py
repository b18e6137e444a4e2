"""A worker process for the SIGKILL test of an agent run (test_pydantic_ai_sigkill.py).

``python agent_worker.py STORE ORDERS LOG [hang]`` serves the support agent
of examples/agent_support.py on the SQLite store at STORE: it starts (or
attaches to) run ``ticket-1`` and prints ``RESULT <output>`` when the run
ends. Its model logs each request to LOG; its order service prints
``REFUNDED`` after each refund call and, with ``hang``, then blocks (the
test kills the process there, in the middle of the refund's step).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

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
            time.sleep(3600)
        return answer


async def main(store: str, orders: str, log: str, hang: bool) -> None:
    HangingService.hang = hang
    support = support_workflow(build_agent(ScriptedModel(Path(log)).model()), HangingService)
    async with await fusee.Engine.open(store, workflows=[support]) as engine:
        run = await engine.start(
            support, "ticket-1", Ticket(QUESTION, orders), id_policy=fusee.IdPolicy.ATTACH
        )
        print("STARTED", flush=True)
        print(f"RESULT {await run.result()}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:] == ["hang"]))
