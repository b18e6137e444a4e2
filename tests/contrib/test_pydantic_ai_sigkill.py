"""A real kill: an agent run's worker process is SIGKILLed in the middle of a tool call.

The worker (agent_worker.py) serves the support agent on an SQLite store; a
reader in this process reads the run's events through a `fusee.Client`, and
approves the refund when it is asked. The worker is killed once the refund
is made but before its step's result is durable, then started again. The
model's request log and the order service live in files, outside the
worker, so they count across its lives.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import DeferredToolRequestsEvent

import fusee
from examples.agent_support import OrderService
from fusee.contrib.pydantic_ai import DECISIONS, Decisions, events

from .test_pydantic_ai import ANSWER, SUPPORT_EVENTS, _shape

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


async def _spawn(tmp_path: Path, *args: str) -> Worker:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    with (tmp_path / "worker.log").open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            str(tmp_path / "store"),
            str(tmp_path / "orders.json"),
            str(tmp_path / "requests.log"),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env,
        )
    return Worker(proc)


async def _read_and_approve(run: fusee.Run[Any]) -> list[tuple[str, Any]]:
    seen = []
    async for event in events(run.stream("answer")):
        seen.append(_shape(event))
        if isinstance(event, DeferredToolRequestsEvent):
            (call,) = event.requests.approvals
            await run.signal(DECISIONS, Decisions(approve=[call.tool_call_id]), dedup="ok")
    return seen


@pytest.mark.timeout(120)
async def test_a_killed_agent_run_repeats_no_recorded_request_and_streams_each_event_once(
    tmp_path: Path,
) -> None:
    first = await _spawn(tmp_path, "hang")
    await first.until("STARTED")
    client = await fusee.Client.connect(tmp_path / "store")
    try:
        run = client.get("ticket-1")
        reader = asyncio.ensure_future(_read_and_approve(run))
        # The refund is made; its step's result is not durable: kill.
        key = (await first.until("REFUNDED")).split()[1]
        first.proc.send_signal(signal.SIGKILL)
        assert await first.proc.wait() == -signal.SIGKILL
        await first.reader

        second = await _spawn(tmp_path)
        # The refund's step runs again, with the same idempotency key.
        assert await second.until("REFUNDED") == f"REFUNDED {key}"
        assert await second.until("RESULT") == f"RESULT {ANSWER}"
        assert await asyncio.wait_for(second.proc.wait(), 60) == 0
        await second.reader
        assert await run.result() == ANSWER
        assert await asyncio.wait_for(reader, 60) == SUPPORT_EVENTS
    finally:
        await client.close()
    # Each model request was made once: none whose result was recorded was made again.
    assert (tmp_path / "requests.log").read_text().split() == ["1", "3", "5"]
    assert OrderService(tmp_path / "orders.json").refunds() == [
        {"order_id": "1042", "amount": 39.9}
    ]
