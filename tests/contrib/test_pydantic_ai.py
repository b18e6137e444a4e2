"""fusee.contrib.pydantic_ai: model requests and tool calls are steps; events stream once.

The agents are the support agent of examples/agent_support.py (a scripted
FunctionModel, a JSON-file order service, a refund a person approves) and
small ones made here for retries and failures. Every test runs on every
store, live and again after a crash.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterable
from pathlib import Path
from typing import Any

import pytest
from engine.conftest import Host, assert_steps_ran_once
from pydantic_ai import (
    Agent,
    AgentStreamEvent,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolRequestsEvent,
    FunctionToolset,
    ModelRetry,
    RunContext,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import fusee
from examples.agent_support import (
    OrderService,
    ScriptedModel,
    Ticket,
    build_agent,
    support_workflow,
)
from fusee.contrib.pydantic_ai import DECISIONS, Decisions, FuseeDurability, events, run_agent
from fusee.testing import TestEngine, crash_everywhere

from .conftest import Readers, function_model, step_names

ANSWER = "Done: refunded 39.90 for order 1042. Anything else?"
QUESTION = "Please refund my order #1042."

# The steps of the support agent's run, in journal order: pydantic-ai's
# journal names (agent, toolset id, tool), so a rename strands no run.
SUPPORT_STEPS = [
    "support__model.request_stream",
    "support__event_stream_handler",  # the lookup's call
    "support__function_toolset__orders.call_tool:lookup_order",
    "support__event_stream_handler",  # its result
    "support__model.request_stream",
    "support__event_stream_handler",  # the refund's call, deferred
    "support__event_stream_handler",  # the deferred requests
    # The person answered: a new agent run makes the approved call.
    "support__event_stream_handler",  # the refund's call
    "support__function_toolset__orders.call_tool:refund",
    "support__event_stream_handler",  # the refund's result
    "support__model.request_stream",
]

# What a reader of the run's stream sees: every event once, in order.
SUPPORT_EVENTS = [
    ("part_start", "lookup_order"),
    ("part_end", "lookup_order"),
    ("function_tool_call", "lookup_order"),
    ("function_tool_result", "lookup_order"),
    ("part_start", "refund"),
    ("final_result", None),  # a deferred call ends the agent run
    ("part_end", "refund"),
    ("function_tool_call", "refund"),
    ("deferred_tool_requests", "refund"),
    ("function_tool_call", "refund"),
    ("function_tool_result", "refunded 39.90 for order 1042"),
    ("part_start", "Done:"),
    ("final_result", None),
    *[("part_delta", f" {w}") for w in ANSWER.split(" ")[1:]],
    ("part_end", ANSWER),
]


def _shape(event: Any) -> tuple[str, Any]:
    """An event's kind and what a reader shows of it (no timestamps, which differ per attempt)."""
    kind = event.event_kind
    if kind in ("part_start", "part_end"):
        part = event.part
        return kind, part.content if isinstance(part, TextPart) else part.tool_name
    if kind == "part_delta":
        return kind, event.delta.content_delta
    if kind in ("function_tool_call", "function_tool_result"):
        part = event.part
        return kind, part.content if kind.endswith("result") and part.tool_name == "refund" else (
            part.tool_name
        )
    if kind == "deferred_tool_requests":
        return kind, ",".join(c.tool_name for c in event.requests.approvals)
    return kind, None


def _support(
    tmp_path: Path, log: Path | None = None
) -> tuple[fusee.WorkflowDef[Ticket, str], Ticket]:
    agent = build_agent(ScriptedModel(log).model())
    return support_workflow(agent), Ticket(QUESTION, str(tmp_path / "orders.json"))


