"""`fusee event ID KEY`: a run's latest value of an event, read from a store an engine writes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import fusee

from .conftest import acli, one_line_error

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)


@fusee.workflow("progressing")
async def progressing(ctx: fusee.Ctx) -> str:
    await ctx.set_event("progress", {"pct": 40})
    n = await ctx.wait_for(go)
    await ctx.set_event("final", n)
    await ctx.set_event("progress", {"pct": 100})
    return "done"


async def test_event_prints_the_latest_value_and_waits_with_wait(tmp_path: Path) -> None:
    data = str(tmp_path)
    async with await fusee.Engine.open(data, workflows=[progressing], durability="none") as engine:
        run = await engine.start(progressing, "p-1")
        assert await run.get_event("progress") == {"pct": 40}
        code, out, _ = await acli("event", "p-1", "progress", "--data", data)
        assert (code, json.loads(out)) == (0, {"pct": 40})

        code, _, err = await acli("event", "p-1", "final", "--data", data)
        assert code == 1
        assert "has not set event 'final' yet" in one_line_error(err)
        code, _, err = await acli(
            "event", "p-1", "final", "--wait", "--timeout", "0.05", "--data", data
        )
        assert code == 1
        assert "within 0.05s" in one_line_error(err)

        argv = ["event", "p-1", "final", "--wait", "--timeout", "30", "--data", data, "--json"]
        waiter = asyncio.create_task(acli(*argv))
        await run.signal(go, 7)
        code, out, _ = await asyncio.wait_for(waiter, 30)
        assert (code, json.loads(out)) == (0, {"id": "p-1", "run": 1, "key": "final", "value": 7})
        assert await run.result() == "done"

    code, out, _ = await acli("event", "p-1", "progress", "--data", data)
    assert (code, json.loads(out)) == (0, {"pct": 100})
    code, _, err = await acli("event", "p-1", "never", "--wait", "--data", data)
    assert code == 1
    assert "ended (completed) without setting event 'never'" in one_line_error(err)
