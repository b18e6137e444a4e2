"""Fixtures and helpers of the contrib tests: the engine tests' `host`, on every store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from engine.conftest import host, store_kind, stores
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import fusee
from fusee.record import Step, decode
from fusee.store import Store
from fusee.testing import TestEngine

__all__ = ["Readers", "Reply", "function_model", "host", "step_names", "store_kind", "stores"]

Reply = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


def function_model(reply: Reply) -> FunctionModel:
    """A pydantic-ai FunctionModel answering with ``reply``, streamed or not."""

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        for i, part in enumerate(reply(messages, info).parts):
            if isinstance(part, TextPart):
                yield part.content
            elif isinstance(part, ToolCallPart):
                args = part.args_as_json_str()
                yield {i: DeltaToolCall(part.tool_name, args, tool_call_id=part.tool_call_id)}

    return FunctionModel(reply, stream_function=stream)


async def step_names(store: Store, id: str) -> list[str]:
    """The names of run ``id``'s recorded steps, in journal order."""
    records = [decode(data) for _, data in await store.load(id)]
    return [r.name for r in records if isinstance(r, Step)]


class Readers:
    """A reader of a run's stream in every life `crash_everywhere` gives the run.

    ``drive`` is `crash_everywhere`'s: it reads with ``read`` until the stream
    ends, and keeps what it read in ``reads``, unless the simulated crash
    ends the life first (a reader would then wait forever). ``engines`` are
    the test engines it was called with: one per run of the workflow.
    """

    def __init__(self, read: Callable[[fusee.Run[Any]], Awaitable[list[Any]]]) -> None:
        self._read = read
        self.reads: list[list[Any]] = []
        self.engines: list[TestEngine] = []
        self._ends: list[asyncio.Future[Any]] = []

    async def drive(self, t: TestEngine, run: fusee.Run[Any]) -> None:
        if not any(e is t for e in self.engines):
            self.engines.append(t)
        reader = asyncio.ensure_future(self._read(run))
        ended = asyncio.ensure_future(run.result())
        self._ends.append(ended)
        await asyncio.wait([reader, ended], return_when=asyncio.FIRST_COMPLETED)
        if not reader.done() and ended.exception() is not None:
            reader.cancel()
            return
        self.reads.append(await reader)

    async def close(self) -> None:
        """Waits for the runs' ends each life asked for (their errors are the crashes')."""
        await asyncio.gather(*self._ends, return_exceptions=True)