async def _read_and_approve(run: fusee.Run[str], *, deny: bool = False) -> list[tuple[str, Any]]:
    """Reads the run's events to their end; answers the refund's approval when it is asked."""
    seen = []
    async for event in events(run.stream("answer")):
        seen.append(_shape(event))
        if isinstance(event, DeferredToolRequestsEvent):
            (call,) = event.requests.approvals
            answer = (
                Decisions(deny={call.tool_call_id: "refunds need a receipt"})
                if deny
                else Decisions(approve=[call.tool_call_id])
            )
            # A dedup id: a reader that reads again after a crash answers once.
            await run.signal(DECISIONS, answer, dedup=f"answer-{call.tool_call_id}")
    return seen


async def test_model_requests_and_tool_calls_are_steps_named_by_agent_and_toolset(
    host: Host, tmp_path: Path
) -> None:
    support, ticket = _support(tmp_path)
    async with host(workflows=[support]) as t:
        run = await t.start(support, "t-1", ticket)
        assert await _read_and_approve(run) == SUPPORT_EVENTS
        assert await run.result() == ANSWER
        assert await step_names(t.store, "t-1") == SUPPORT_STEPS
        await t.crash()
        assert await run.result() == ANSWER
        assert [_shape(e) async for e in events(run.stream("answer"))] == SUPPORT_EVENTS
        assert_steps_ran_once(t)
    assert OrderService(Path(ticket.orders)).refunds() == [{"order_id": "1042", "amount": 39.9}]


async def test_a_deferred_tool_waits_parked_for_a_person_across_a_crash(
    host: Host, tmp_path: Path
) -> None:
    log = tmp_path / "requests.log"
    support, ticket = _support(tmp_path, log)
    async with host(workflows=[support]) as t:
        run = await t.start(support, "t-2", ticket)
        asked = None
        async for event in events(run.stream("answer")):
            if isinstance(event, DeferredToolRequestsEvent):
                asked = event.requests.approvals[0]
                break
        assert asked is not None
        assert (asked.tool_name, asked.args_as_dict()) == (
            "refund",
            {"order_id": "1042", "amount": 39.9},
        )
        # A week with no answer: the run waits, parked, and survives a crash.
        await t.advance("7d")
        await t.crash()
        assert (await run.describe()).status == fusee.RunStatus.SUSPENDED
        await run.signal(DECISIONS, Decisions(approve=[asked.tool_call_id]))
        assert await run.result() == ANSWER
        assert_steps_ran_once(t)
    # Each model request was made once per durable position (its message count).
    assert log.read_text().split() == ["1", "3", "5"]
    assert len(OrderService(Path(ticket.orders)).refunds()) == 1


async def test_a_denied_tool_call_is_not_made_and_the_model_is_told_why(
    host: Host, tmp_path: Path
) -> None:
    support, ticket = _support(tmp_path)
    async with host(workflows=[support]) as t:
        run = await t.start(support, "t-3", ticket)
        seen = await _read_and_approve(run, deny=True)
        assert await run.result() == "Done: refunds need a receipt. Anything else?"
        assert ("function_tool_result", "refunds need a receipt") in seen
        await t.crash()
        assert await run.result() == "Done: refunds need a receipt. Anything else?"
        assert_steps_ran_once(t)
    assert OrderService(Path(ticket.orders)).refunds() == []


async def test_an_answer_never_sent_fails_the_run_past_its_timeout(tmp_path: Path) -> None:
    agent = build_agent(ScriptedModel().model())

    @fusee.workflow("impatient")
    async def impatient(ctx: fusee.Ctx, ticket: Ticket) -> str:
        deps = OrderService(Path(ticket.orders))
        result = await run_agent(ctx, agent, ticket.question, deps=deps, decisions_timeout="1d")
        return str(result.output)

    async with TestEngine(workflows=[impatient]) as t:
        run = await t.start(impatient, "t-4", Ticket(QUESTION, str(tmp_path / "o.json")))
        with pytest.raises(fusee.WorkflowFailed, match=r"no 'fusee.agent.decisions' signal came"):
            await run.result()


