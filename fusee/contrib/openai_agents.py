"""The OpenAI Agents SDK's ``Runner`` run durably inside a fusee workflow.

`run_agent` runs an ``agents.Agent`` with ``Runner.run`` in workflow code,
on a copy of the agent (and of every agent it hands off to) whose model
calls and function tools are fusee steps:

- a model call is the step ``{agent}__model:{model id}``; the step looks the
  model up by id (a model name goes to the run's model provider; a ``Model``
  object must be registered in ``models=``), so no model object is captured
  by a step, and its ``ModelResponse`` is journaled as JSON;
- a function tool's call is the step ``{agent}__tool:{tool}``;
- a handoff is workflow code: the agent it hands off to is decided by the
  recorded model response, so replay takes the same one.

Each model call streams the model's events while it runs, with the tools'
calls and outputs and the handoffs, to the run's stream (``run.stream``);
`events` reads them typed. A step that runs again (a retry, a crash)
continues after the events it recorded, so a reader sees each once.

The rule: the Runner runs in workflow code, so tracing (which exports from
a thread) is off unless the caller's ``run_config`` turns it on.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import pydantic
from agents import (
    Agent,
    AgentOutputSchemaBase,
    FunctionTool,
    Handoff,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    MultiProvider,
    RunConfig,
    RunContextWrapper,
    Runner,
    RunResult,
    RunState,
    Tool,
    TResponseInputItem,
    Usage,
)
from agents import handoff as make_handoff
from agents.items import TResponseOutputItem, TResponseStreamEvent
from agents.tool_context import ToolContext
from openai.types.responses import ResponseCompletedEvent
from openai.types.responses.response_prompt_param import ResponsePromptParam

import fusee
from fusee.contrib._decisions import DECISIONS, Decisions, wait_for_decisions
from fusee.errors import FuseeError

__all__ = [
    "DECISIONS",
    "ApprovalRequested",
    "Decisions",
    "HandoffEvent",
    "ResponseEvent",
    "ToolCalled",
    "ToolOutput",
    "events",
    "run_agent",
]

TContext = TypeVar("TContext")

_OUTPUT: pydantic.TypeAdapter[list[TResponseOutputItem]] = pydantic.TypeAdapter(
    list[TResponseOutputItem]
)
_STREAM_EVENT: pydantic.TypeAdapter[TResponseStreamEvent] = pydantic.TypeAdapter(
    TResponseStreamEvent
)
_USAGE: pydantic.TypeAdapter[Usage] = pydantic.TypeAdapter(Usage)


@dataclass(frozen=True, slots=True)
class ResponseEvent:
    """An event of a model's reply as it streams (``response.output_text.delta``, ...).

    Example:
        >>> from openai.types.responses import ResponseTextDeltaEvent
        >>> delta = ResponseTextDeltaEvent(
        ...     type="response.output_text.delta", delta="Hi", item_id="m", output_index=0,
        ...     content_index=0, sequence_number=1, logprobs=[])
        >>> ResponseEvent("triage", delta).event.delta
        'Hi'
    """

    agent: str
    event: TResponseStreamEvent


@dataclass(frozen=True, slots=True)
class ToolCalled:
    """A function tool is called (its step starts), with its JSON arguments.

    Example:
        >>> ToolCalled("triage", "lookup_order", '{"order_id": "1042"}').tool
        'lookup_order'
    """

    agent: str
    tool: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A function tool returned ``output`` (its step's result).

    Example:
        >>> ToolOutput("triage", "lookup_order", "shipped").output
        'shipped'
    """

    agent: str
    tool: str
    output: Any


@dataclass(frozen=True, slots=True)
class HandoffEvent:
    """Agent ``source`` handed the conversation to agent ``target``.

    Example:
        >>> HandoffEvent("triage", "refunds").target
        'refunds'
    """

    source: str
    target: str


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """A tool call waits for a person's approval (a tool with ``needs_approval``).

    Answer it with the `DECISIONS` signal, naming its ``call_id``.

    Example:
        >>> ApprovalRequested("refunds", "refund", "call-1", '{"amount": 39.9}').call_id
        'call-1'
    """

    agent: str
    tool: str
    call_id: str
    arguments: str


