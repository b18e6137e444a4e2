"""The page's actions go to the serving worker through a Client (`fusee ui`)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

import fusee
from fusee.cli import main
from fusee.engine._run import KEEP_INPUT
from fusee.ui._actions import ClientActions

go = fusee.signal("go", int)


@fusee.workflow("ui-waiter")
async def waiter(ctx: fusee.Ctx) -> int:
    got = await ctx.wait_for(go)
    return got or 0


@fusee.workflow("ui-flaky")
async def flaky(ctx: fusee.Ctx) -> str:
    def boom() -> str:
        raise RuntimeError("down")

    try:
        await ctx.wait_for(go, timeout="1h")
    except fusee.Cancelled:
        return "cancelled"
    return await ctx.step("boom", boom, retry=fusee.Retry(attempts=1))


@pytest.mark.asyncio
async def test_signal_cancel_and_resume_from_the_page_reach_the_run(tmp_path: Path) -> None:
    async with await fusee.Engine.open(
        tmp_path, workflows=[waiter, flaky], durability="none"
    ) as engine:
        signalled = await engine.start(waiter, "w-1")
        cancelled = await engine.start(flaky, "f-1")
        actions = ClientActions(str(tmp_path))
        try:
            await actions.signal("w-1", "go", 5)
            assert await signalled.result() == 5
            await actions.cancel("f-1", "from the page")
            assert await cancelled.result() == "cancelled"
            with pytest.raises(fusee.NotFound):
                await actions.cancel("nobody", "x")
            # A fork at the wait: the copy is the start alone; it waits anew.
            await actions.fork("w-1", "w-2", 0, KEEP_INPUT)
            await actions.signal("w-2", "go", 7)
            assert await engine.get("w-2").result() == 7
        finally:
            await actions.close()


def test_fusee_ui_refuses_another_address_without_a_token(tmp_path: Path) -> None:
    async def make() -> None:
        async with await fusee.Engine.open(tmp_path, workflows=[waiter], durability="none"):
            pass

    asyncio.run(make())
    out, err = io.StringIO(), io.StringIO()
    code = main(["ui", "--data", str(tmp_path), "--host", "0.0.0.0"], stdout=out, stderr=err)
    assert code == 1
    assert "token" in err.getvalue()