async def test_a_crash_anywhere_gives_the_same_answer_and_stream(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    support, ticket = _support(tmp_path, log)
    readers = Readers(_read_and_approve)
    assert await crash_everywhere(support, ticket, id="t-5", drive=readers.drive) == ANSWER
    await readers.close()
    # Every reader that read to the end saw every event once, whatever the
    # crash interrupted (a model request between two of its chunks, too).
    assert len(readers.reads) > len(SUPPORT_STEPS)
    assert all(read == SUPPORT_EVENTS for read in readers.reads)
    # Each run of the workflow asked the model once per durable position; a
    # crash repeated at most the one request it interrupted (not recorded yet).
    runs = len(readers.engines)
    requests = Counter(log.read_text().split())
    assert set(requests) == {"1", "3", "5"}
    assert all(n >= runs for n in requests.values())
    assert sum(requests.values()) <= 3 * runs + (runs - 1)


# --- retries and failures -------------------------------------------------------------------------


def _one_tool_model(tool: str, args: dict[str, Any]) -> FunctionModel:
    """Calls ``tool`` until it returns, then answers with what it returned."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"got {last.content}")])
        return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id="c1")])

    return function_model(reply)


def _agent_workflow(
    name: str,
    model: FunctionModel,
    tools: FunctionToolset[None],
    *,
    stream: str | None = "agent",
    deferred: bool = False,
    tool_retry: fusee.Retry | None = None,
) -> fusee.WorkflowDef[None, str]:
    """A workflow named ``name`` that runs an agent of the same name on ``model`` and ``tools``."""
    agent = Agent(
        model,
        name=name,
        toolsets=[tools],
        output_type=[str, DeferredToolRequests] if deferred else str,
        capabilities=[FuseeDurability(tool_retry=tool_retry)],
    )

    @fusee.workflow(name)
    async def run(ctx: fusee.Ctx) -> str:
        return str((await run_agent(ctx, agent, "go", stream=stream)).output)

    return run


async def test_a_tool_asking_for_a_retry_sends_the_model_back_with_steps_recorded(
    host: Host,
) -> None:
    calls: list[int] = []
    tools = FunctionToolset(id="maths")

    @tools.tool_plain
    def half(n: int) -> int:
        calls.append(n)
        if n % 2:
            raise ModelRetry("n must be even")
        return n // 2

    prompts: list[str] = []

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart) and last.outcome == "retried":
            prompts.append(str(last.content))
            return ModelResponse(parts=[ToolCallPart("half", {"n": 8})])
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"half is {last.content}")])
        return ModelResponse(parts=[ToolCallPart("half", {"n": 7})])

    calc = _agent_workflow("calc", FunctionModel(reply), tools, stream=None)

    async with host(workflows=[calc]) as t:
        run = await t.start(calc, "c-1")
        assert await run.result() == "half is 4"
        assert calls == [7, 8]
        assert len(prompts) == 1
        assert "n must be even" in prompts[0]
        assert (await step_names(t.store, "c-1")).count(
            "calc__function_toolset__maths.call_tool:half"
        ) == 2
        await t.crash()
        assert await run.result() == "half is 4"
        assert calls == [7, 8]
        assert_steps_ran_once(t)


def _stock_workflow(
    fails: int, retry: fusee.Retry | None
) -> tuple[fusee.WorkflowDef[None, str], list[int]]:
    attempts: list[int] = []
    tools = FunctionToolset(id="stock")

    @tools.tool_plain
    async def count(sku: str) -> int:
        attempts.append(len(attempts) + 1)
        if len(attempts) <= fails:
            raise ConnectionError("the stock service is down")
        return 3

    model = _one_tool_model("count", {"sku": "kettle"})
    return _agent_workflow("stock", model, tools, stream=None, tool_retry=retry), attempts


async def test_a_raising_tool_is_retried_by_its_steps_policy(host: Host) -> None:
    stock, attempts = _stock_workflow(2, fusee.Retry(attempts=3, initial="1s", on_exhausted="fail"))
    async with host(workflows=[stock]) as t:
        run = await t.start(stock, "s-1")
        assert await run.result() == "got 3"
        assert attempts == [1, 2, 3]
        await t.crash()
        assert await run.result() == "got 3"
        assert attempts == [1, 2, 3]


async def test_a_tool_that_keeps_raising_fails_the_run_with_its_step_named(host: Host) -> None:
    stock, attempts = _stock_workflow(
        99, fusee.Retry(attempts=2, initial="1s", on_exhausted="fail")
    )
    async with host(workflows=[stock]) as t:
        run = await t.start(stock, "s-2")
        with pytest.raises(fusee.WorkflowFailed, match="the stock service is down") as failed:
            await run.result()
        assert "stock__function_toolset__stock.call_tool:count" in str(failed.value)
        assert attempts == [1, 2]
        await t.crash()
        with pytest.raises(fusee.WorkflowFailed, match="the stock service is down"):
            await run.result()
        assert attempts == [1, 2]


async def test_by_default_a_tool_that_keeps_raising_pauses_the_run_for_a_resume() -> None:
    stock, attempts = _stock_workflow(5, None)
    async with TestEngine(workflows=[stock]) as t:
        run = await t.start(stock, "s-3")
        with pytest.raises(
            fusee.RunPaused, match=r"stock__function_toolset__stock\.call_tool:count"
        ):
            await run.result()
        await run.resume()
        assert await run.result() == "got 3"
        assert attempts == [1, 2, 3, 4, 5, 6]


# --- outside a workflow ---------------------------------------------------------------------------


async def test_outside_a_workflow_the_agent_runs_as_usual() -> None:
    agent = Agent(TestModel(), name="plain", capabilities=[FuseeDurability()])
    assert (await agent.run("hi")).output == "success (no tool calls)"


async def test_an_agent_without_the_capability_is_refused_with_what_to_do() -> None:
    agent = Agent(TestModel(), name="bare")

    @fusee.workflow("bare")
    async def bare(ctx: fusee.Ctx) -> str:
        return str((await run_agent(ctx, agent, "hi")).output)

    async with TestEngine(workflows=[bare]) as t:
        run = await t.start(bare, "b-1")
        with pytest.raises(fusee.WorkflowFailed, match=r"capabilities=\[FuseeDurability\(\)\]"):
            await run.result()


async def test_a_reader_reads_the_events_live_while_the_run_waits(tmp_path: Path) -> None:
    support, ticket = _support(tmp_path)
    async with TestEngine(workflows=[support]) as t:
        run = await t.start(support, "t-6", ticket)
        got: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def read() -> None:
            async for event in events(run.stream("answer")):
                await got.put(_shape(event))

        reader = asyncio.ensure_future(read())
        first = [await asyncio.wait_for(got.get(), 10) for _ in range(9)]
        assert first == SUPPORT_EVENTS[:9]
        # The run waits for a person: the reader has all there is, and waits too.
        assert (await run.describe()).status == fusee.RunStatus.SUSPENDED
        assert got.empty()
        async for event in events(run.stream("answer")):
            if isinstance(event, DeferredToolRequestsEvent):
                call = event.requests.approvals[0]
                break
        await run.signal(DECISIONS, Decisions(approve=[call.tool_call_id]))
        await asyncio.wait_for(reader, 10)
        rest = [got.get_nowait() for _ in range(got.qsize())]
        assert first + rest == SUPPORT_EVENTS
        assert await run.result() == ANSWER


async def test_an_external_tool_call_waits_for_its_result_sent_by_a_person(host: Host) -> None:
    tools = FunctionToolset(id="desk")

    @tools.tool_plain
    def ask_manager(question: str) -> str:
        """Asks the shop's manager (an answer comes later, from outside)."""
        raise CallDeferred

    model = _one_tool_model("ask_manager", {"question": "refund a kettle?"})
    desk = _agent_workflow("desk", model, tools, deferred=True)

    async with host(workflows=[desk]) as t:
        run = await t.start(desk, "d-1")
        asked = None
        async for event in events(run.stream("agent")):
            if isinstance(event, DeferredToolRequestsEvent):
                (asked,) = event.requests.calls
                break
        assert asked is not None
        await t.crash()
        await run.signal(DECISIONS, Decisions(results={asked.tool_call_id: "yes, once"}))
        assert await run.result() == "got yes, once"
        await t.crash()
        assert await run.result() == "got yes, once"
        assert_steps_ran_once(t)


async def test_parallel_tool_calls_are_steps_started_together_that_replay_alike() -> None:
    tools = FunctionToolset(id="stock")

    @tools.tool_plain
    async def count(sku: str) -> int:
        return len(sku)

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(" ".join(str(r.content) for r in returns))])
        calls = [ToolCallPart("count", {"sku": sku}, tool_call_id=sku) for sku in ("kettle", "mug")]
        return ModelResponse(parts=calls)

    stock = _agent_workflow("stock", FunctionModel(reply), tools, stream=None)

    # Both calls' steps start in the same turn; a crash anywhere replays
    # them in their recorded order.
    assert await crash_everywhere(stock, id="p-1") == "6 3"


