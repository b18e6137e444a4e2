"""The OpenAI Agents SDK's support agents for the contrib tests, offline.

A triage agent looks an order up and hands the customer to a refunds agent,
which refunds it (with a person's approval if asked). The model is a
scripted ``agents.Model`` that streams its reply as the Responses API does;
the order service is the JSON file of examples/agent_support.py. Shared by
test_openai_agents.py and the SIGKILL test's worker process.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    Model,
    ModelResponse,
    RunContextWrapper,
    TResponseInputItem,
    Usage,
    function_tool,
)
from agents.items import TResponseStreamEvent
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)

import fusee
from examples.agent_support import OrderService
from fusee.contrib.openai_agents import run_agent

ANSWER = "Refunded 39.90 for order 1042."


class ScriptedModel(Model):
    """Plays both agents offline: look up, hand off, refund, answer.

    Counts its requests by the number of input items (a durable position),
    and logs each to ``log`` if given (a file: outside the process).
    """

    def __init__(self, log: Path | None = None) -> None:
        self.requests: list[int] = []
        self.log = log

    def _output(self, instructions: str | None, input: list[Any]) -> list[Any]:
        self.requests.append(len(input))
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(f"{len(input)}\n")
        outputs = {
            i["call_id"]: i["output"] for i in input if i.get("type") == "function_call_output"
        }
        calls = {i["call_id"]: i["name"] for i in input if i.get("type") == "function_call"}
        done = {calls[c]: o for c, o in outputs.items()}
        n = len(input)
        if "triage" in (instructions or ""):
            if "lookup_order" not in done:
                return [_call(f"c{n}", "lookup_order", {"order_id": "1042"})]
            return [_call(f"c{n}", "transfer_to_refunds", {})]
        if "refund" not in done:
            order = json.loads(done["lookup_order"])
            return [_call(f"c{n}", "refund", {"order_id": "1042", "amount": order["total"]})]
        return [_message(f"m{n}", f"R{done['refund'][1:]}.")]

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        output = self._output(system_instructions, _items(input))
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        output = self._output(system_instructions, _items(input))
        seq = 0
        for item in output:
            if isinstance(item, ResponseOutputMessage):
                for word in words(item.content[0].text):  # type: ignore[union-attr]
                    seq += 1
                    yield ResponseTextDeltaEvent(
                        type="response.output_text.delta",
                        delta=word,
                        item_id=item.id,
                        output_index=0,
                        content_index=0,
                        sequence_number=seq,
                        logprobs=[],
                    )
        response = Response(
            id=f"r{len(self.requests)}",
            created_at=0,
            model="scripted",
            object="response",
            output=output,
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=seq + 1
        )


def _items(input: str | list[TResponseInputItem]) -> list[Any]:
    return [{"role": "user", "content": input}] if isinstance(input, str) else list(input)


def words(text: str) -> list[str]:
    words = text.split(" ")
    return [words[0], *[f" {w}" for w in words[1:]]]


def _call(call_id: str, name: str, args: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc-{call_id}",
        call_id=call_id,
        name=name,
        arguments=json.dumps(args),
        type="function_call",
        status="completed",
    )


def _message(id: str, text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=id,
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
        role="assistant",
        status="completed",
        type="message",
    )


@function_tool
def lookup_order(ctx: RunContextWrapper[OrderService], order_id: str) -> str:
    """Looks an order up by its number."""
    return json.dumps(ctx.context.lookup(order_id))


@function_tool
def refund(ctx: RunContextWrapper[OrderService], order_id: str, amount: float) -> str:
    """Refunds ``amount`` for an order."""
    step = fusee.current_step()
    assert step is not None
    return ctx.context.refund(order_id, amount, step.key)


def build_agents(model: Model, *, approval: bool = False) -> Agent[OrderService]:
    tool = dataclasses.replace(refund, needs_approval=True) if approval else refund
    refunds = Agent[OrderService](
        name="refunds", instructions="You make refunds.", model=model, tools=[tool]
    )
    return Agent[OrderService](
        name="triage",
        instructions="You are the triage agent.",
        model=model,
        tools=[lookup_order],
        handoffs=[refunds],
    )


def support_workflow(
    model: ScriptedModel,
    *,
    triage: Agent[OrderService] | None = None,
    approval: bool = False,
    service: type[OrderService] = OrderService,
    **options: Any,
) -> fusee.WorkflowDef[str, str]:
    """The support workflow, on ``triage`` or the agents of ``model``, with ``options``."""
    agent = triage if triage is not None else build_agents(model, approval=approval)

    @fusee.workflow("support")
    async def support(ctx: fusee.Ctx, orders: str) -> str:
        result = await run_agent(
            ctx,
            agent,
            "Please refund my order #1042.",
            models={"scripted": model},
            context=service(Path(orders)),
            **options,
        )
        return str(result.final_output)

    return support
