"""fusee.contrib.pydantic_ai with an MCP server: its get_tools and call_tool are steps.

The server is a FastMCP server in the test's process (the in-memory
transport: no socket, no subprocess), an order desk whose tools count their
calls; each MCP step opens its own session to it. The model is a scripted
FunctionModel. Every test runs live and again after a crash.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from engine.conftest import Host, assert_steps_ran_once
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import Middleware
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo

import fusee
from fusee.contrib.pydantic_ai import FuseeDurability, events, run_agent
from fusee.testing import crash_everywhere

from .conftest import Readers, Reply, function_model, step_names

ANSWER = "Order 1042 has shipped: parcel P-77 is out for delivery."

# pydantic-ai's journal names, from the agent's name and the toolset's id;
# an MCP call_tool step's name has no tool in it (the call's arguments,
# which name it, are in the journal).
STEPS = [
    "desk__mcp_server__orders.get_tools",
    "desk__mcp_server__orders.get_instructions",
    "desk__model.request_stream",
    "desk__event_stream_handler",  # the lookup's call
    "desk__mcp_server__orders.call_tool",
    "desk__event_stream_handler",  # its result
    "desk__mcp_server__orders.get_instructions",
    "desk__model.request_stream",
    "desk__event_stream_handler",  # the tracking's call
    "desk__mcp_server__orders.call_tool",
    "desk__event_stream_handler",  # its result
    "desk__mcp_server__orders.get_instructions",
    "desk__model.request_stream",
]

# What a reader of the run's stream sees: an MCP tool's call and result are
# events as a function tool's are.
EVENTS = [
    ("part_start", "lookup_order"),
    ("part_end", "lookup_order"),
    ("function_tool_call", "lookup_order"),
    ("function_tool_result", {"id": "1042", "status": "shipped", "parcel": "P-77"}),
    ("part_start", "track_parcel"),
    ("part_end", "track_parcel"),
    ("function_tool_call", "track_parcel"),
    ("function_tool_result", "out for delivery"),
    ("part_start", ANSWER),
    ("final_result", None),
    ("part_end", ANSWER),
]


def _mcp_steps(names: list[str]) -> int:
    return sum("__mcp_server__" in name for name in names)


# What the server served: each tool call once, and one session per MCP step.
SERVED = {
    "lookup_order:1042": 1,
    "track_parcel:P-77": 1,
    "session": _mcp_steps(STEPS),
}


class _Sessions(Middleware):
    """Counts a server's sessions in ``calls["session"]``, after refusing ``refuse`` of them."""

    def __init__(self, calls: Counter[str], refuse: int) -> None:
        self.calls = calls
        self.refuse = refuse

    # A session starts with `discover` (MCP's modern protocol) or with
    # `initialize` (its legacy one).
    async def on_discover(self, context: Any, call_next: Any) -> Any:
        return await self._open(context, call_next)

    async def on_initialize(self, context: Any, call_next: Any) -> Any:
        return await self._open(context, call_next)

    async def _open(self, context: Any, call_next: Any) -> Any:
        if self.calls["refused"] < self.refuse:
            self.calls["refused"] += 1
            raise ConnectionRefusedError("the order desk is starting up")
        self.calls["session"] += 1
        return await call_next(context)


def _order_desk(calls: Counter[str], refuse: int = 0) -> FastMCP:
    """An MCP server with two tools; ``calls`` counts its sessions and its tools' calls."""
    server = FastMCP("order desk", instructions="Order ids are four digits.")
    server.add_middleware(_Sessions(calls, refuse))

    @server.tool
    def lookup_order(order_id: str) -> dict[str, Any]:
        """Looks an order up by its id."""
        calls[f"lookup_order:{order_id}"] += 1
        if len(order_id) != 4:
            raise ToolError(f"no order {order_id!r}: order ids are four digits")
        return {"id": order_id, "status": "shipped", "parcel": "P-77"}

    @server.tool
    def track_parcel(parcel: str) -> str:
        """Where a parcel is."""
        calls[f"track_parcel:{parcel}"] += 1
        return "out for delivery"

    return server


def _reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Looks order 1042 up, tracks its parcel, then answers."""
    # The server's instructions reach the model (through their own step).
    assert "Order ids are four digits." in (info.instructions or "")
    last = messages[-1].parts[-1]
    if isinstance(last, ToolReturnPart) and last.tool_name == "lookup_order":
        parcel = last.model_response_object()["parcel"]
        return ModelResponse(parts=[ToolCallPart("track_parcel", {"parcel": parcel}, "c2")])
    if isinstance(last, ToolReturnPart):
        answer = f"Order 1042 has shipped: parcel P-77 is {last.content}."
        return ModelResponse(parts=[TextPart(answer)])
    return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "1042"}, "c1")])


def _desk(
    calls: Counter[str], reply: Reply = _reply, *, refuse: int = 0
) -> fusee.WorkflowDef[None, str]:
    """A workflow running the agent "desk" with the order desk's MCP toolset, id "orders"."""
    orders = MCPToolset(_order_desk(calls, refuse), id="orders", include_instructions=True)
    agent = Agent(
        function_model(reply), name="desk", toolsets=[orders], capabilities=[FuseeDurability()]
    )

    @fusee.workflow("desk")
    async def desk(ctx: fusee.Ctx) -> str:
        return str((await run_agent(ctx, agent, "Where is my order 1042?")).output)

    return desk