async def test_deferred_calls_may_be_answered_one_signal_at_a_time(host: Host) -> None:
    tools = FunctionToolset(id="mail")
    sent: list[str] = []

    @tools.tool_plain(requires_approval=True)
    def send(to: str) -> str:
        """Sends the customer an email."""
        sent.append(to)
        return f"sent to {to}"

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart("; ".join(str(r.content) for r in returns))])
        calls = [ToolCallPart("send", {"to": to}, tool_call_id=to) for to in ("ann", "bob")]
        return ModelResponse(parts=calls)

    mailer = _agent_workflow("mailer", function_model(reply), tools, deferred=True)

    async with host(workflows=[mailer]) as t:
        run = await t.start(mailer, "m-1")
        async for event in events(run.stream("agent")):
            if isinstance(event, DeferredToolRequestsEvent):
                assert [c.tool_call_id for c in event.requests.approvals] == ["ann", "bob"]
                break
        await run.signal(DECISIONS, Decisions(approve=["ann"]))
        await t.advance("1h")
        # Bob's call is not answered yet: the run goes on waiting.
        assert (await run.describe()).status == fusee.RunStatus.SUSPENDED
        await t.crash()
        await run.signal(DECISIONS, Decisions(deny={"bob": "no mail to bob"}))
        assert await run.result() == "sent to ann; no mail to bob"
        assert sent == ["ann"]
        assert_steps_ran_once(t)


async def test_an_event_stream_handler_gets_each_event_once_inside_its_step() -> None:
    handled: list[str] = []

    async def handler(ctx: RunContext[Any], stream: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in stream:
            # Inside the step that made the event: its attempt is the step's.
            assert fusee.current_step() is not None
            handled.append(event.event_kind)

    tools = FunctionToolset(id="stock")

    @tools.tool_plain
    def count(sku: str) -> int:
        return 3

    agent = Agent(
        _one_tool_model("count", {"sku": "kettle"}),
        name="stock",
        toolsets=[tools],
        capabilities=[FuseeDurability(event_stream_handler=handler)],
    )

    @fusee.workflow("stock")
    async def stock(ctx: fusee.Ctx) -> str:
        return str((await run_agent(ctx, agent, "how many?")).output)

    async with TestEngine(workflows=[stock]) as t:
        run = await t.start(stock, "h-1")
        assert await run.result() == "got 3"
        streamed = [e.event_kind async for e in events(run.stream("agent"))]
        assert handled == streamed
        assert "function_tool_result" in handled
        await t.crash()
        assert await run.result() == "got 3"
        assert handled == streamed
