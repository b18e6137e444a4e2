"""A real kill: an agent run's worker process is SIGKILLed in the middle of a tool call.

The worker (agent_worker.py) serves a support agent, pydantic-ai's or the
OpenAI Agents SDK's, on an SQLite store; a reader in this process reads the
run's events through a `fusee.Client` (and approves the refund when
pydantic-ai's agent asks). The worker is killed once the refund is made but
before its step's result is durable, then started again. The model's
request log and the order service live in files, outside the worker, so
they count across its lives.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import DeferredToolRequestsEvent

import fusee
from examples.agent_support import OrderService
from fusee.contrib import openai_agents, pydantic_ai

from . import openai_support, test_openai_agents
from . import test_pydantic_ai as pa

WORKER = Path(__file__).with_name("agent_worker.py")
ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """One life of the worker process, and the lines it printed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            await self.lines.put(line.decode().strip())

    async def until(self, prefix: str) -> str:
        while True:
            line = await asyncio.wait_for(self.lines.get(), 60)
            if line.startswith(prefix):
                return line


async def _spawn(tmp_path: Path, library: str, *args: str) -> Worker:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    with (tmp_path / "worker.log").open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            library,
            str(tmp_path / "store"),
            str(tmp_path / "orders.json"),
            str(tmp_path / "requests.log"),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env,
        )
    return Worker(proc)


async def _read_pydantic_ai(run: fusee.Run[Any]) -> list[Any]:
    seen = []
    async for event in pydantic_ai.events(run.stream("answer")):
        seen.append(pa._shape(event))
        if isinstance(event, DeferredToolRequestsEvent):
            (call,) = event.requests.approvals
            answer = pydantic_ai.Decisions(approve=[call.tool_call_id])
            await run.signal(pydantic_ai.DECISIONS, answer, dedup="ok")
    return seen


async def _read_openai_agents(run: fusee.Run[Any]) -> list[Any]:
    return [
        test_openai_agents._shape(event)
        async for event in openai_agents.events(run.stream("agent"))
    ]


Reader = Callable[[fusee.Run[Any]], Awaitable[list[Any]]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("library", "read", "answer", "seen", "requests"),
    [
        pytest.param(
            "pydantic-ai",
            _read_pydantic_ai,
            pa.ANSWER,
            pa.SUPPORT_EVENTS,
            ["1", "3", "5"],
            id="pydantic-ai",
        ),
        pytest.param(
            "openai-agents",
            _read_openai_agents,
            openai_support.ANSWER,
            test_openai_agents.EVENTS,
            ["1", "3", "5", "7"],
            id="openai-agents",
        ),
    ],
)
async def test_a_killed_agent_run_repeats_no_recorded_request_and_streams_each_event_once(
    tmp_path: Path,
    library: str,
    read: Reader,
    answer: str,
    seen: list[Any],
    requests: list[str],
) -> None:
    first = await _spawn(tmp_path, library, "hang")
    await first.until("STARTED")
    client = await fusee.Client.connect(tmp_path / "store")
    try:
        run = client.get("ticket-1")
        reader = asyncio.ensure_future(read(run))
        # The refund is made; its step's result is not durable: kill.
        key = (await first.until("REFUNDED")).split()[1]
        first.proc.send_signal(signal.SIGKILL)
        assert await first.proc.wait() == -signal.SIGKILL
        await first.reader

        second = await _spawn(tmp_path, library)
        # The refund's step runs again, with the same idempotency key.
        assert await second.until("REFUNDED") == f"REFUNDED {key}"
        assert await second.until("RESULT") == f"RESULT {answer}"
        assert await asyncio.wait_for(second.proc.wait(), 60) == 0
        await second.reader
        assert await run.result() == answer
        # The reader read through the kill: every event once, none missing.
        assert await asyncio.wait_for(reader, 60) == seen
    finally:
        await client.close()
    # No model request whose result was recorded was made again.
    assert (tmp_path / "requests.log").read_text().split() == requests
    assert OrderService(tmp_path / "orders.json").refunds() == [
        {"order_id": "1042", "amount": 39.9}
    ]