def _shape(event: Any) -> tuple[str, Any]:
    """An event's kind and what a reader shows of it (no timestamps, which differ per attempt)."""
    kind = event.event_kind
    if kind in ("part_start", "part_end", "function_tool_call"):
        part = event.part
        return kind, part.content if isinstance(part, TextPart) else part.tool_name
    if kind == "function_tool_result":
        return kind, event.part.content
    return kind, None


async def _read(run: fusee.Run[str]) -> list[tuple[str, Any]]:
    return [_shape(event) async for event in events(run.stream("agent"))]


async def test_mcp_get_tools_and_call_tool_are_steps_named_by_agent_and_toolset(
    host: Host,
) -> None:
    calls: Counter[str] = Counter()
    desk = _desk(calls)
    async with host(workflows=[desk]) as t:
        run = await t.start(desk, "o-1")
        assert await _read(run) == EVENTS
        assert await run.result() == ANSWER
        assert await step_names(t.store, "o-1") == STEPS
        assert calls == SERVED
        await t.crash()
        assert await run.result() == ANSWER
        assert await _read(run) == EVENTS
        assert_steps_ran_once(t)
    # Replayed from the journal: the server was not called again.
    assert calls == SERVED


# pydantic-ai gathers the toolsets' get_tools (and get_instructions) in an
# anyio task group, in workflow code. A run shut down while those steps are
# in flight evicts the group's children and its host in one turn: the host
# leaves the group first, and anyio's callback for each child that ends
# after it fails (its `_exceptions` list is gone). The recovered run is
# unaffected; the engine's loop reports the callback's error.
@pytest.mark.expect_engine_errors("'TaskGroup' object has no attribute '_exceptions'")
async def test_a_crash_anywhere_calls_each_mcp_tool_once_per_durable_position() -> None:
    calls: Counter[str] = Counter()
    readers = Readers(_read)
    assert await crash_everywhere(_desk(calls), id="o-2", drive=readers.drive) == ANSWER
    await readers.close()
    assert len(readers.reads) > len(STEPS)
    assert all(read == EVENTS for read in readers.reads)
    # Each run of the workflow called each tool once; a crash repeated at
    # most the one call it interrupted (its step's result not recorded yet),
    # never one whose result was (crash_everywhere checks that too).
    runs = len(readers.engines)
    assert set(calls) == set(SERVED)
    tools = [n for call, n in calls.items() if call != "session"]
    assert all(runs <= n <= 2 * runs - 1 for n in tools)


async def test_an_mcp_tool_error_is_recorded_and_sent_back_to_the_model(host: Host) -> None:
    calls: Counter[str] = Counter()
    told: list[str] = []

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart) and last.outcome == "retried":
            told.append(str(last.content))
            return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "1042"}, "c2")])
        if isinstance(last, ToolReturnPart):
            status = last.model_response_object()["status"]
            return ModelResponse(parts=[TextPart(f"it has {status}")])
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "10420"}, "c1")])

    desk = _desk(calls, reply)
    async with host(workflows=[desk]) as t:
        run = await t.start(desk, "o-3")
        assert await run.result() == "it has shipped"
        assert len(told) == 1
        assert "order ids are four digits" in told[0]
        names = await step_names(t.store, "o-3")
        assert names.count("desk__mcp_server__orders.call_tool") == 2
        await t.crash()
        assert await run.result() == "it has shipped"
        assert_steps_ran_once(t)
    sessions = _mcp_steps(names)
    assert calls == {"lookup_order:10420": 1, "lookup_order:1042": 1, "session": sessions}


async def test_a_server_refusing_a_session_is_retried_by_the_steps_policy(host: Host) -> None:
    calls: Counter[str] = Counter()
    desk = _desk(calls, refuse=2)
    async with host(workflows=[desk]) as t:
        run = await t.start(desk, "o-4")
        assert await run.result() == ANSWER
        # The first step (get_tools) connected on its third attempt.
        assert calls == {**SERVED, "refused": 2}
        assert await step_names(t.store, "o-4") == STEPS
        await t.crash()
        assert await run.result() == ANSWER
    assert calls == {**SERVED, "refused": 2}
