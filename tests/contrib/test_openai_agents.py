"""fusee.contrib.openai_agents: the Runner's model calls and function tools are steps.

A triage agent looks an order up and hands the customer to a refunds agent,
which refunds it. The model is a scripted ``agents.Model`` (offline) that
streams its reply as the Responses API does; the order service is the JSON
file of examples/agent_support.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
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
from engine.conftest import Host, assert_steps_ran_once
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
from fusee.contrib.openai_agents import (
    DECISIONS,
    ApprovalRequested,
    Decisions,
    HandoffEvent,
    ResponseEvent,
    ToolCalled,
    ToolOutput,
    events,
    run_agent,
)
from fusee.testing import TestEngine, crash_everywhere

from .conftest import Readers, step_names

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
                for word in _words(item.content[0].text):  # type: ignore[union-attr]
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


def _words(text: str) -> list[str]:
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


def _agents(model: Model, *, approval: bool = False) -> Agent[OrderService]:
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


def _support(
    model: ScriptedModel,
    *,
    triage: Agent[OrderService] | None = None,
    approval: bool = False,
    service: type[OrderService] = OrderService,
    **options: Any,
) -> fusee.WorkflowDef[str, str]:
    """The support workflow, on ``triage`` or the agents of ``model``, with ``options``."""
    agent = triage if triage is not None else _agents(model, approval=approval)

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


STEPS = [
    "triage__model:scripted",
    "triage__tool:lookup_order",
    "triage__model:scripted",
    "refunds__model:scripted",
    "refunds__tool:refund",
    "refunds__model:scripted",
]


def _shape(event: Any) -> tuple[Any, ...]:
    if isinstance(event, ResponseEvent):
        return ("response", event.agent, event.event.type, getattr(event.event, "delta", None))
    if isinstance(event, ToolCalled):
        return ("tool_called", event.agent, event.tool)
    if isinstance(event, ToolOutput):
        return ("tool_output", event.agent, event.tool)
    if isinstance(event, ApprovalRequested):
        return ("approval", event.agent, event.tool)
    assert isinstance(event, HandoffEvent)
    return ("handoff", event.source, event.target)


EVENTS = [
    ("response", "triage", "response.completed", None),
    ("tool_called", "triage", "lookup_order"),
    ("tool_output", "triage", "lookup_order"),
    ("response", "triage", "response.completed", None),
    ("handoff", "triage", "refunds"),
    ("response", "refunds", "response.completed", None),
    ("tool_called", "refunds", "refund"),
    ("tool_output", "refunds", "refund"),
    *[("response", "refunds", "response.output_text.delta", w) for w in _words(ANSWER)],
    ("response", "refunds", "response.completed", None),
]


async def test_model_calls_and_tools_are_steps_and_a_handoff_is_replayed(
    host: Host, tmp_path: Path
) -> None:
    model = ScriptedModel()
    support = _support(model)
    orders = str(tmp_path / "orders.json")
    async with host(workflows=[support]) as t:
        run = await t.start(support, "o-1", orders)
        assert [_shape(e) async for e in events(run.stream("agent"))] == EVENTS
        assert await run.result() == ANSWER
        assert await step_names(t.store, "o-1") == STEPS
        await t.crash()
        assert await run.result() == ANSWER
        assert [_shape(e) async for e in events(run.stream("agent"))] == EVENTS
        assert_steps_ran_once(t)
    # One request per durable position, none again after the crash.
    assert model.requests == [1, 3, 5, 7]
    assert OrderService(Path(orders)).refunds() == [{"order_id": "1042", "amount": 39.9}]


async def test_a_crash_anywhere_gives_the_same_answer_and_stream(tmp_path: Path) -> None:
    support = _support(ScriptedModel())
    readers = Readers(_read)
    orders = str(tmp_path / "orders.json")
    assert await crash_everywhere(support, orders, id="o-2", drive=readers.drive) == ANSWER
    await readers.close()
    assert len(readers.reads) > len(STEPS)
    assert all(read == EVENTS for read in readers.reads)
    assert len(OrderService(Path(orders)).refunds()) == 1


async def _read(run: fusee.Run[str]) -> list[tuple[Any, ...]]:
    return [_shape(e) async for e in events(run.stream("agent"))]


async def test_without_a_stream_model_calls_are_not_streamed(tmp_path: Path) -> None:
    quiet = _support(ScriptedModel(), stream=None)
    async with TestEngine(workflows=[quiet]) as t:
        run = await t.start(quiet, "o-3", str(tmp_path / "orders.json"))
        assert await run.result() == ANSWER
        await t.crash()
        assert await run.result() == ANSWER
        assert_steps_ran_once(t)


async def test_a_raising_tool_is_retried_by_its_steps_policy(tmp_path: Path) -> None:
    attempts: list[int] = []

    @function_tool(failure_error_function=None)
    def lookup_order(ctx: RunContextWrapper[OrderService], order_id: str) -> str:
        """Looks an order up by its number."""
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("the order service is down")
        return json.dumps(ctx.context.lookup(order_id))

    model = ScriptedModel()
    flaky = _support(
        model,
        triage=_agents(model).clone(tools=[lookup_order]),
        tool_retry=fusee.Retry(attempts=3, initial="1s", on_exhausted="fail"),
    )
    async with TestEngine(workflows=[flaky]) as t:
        run = await t.start(flaky, "o-4", str(tmp_path / "orders.json"))
        assert await run.result() == ANSWER
        assert len(attempts) == 3


async def test_an_unregistered_model_object_is_refused_with_what_to_do() -> None:
    triage = _agents(ScriptedModel())

    @fusee.workflow("unregistered")
    async def unregistered(ctx: fusee.Ctx) -> str:
        return str((await run_agent(ctx, triage, "hi")).final_output)

    async with TestEngine(workflows=[unregistered]) as t:
        run = await t.start(unregistered, "o-5")
        with pytest.raises(fusee.WorkflowFailed, match=r"models=\{'name': model\}"):
            await run.result()


@pytest.mark.parametrize(
    ("answer", "output", "refunds"),
    [
        pytest.param(None, ANSWER, 1, id="approved"),
        pytest.param("refunds need a receipt", "Refunds need a receipt.", 0, id="denied"),
    ],
)
async def test_a_tool_that_needs_approval_waits_parked_for_a_person_across_a_crash(
    host: Host, tmp_path: Path, answer: str | None, output: str, refunds: int
) -> None:
    model = ScriptedModel()
    support = _support(model, approval=True)
    orders = str(tmp_path / "orders.json")
    async with host(workflows=[support]) as t:
        run = await t.start(support, "o-6", orders)
        asked = None
        async for event in events(run.stream("agent")):
            if isinstance(event, ApprovalRequested):
                asked = event
                break
        assert asked is not None
        assert (asked.agent, asked.tool, json.loads(asked.arguments)) == (
            "refunds",
            "refund",
            {"order_id": "1042", "amount": 39.9},
        )
        await t.advance("7d")
        await t.crash()
        assert (await run.describe()).status == fusee.RunStatus.SUSPENDED
        decision = (
            Decisions(approve=[asked.call_id])
            if answer is None
            else Decisions(deny={asked.call_id: answer})
        )
        await run.signal(DECISIONS, decision)
        assert await run.result() == output
        seen = [_shape(e) async for e in events(run.stream("agent"))]
        assert seen.count(("approval", "refunds", "refund")) == 1
        # A denied call is not made: its tool's step never runs.
        assert (("tool_called", "refunds", "refund") in seen) == bool(refunds)
        await t.crash()
        assert await run.result() == output
        assert_steps_ran_once(t)
    assert len(OrderService(Path(orders)).refunds()) == refunds
