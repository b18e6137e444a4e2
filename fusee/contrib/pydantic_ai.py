"""A pydantic-ai ``Agent`` run durably inside a fusee workflow.

`FuseeDurability` is a pydantic-ai durability capability (the public
``pydantic_ai.durable_exec`` extension point): each model request, tool
call, MCP ``get_tools``/``call_tool`` and event hand-off of an agent run
becomes a fusee step named after the agent and the toolset's id. A model
object never enters a step: the request carries a model id that the step
looks up in the capability's registry (``models=``). Messages and
``ModelResponse`` values are journaled as JSON through pydantic and validated
back on replay.

`run_agent` runs the agent inside a workflow: its events (text deltas, tool
calls, results) are appended to a fusee stream while the run runs, so
``run.stream(name)`` reads them live, and a run that waits on a person for
deferred tools parks on ``ctx.wait_for(decisions)``.

The rule: nothing here holds run state outside the workflow's own
journal; what a step appends to the stream is the engine's to deduplicate
(a step that runs again continues after the chunks it recorded).
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

import pydantic
from pydantic_ai import (
    AgentStreamEvent,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolDenied,
)
from pydantic_ai.agent import AbstractAgent, EventStreamHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalCallableOperationBackend,
    RoleBasedOperationConfig,
    conversation_id_from_run_id,
)
from pydantic_ai.models import Model
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT

import fusee
from fusee.contrib._decisions import DECISIONS, Decisions, wait_for_decisions
from fusee.errors import FuseeError

__all__ = [
    "DECISIONS",
    "Decisions",
    "FuseeDurability",
    "events",
    "run_agent",
]

OutputT = TypeVar("OutputT")

_EVENT: pydantic.TypeAdapter[AgentStreamEvent] = pydantic.TypeAdapter(AgentStreamEvent)


def _results(answer: Decisions) -> DeferredToolResults:
    """A person's answer in pydantic-ai's form, for ``agent.run(deferred_tool_results=...)``."""
    approvals: dict[str, bool | ToolDenied] = dict.fromkeys(answer.approve, True)
    approvals.update({id: ToolDenied(message) for id, message in answer.deny.items()})
    return DeferredToolResults(calls=dict(answer.results), approvals=dict(approvals))


@dataclass(frozen=True, slots=True)
class _Scope:
    """Workflow side: the run `run_agent` serves (its Ctx) and where its events go."""

    ctx: fusee.Ctx
    stream: str | None


@dataclass(frozen=True, slots=True)
class _Unit:
    """Step side: the attempt of the step running a durable unit, and the events' stream."""

    step: fusee.StepCtx
    stream: str | None


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "fusee_pydantic_ai_scope", default=None
)
_UNIT: contextvars.ContextVar[_Unit | None] = contextvars.ContextVar(
    "fusee_pydantic_ai_unit", default=None
)

_StepConfig = fusee.Retry | None