Event = ResponseEvent | ToolCalled | ToolOutput | HandoffEvent | ApprovalRequested


@dataclass(slots=True)
class _Scope:
    """Workflow side: the run `run_agent` serves, its models, and its open stream."""

    ctx: fusee.Ctx
    provider: ModelProvider
    models: Mapping[str, Model]
    stream: str | None
    out: fusee.WorkflowStream | None
    model_retry: fusee.Retry | None
    tool_retry: fusee.Retry | None


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "fusee_openai_agents_scope", default=None
)


def _in_scope() -> _Scope:
    scope = _SCOPE.get()
    if scope is None:
        raise FuseeError(
            "a durable agent ran outside fusee.contrib.openai_agents.run_agent; "
            "inside a workflow, call `await run_agent(ctx, agent, input)`"
        )
    return scope


def _dump_response(response: ModelResponse) -> dict[str, Any]:
    return {
        "output": _OUTPUT.dump_python(response.output, mode="json"),
        "usage": _USAGE.dump_python(response.usage, mode="json"),
        "response_id": response.response_id,
    }


def _load_response(data: dict[str, Any]) -> ModelResponse:
    return ModelResponse(
        output=_OUTPUT.validate_python(data["output"]),
        usage=_USAGE.validate_python(data["usage"]),
        response_id=data["response_id"],
    )


def _usage_of(response: Any) -> Usage:
    u = response.usage
    if u is None:
        return Usage(requests=1)
    return Usage(
        requests=1,
        input_tokens=u.input_tokens,
        input_tokens_details=u.input_tokens_details,
        output_tokens=u.output_tokens,
        output_tokens_details=u.output_tokens_details,
        total_tokens=u.total_tokens,
    )


class _StepModel(Model):
    """Workflow side: each call of the agent's model is a step that looks the model up by id."""

    def __init__(self, agent: str, model_id: str | None) -> None:
        self._agent = agent
        self._model_id = model_id

    def _resolve(self, scope: _Scope) -> Model:
        if self._model_id is not None and self._model_id in scope.models:
            return scope.models[self._model_id]
        return scope.provider.get_model(self._model_id)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        scope = _in_scope()
        agent = self._agent

        async def unit(s: fusee.StepCtx) -> dict[str, Any]:
            model = self._resolve(scope)
            args = (system_instructions, input, model_settings, tools, output_schema, handoffs)
            kw: dict[str, Any] = {
                "previous_response_id": previous_response_id,
                "conversation_id": conversation_id,
                "prompt": prompt,
            }
            if scope.stream is None:
                return _dump_response(await model.get_response(*args, tracing, **kw))
            # Streamed, so readers see the reply while it comes; each event
            # is a chunk the engine skips when the step runs again after it
            # recorded it.
            async with s.stream(scope.stream) as out:
                done: ModelResponse | None = None
                async for event in model.stream_response(*args, tracing, **kw):
                    await out.append(
                        {"kind": "response", "agent": agent, "event": event.model_dump(mode="json")}
                    )
                    if isinstance(event, ResponseCompletedEvent):
                        r = event.response
                        done = ModelResponse(output=r.output, usage=_usage_of(r), response_id=r.id)
            if done is None:
                raise FuseeError(
                    f"model {self._model_id!r} of agent {agent!r} streamed no "
                    "response.completed event; its reply is incomplete"
                )
            return _dump_response(done)

        name = f"{agent}__model:{self._model_id or 'default'}"
        data = await scope.ctx.step(name, unit, retry=scope.model_retry)
        return _load_response(data)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise FuseeError(
            "Runner.run_streamed is not durable in a workflow; use run_agent(ctx, agent, input), "
            "whose events stream live to run.stream(name)"
        )


