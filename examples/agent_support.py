"""A durable support agent: it looks an order up, asks a person before a refund, streams its answer.

The agent is a pydantic-ai ``Agent`` run inside a fusee workflow
(`fusee.contrib.pydantic_ai`): each model request and each tool call is a
step, so a crash loses none and repeats none; the refund tool needs a
person's approval, and the run waits for it parked (``ctx.wait_for``); the
agent's events stream to the client while the run runs.

The order service is a stand-in kept in a JSON file; a refund is made once
per idempotency key (the step's), so a refund retried after a crash is not
paid twice.

    .venv/bin/python examples/agent_support.py

Offline by default: a scripted ``FunctionModel`` plays the model. With
``OPENAI_API_KEY`` set, ``AGENT_MODEL`` (default ``openai:gpt-4.1-mini``)
answers instead (``pip install "pydantic-ai-slim[openai]"`` for its SDK).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolRequestsEvent,
    FunctionToolset,
    PartDeltaEvent,
    PartStartEvent,
    RunContext,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import fusee
from fusee.contrib.pydantic_ai import DECISIONS, Decisions, FuseeDurability, events, run_agent

INSTRUCTIONS = (
    "You are a support agent for an online shop. Look the customer's order up with "
    "lookup_order, refund it with refund when they ask for one, then answer in one sentence."
)


class OrderService:
    """The shop's order service, kept in a JSON file (a stand-in for an HTTP API).

    A refund is recorded once per idempotency key: asked again with the same
    key (a retried step), it answers as the first time and pays nothing more.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> dict[str, dict[str, object]]:
        if not self.path.exists():
            return {
                "orders": {"1042": {"item": "a kettle", "total": 39.9, "status": "delivered"}},
                "refunds": {},
            }
        data: dict[str, dict[str, object]] = json.loads(self.path.read_text())
        return data

    def _save(self, data: dict[str, dict[str, object]]) -> None:
        # Written aside, flushed, then renamed over: a crash leaves the old
        # file or the new one, never half of one.
        part = self.path.with_suffix(".part")
        with part.open("w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        part.replace(self.path)

    def lookup(self, order_id: str) -> dict[str, object]:
        order = self._load()["orders"].get(order_id)
        if not isinstance(order, dict):
            return {"error": f"no order {order_id}"}
        return {"order_id": order_id, **order}

    def refund(self, order_id: str, amount: float, key: str) -> str:
        data = self._load()
        refunds = data["refunds"]
        if key not in refunds:
            refunds[key] = {"order_id": order_id, "amount": amount}
            self._save(data)
        return f"refunded {amount:.2f} for order {order_id}"

    def refunds(self) -> list[dict[str, object]]:
        return list(self._load()["refunds"].values())  # type: ignore[arg-type]


orders = FunctionToolset[OrderService](id="orders")


@orders.tool
async def lookup_order(ctx: RunContext[OrderService], order_id: str) -> dict[str, object]:
    """Looks an order up by its number."""
    return ctx.deps.lookup(order_id)


@orders.tool(requires_approval=True)
async def refund(ctx: RunContext[OrderService], order_id: str, amount: float) -> str:
    """Refunds ``amount`` for an order (a person approves it first)."""
    step = fusee.current_step()
    # The step's idempotency key: the same on every attempt of this call.
    key = step.key if step is not None else f"{order_id}:{amount}"
    return ctx.deps.refund(order_id, amount, key)


@dataclass
class ScriptedModel:
    """Plays the model offline: look up, refund, answer; one request per durable position.

    ``log``, if given, gets a line per request made (outside the process, so
    a test can count the requests across a crash).
    """

    log: Path | None = None

    def _reply(self, messages: list[ModelMessage]) -> ModelResponse:
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(f"{len(messages)}\n")
                f.flush()
                os.fsync(f.fileno())
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            prompt = str(messages[0].parts[-1].content)  # type: ignore[union-attr]
            number = re.search(r"\d+", prompt)
            order_id = number.group() if number else "0"
            return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": order_id})])
        last = returns[-1]
        if last.tool_name == "lookup_order":
            order: dict[str, object] = last.content  # type: ignore[assignment]  # lookup_order's
            args = {"order_id": order["order_id"], "amount": order["total"]}
            return ModelResponse(parts=[ToolCallPart("refund", args)])
        return ModelResponse(parts=[TextPart(f"Done: {last.content}. Anything else?")])

    def request(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return self._reply(messages)

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        for i, part in enumerate(self._reply(messages).parts):
            if isinstance(part, TextPart):
                for word in part.content.split(" "):
                    yield word if word == part.content.split(" ")[0] else f" {word}"
            elif isinstance(part, ToolCallPart):
                args = part.args_as_json_str()
                yield {i: DeltaToolCall(part.tool_name, args, tool_call_id=f"call-{len(messages)}")}

    def model(self) -> FunctionModel:
        return FunctionModel(self.request, stream_function=self.stream, model_name="scripted")


def build_agent(model: Model | str) -> Agent[OrderService, str | DeferredToolRequests]:
    """The support agent on ``model``, durable in fusee workflows."""
    return Agent(
        model,
        name="support",
        deps_type=OrderService,
        output_type=[str, DeferredToolRequests],
        instructions=INSTRUCTIONS,
        toolsets=[orders],
        capabilities=[FuseeDurability()],
    )


def default_model() -> Model | str:
    """A real model when the user's key is set, else the scripted one."""
    if os.environ.get("OPENAI_API_KEY"):
        return os.environ.get("AGENT_MODEL", "openai:gpt-4.1-mini")
    return ScriptedModel().model()


@dataclass(frozen=True)
class Ticket:
    question: str
    orders: str  # where the order service keeps its data (its address, for a real one)


def support_workflow(
    agent: Agent[OrderService, str | DeferredToolRequests],
    service: type[OrderService] = OrderService,
) -> fusee.WorkflowDef[Ticket, str]:
    """The workflow that answers a ticket with ``agent`` and the order ``service``."""

    @fusee.workflow("support")
    async def support(ctx: fusee.Ctx, ticket: Ticket) -> str:
        # Made in the workflow, from the ticket: a client object does no I/O
        # until a step uses it, so replay makes the same one.
        orders = service(Path(ticket.orders))
        result = await run_agent(ctx, agent, ticket.question, deps=orders, stream="answer")
        return str(result.output)

    return support


support = support_workflow(build_agent(default_model()))


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ticket = Ticket("Please refund my order #1042, the kettle leaks.", f"{tmp}/orders.json")
        async with await fusee.Engine.open(f"{tmp}/store", workflows=[support]) as engine:
            run = await engine.start(support, "ticket-1", ticket)
            print(f"customer: {ticket.question}")
            print("agent: ", end="", flush=True)
            async for event in events(run.stream("answer")):
                if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    print(event.part.content, end="", flush=True)
                elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                    print(event.delta.content_delta, end="", flush=True)
                elif isinstance(event, DeferredToolRequestsEvent):
                    for call in event.requests.approvals:
                        print(f"[asks a person: {call.tool_name}({call.args_as_json_str()})]")
                        # A person approves (from a web page, with a Client).
                        await run.signal(DECISIONS, Decisions(approve=[call.tool_call_id]))
                        print("[approved] ", end="", flush=True)
            print()
            print(f"result: {await run.result()}")
            print(f"refunds: {OrderService(Path(ticket.orders)).refunds()}")


if __name__ == "__main__":
    asyncio.run(main())