class _StepBackend(JournalCallableOperationBackend[_StepConfig]):
    """Runs each durable unit of an agent as one fusee step, named by pydantic-ai's journal rule."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: _StepConfig,
    ) -> object:
        scope = _in_scope()

        async def unit(s: fusee.StepCtx) -> Any:
            # The unit's code is not in the workflow any more: what it calls
            # (a model, a tool) runs directly, not as another step.
            outer = _SCOPE.set(None)
            token = _UNIT.set(_Unit(s, scope.stream))
            try:
                return await body()
            finally:
                _UNIT.reset(token)
                _SCOPE.reset(outer)

        return await scope.ctx.step(name, unit, retry=config)


def _in_scope() -> _Scope:
    scope = _SCOPE.get()
    if scope is None:
        raise FuseeError(
            "a durable agent ran outside fusee.contrib.pydantic_ai.run_agent; "
            "inside a workflow, call `await run_agent(ctx, agent, prompt)`"
        )
    return scope


class FuseeDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes a pydantic-ai agent durable in fusee workflows: its I/O becomes steps.

    Outside `run_agent` the agent runs as usual, with no step.

    Args:
        models: Models by id, for runs that pick one at run time
            (``agent.run(model="fast")``); the agent's own is ``"default"``.
            Only the id crosses into a step.
        name: The agent's name in step names (defaults to the agent's ``name``).
        model_retry: How a failing model request is retried (fusee's default
            `fusee.Retry` when None).
        tool_retry: How a failing tool call (or MCP call) is retried.
        event_stream_handler: Also given every event, inside the step that
            produced it.

    Example:
        >>> from pydantic_ai import Agent
        >>> from pydantic_ai.models.test import TestModel
        >>> agent = Agent(TestModel(), name="helper", capabilities=[FuseeDurability()])
        >>> agent.name
        'helper'
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="fusee",
        durable_unit_noun="step",
        durable_container_noun="workflow",
        # A step's result is journaled as msgpack: values go in as JSON and
        # come back validated by pydantic, the same live and on replay.
        codec=JSON_CODEC,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        # Each MCP step opens its own session (its connecting is retried with
        # it), as Temporal's activities do: a session held for the run would
        # be opened in a step's task and closed by workflow code, on another
        # event loop, and workflow code may start no subprocess or socket.
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-outside-durable",
            "dynamic": "enter-never",
        },
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        journal_discovery=True,
        # The workflow's loop is deterministic: parallel tool calls start
        # their steps in the same order on replay.
        sequential_tools_in_durable_context=False,
        # No per-tool config in tool metadata: every tool's step has
        # `tool_retry`, so no tool can leave the journal by a metadata flag.
        tool_config_key=None,
    )

    def __init__(
        self,
        *,
        models: Mapping[str, Model] | None = None,
        name: str | None = None,
        model_retry: fusee.Retry | None = None,
        tool_retry: fusee.Retry | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
    ) -> None:
        super().__init__(models=models, event_stream_handler=self._to_stream, name=name)
        self._user_handler = event_stream_handler
        self._model_retry = model_retry
        self._tool_retry = tool_retry

    @property
    def in_durable_context(self) -> bool:
        return _SCOPE.get() is not None

    @property
    def has_wrap_run_event_stream(self) -> bool:
        # Events are streamed (and model requests made streaming) only when
        # someone reads them: the run's stream, or the user's handler.
        scope = _SCOPE.get()
        return self._user_handler is not None or (scope is not None and scope.stream is not None)

    def get_durable_operation_backend(self) -> JournalCallableOperationBackend[_StepConfig]:
        return _StepBackend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(
                model=self._model_retry,
                event=None,
                capability=None,
                tool=self._tool_retry,
            ),
        )

    def get_default_run_id(self) -> str | None:
        scope = _SCOPE.get()
        # A recorded uuid: an agent run keeps its id after a crash.
        return f"{scope.ctx.info.id}:{scope.ctx.uuid4()}" if scope is not None else None

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    def get_run_clock(self) -> Callable[[], datetime] | None:
        scope = _SCOPE.get()
        return scope.ctx.now if scope is not None else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        scope = _SCOPE.get()
        return scope.ctx.now() if scope is not None else None

    async def _to_stream(
        self, ctx: RunContext[AgentDepsT], stream: AsyncIterable[AgentStreamEvent]
    ) -> None:
        # Called inside the step of a model request (its live events) or of
        # an event of the run (a tool call, its result): each event is a
        # chunk the step appends, which the engine skips when the step runs
        # again after it recorded it.
        unit = _UNIT.get()
        out = unit.step.stream(unit.stream) if unit is not None and unit.stream else None

        async def chunks() -> AsyncIterator[AgentStreamEvent]:
            async for event in stream:
                if out is not None:
                    await out.append(_EVENT.dump_python(event, mode="json"))
                yield event

        async with out if out is not None else nullcontext():
            if self._user_handler is not None:
                await self._user_handler(ctx, chunks())
            else:
                async for _ in chunks():
                    pass


def _capability(agent: AbstractAgent[Any, Any]) -> None:
    if FuseeDurability.from_agent(agent) is None:
        raise FuseeError(
            f"agent {agent.name!r} has no FuseeDurability capability, so its model requests "
            "and tool calls would not be steps; build it with "
            "Agent(..., capabilities=[FuseeDurability()])"
        )


async def run_agent(
    ctx: fusee.Ctx,
    agent: AbstractAgent[AgentDepsT, OutputT],
    user_prompt: str | Sequence[Any] | None = None,
    *,
    stream: str | None = "agent",
    decisions: fusee.SignalDef[Decisions] | None = DECISIONS,
    decisions_timeout: str | float | None = None,
    **kwargs: Any,
) -> AgentRunResult[OutputT]:
    """Runs ``agent`` inside the workflow of ``ctx``: its model requests and tool calls are steps.

    Its events stream live to ``run.stream(stream)`` (read them typed with
    `events`); each is seen once, even across a crash. When the agent defers
    tool calls (tools that need approval, or external ones), the run waits
    for ``decisions`` (parked, for days if need be) and goes on with them.

    Args:
        ctx: The workflow's context.
        agent: An agent built with the `FuseeDurability` capability.
        user_prompt: The prompt, as for ``agent.run``.
        stream: The stream the run's events go to (None: none); one per
            `run_agent` call in a run.
        decisions: The signal that answers deferred tool calls (None: the
            run returns the `DeferredToolRequests` as its output instead).
        decisions_timeout: How long to wait for ``decisions``; past it, the
            run raises `fusee.FuseeError`.
        **kwargs: Passed to ``agent.run`` (``deps``, ``message_history``,
            ``model``, ``output_type``, ...).

    Returns:
        The agent run's result; its output is a `DeferredToolRequests` only
        when ``decisions`` is None.

    Example:
        >>> from pydantic_ai import Agent
        >>> from pydantic_ai.models.test import TestModel
        >>> agent = Agent(TestModel(), name="helper", capabilities=[FuseeDurability()])
        >>> @fusee.workflow("ask")
        ... async def ask(ctx: fusee.Ctx, question: str) -> str:
        ...     result = await run_agent(ctx, agent, question)
        ...     return str(result.output)
    """
    _capability(agent)
    token = _SCOPE.set(_Scope(ctx, stream))
    try:
        out: AbstractAsyncContextManager[Any] = (
            ctx.stream(stream) if stream is not None else nullcontext()
        )
        async with out:
            result: AgentRunResult[Any] = await agent.run(user_prompt, **kwargs)
            while decisions is not None and isinstance(result.output, DeferredToolRequests):
                requests = result.output
                pending = {
                    c.tool_call_id: c.tool_name for c in [*requests.approvals, *requests.calls]
                }
                answer = await wait_for_decisions(ctx, decisions, decisions_timeout, pending)
                kwargs["message_history"] = result.all_messages()
                result = await agent.run(deferred_tool_results=_results(answer), **kwargs)
        return cast("AgentRunResult[OutputT]", result)
    finally:
        _SCOPE.reset(token)


async def events(chunks: AsyncIterable[Any]) -> AsyncIterator[AgentStreamEvent]:
    """The agent's events, typed, from the chunks of its stream (``run.stream(name)``).

    Example:
        >>> async def show(run: fusee.Run[str]) -> None:
        ...     async for event in events(run.stream("agent")):
        ...         print(event.event_kind)
    """
    async for chunk in chunks:
        yield _EVENT.validate_python(chunk)
