"""fusee.contrib.openai_agents: the Runner's model calls and function tools are steps.

The agents are the triage and refunds agents of openai_support.py, on a
scripted model, offline. Every test runs live, then again after a crash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agents import RunContextWrapper, function_tool
from engine.conftest import Host, assert_steps_ran_once

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
from .openai_support import ANSWER, ScriptedModel, build_agents, support_workflow, words

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
    *[("response", "refunds", "response.output_text.delta", w) for w in words(ANSWER)],
    ("response", "refunds", "response.completed", None),
]


async def test_model_calls_and_tools_are_steps_and_a_handoff_is_replayed(
    host: Host, tmp_path: Path
) -> None:
    model = ScriptedModel()
    support = support_workflow(model)
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
    support = support_workflow(ScriptedModel())
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
    quiet = support_workflow(ScriptedModel(), stream=None)
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
    flaky = support_workflow(
        model,
        triage=build_agents(model).clone(tools=[lookup_order]),
        tool_retry=fusee.Retry(attempts=3, initial="1s", on_exhausted="fail"),
    )
    async with TestEngine(workflows=[flaky]) as t:
        run = await t.start(flaky, "o-4", str(tmp_path / "orders.json"))
        assert await run.result() == ANSWER
        assert len(attempts) == 3


async def test_an_unregistered_model_object_is_refused_with_what_to_do() -> None:
    triage = build_agents(ScriptedModel())

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
    support = support_workflow(model, approval=True)
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