def _step_tool(agent: str, tool: FunctionTool) -> FunctionTool:
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(tool_ctx: ToolContext[Any], arguments: str) -> Any:
        scope = _in_scope()

        async def unit(s: fusee.StepCtx) -> Any:
            if scope.stream is None:
                return await invoke(tool_ctx, arguments)
            async with s.stream(scope.stream) as out:
                await out.append(
                    {
                        "kind": "tool_called",
                        "agent": agent,
                        "tool": tool.name,
                        "arguments": arguments,
                    }
                )
                output = await invoke(tool_ctx, arguments)
                await out.append(
                    {"kind": "tool_output", "agent": agent, "tool": tool.name, "output": output}
                )
            return output

        return await scope.ctx.step(f"{agent}__tool:{tool.name}", unit, retry=scope.tool_retry)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


class _Durable:
    """Copies of a run's agents whose models and function tools are steps (one per agent)."""

    def __init__(self, models: Mapping[str, Model]) -> None:
        self._models = models
        self._copies: dict[int, Agent[Any]] = {}

    def model_id(self, agent: Agent[Any]) -> str | None:
        model = agent.model
        if model is None or isinstance(model, str):
            return model
        for id, registered in self._models.items():
            if registered is model:
                return id
        raise FuseeError(
            f"agent {agent.name!r} has a Model object that is not registered, so a step could "
            "not find it again after a crash; pass it as run_agent(..., models={'name': model})"
        )

    def of(self, agent: Agent[Any]) -> Agent[Any]:
        copy = self._copies.get(id(agent))
        if copy is not None:
            return copy
        tools = [
            _step_tool(agent.name, t) if isinstance(t, FunctionTool) else t for t in agent.tools
        ]
        copy = agent.clone(model=_StepModel(agent.name, self.model_id(agent)), tools=tools)
        # Registered before its handoffs are copied: agents may hand off to each other.
        self._copies[id(agent)] = copy
        copy.handoffs = [self._handoff(agent.name, h) for h in agent.handoffs]
        return copy

    def _handoff(self, source: str, target: Agent[Any] | Handoff[Any, Any]) -> Any:
        if isinstance(target, Agent):
            copy = self.of(target)
            return dataclasses.replace(
                make_handoff(copy), on_invoke_handoff=self._announce(source, copy)
            )
        invoke = target.on_invoke_handoff

        async def on_invoke_handoff(ctx: RunContextWrapper[Any], arguments: str) -> Agent[Any]:
            to = self.of(await invoke(ctx, arguments))
            await _announce_handoff(source, to.name)
            return to

        return dataclasses.replace(target, on_invoke_handoff=on_invoke_handoff)

    def _announce(self, source: str, to: Agent[Any]) -> Any:
        async def on_invoke_handoff(ctx: RunContextWrapper[Any], arguments: str) -> Agent[Any]:
            await _announce_handoff(source, to.name)
            return to

        return on_invoke_handoff


async def _announce_handoff(source: str, target: str) -> None:
    # Workflow code: the append is recorded, and replay does not append it again.
    scope = _in_scope()
    if scope.out is not None:
        await scope.out.append({"kind": "handoff", "source": source, "target": target})


async def run_agent(
    ctx: fusee.Ctx,
    agent: Agent[TContext],
    input: str | list[TResponseInputItem],
    *,
    models: Mapping[str, Model] | None = None,
    model_provider: ModelProvider | None = None,
    stream: str | None = "agent",
    model_retry: fusee.Retry | None = None,
    tool_retry: fusee.Retry | None = None,
    run_config: RunConfig | None = None,
    decisions: fusee.SignalDef[Decisions] | None = DECISIONS,
    decisions_timeout: str | float | None = None,
    **kwargs: Any,
) -> RunResult:
    """Runs ``agent`` with ``Runner.run`` in the workflow of ``ctx``; its calls are steps.

    Args:
        ctx: The workflow's context.
        agent: The agent to run (it is copied; the original is not changed).
        input: The input, as for ``Runner.run``.
        models: ``Model`` objects the agents use, by id (an agent whose
            ``model`` is a name needs none: the provider makes it in the step).
        model_provider: Makes models from names (the SDK's default provider
            when None).
        stream: The stream its events go to (None: none, and model calls
            are not streamed); one per `run_agent` call in a run.
        model_retry: How a failing model call is retried (fusee's default
            `fusee.Retry` when None).
        tool_retry: How a failing function tool is retried.
        run_config: As for ``Runner.run``; its ``model_provider`` is used when
            ``model_provider`` is None. Tracing is off unless it turns it on.
        decisions: The signal that answers tool calls waiting for approval
            (None: the run returns with its ``interruptions`` instead).
        decisions_timeout: How long to wait for ``decisions``; past it, the
            run raises `fusee.FuseeError`.
        **kwargs: Passed to ``Runner.run`` (``context``, ``max_turns``, ...).

    Returns:
        The Runner's result.

    Example:
        >>> from agents import Agent
        >>> triage = Agent(name="triage", instructions="Answer briefly.")
        >>> @fusee.workflow("ask")
        ... async def ask(ctx: fusee.Ctx, question: str) -> str:
        ...     result = await run_agent(ctx, triage, question)
        ...     return str(result.final_output)
    """
    config = run_config if run_config is not None else RunConfig(tracing_disabled=True)
    provider = model_provider or config.model_provider or MultiProvider()
    registry = dict(models or {})
    durable = _Durable(registry)
    start = durable.of(agent)
    out: AbstractAsyncContextManager[Any] = (
        ctx.stream(stream) if stream is not None else nullcontext()
    )
    async with out as writer:
        scope = _Scope(ctx, provider, registry, stream, writer, model_retry, tool_retry)
        token = _SCOPE.set(scope)
        try:
            result = await Runner.run(start, input, run_config=config, **kwargs)
            while decisions is not None and result.interruptions:
                state = await _decide(scope, result, decisions, decisions_timeout)
                result = await Runner.run(start, state, run_config=config, **kwargs)
            return result
        finally:
            _SCOPE.reset(token)


async def _decide(
    scope: _Scope,
    result: RunResult,
    decisions: fusee.SignalDef[Decisions],
    timeout: str | float | None,
) -> RunState[Any]:
    """Waits for a person's answer to ``result``'s approvals; the run's state, answered."""
    asked = [(item, getattr(item.raw_item, "call_id", "")) for item in result.interruptions]
    for item, call_id in asked:
        if scope.out is not None:
            arguments = getattr(item.raw_item, "arguments", "")
            await scope.out.append(
                {
                    "kind": "approval",
                    "agent": item.agent.name,
                    "tool": item.tool_name or "",
                    "call_id": call_id,
                    "arguments": arguments,
                }
            )
    calls = {call_id: item.tool_name or "" for item, call_id in asked}
    answer = await wait_for_decisions(scope.ctx, decisions, timeout, calls)
    state = result.to_state()
    for item, call_id in asked:
        if call_id in answer.deny:
            state.reject(item, rejection_message=answer.deny[call_id])
        elif call_id in answer.approve:
            state.approve(item)
    return state


async def events(chunks: AsyncIterable[Any]) -> AsyncIterator[Event]:
    """The run's events, typed, from the chunks of its stream (``run.stream(name)``).

    Example:
        >>> async def show(run: fusee.Run[str]) -> None:
        ...     async for event in events(run.stream("agent")):
        ...         if isinstance(event, ResponseEvent) and event.event.type.endswith(".delta"):
        ...             print(event.event)
    """
    async for chunk in chunks:
        kind = chunk["kind"]
        if kind == "response":
            yield ResponseEvent(chunk["agent"], _STREAM_EVENT.validate_python(chunk["event"]))
        elif kind == "tool_called":
            yield ToolCalled(chunk["agent"], chunk["tool"], chunk["arguments"])
        elif kind == "tool_output":
            yield ToolOutput(chunk["agent"], chunk["tool"], chunk["output"])
        elif kind == "approval":
            yield ApprovalRequested(
                chunk["agent"], chunk["tool"], chunk["call_id"], chunk["arguments"]
            )
        else:
            yield HandoffEvent(chunk["source"], chunk["target"])
