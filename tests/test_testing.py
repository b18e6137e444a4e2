"""Tests of the test host: `fusee.testing.TestEngine` and `crash_everywhere`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import fusee
from fusee.testing import TestEngine

# A bound on the test itself, never a wait: a deadlock fails here instead of
# at the suite's timeout.
DEADLOCK_S = 30


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """An event a blocked step waits on; set at teardown so no thread outlives the test."""
    event = threading.Event()
    yield event
    event.set()


def _blocked_step_workflow(
    released: threading.Event, timeout: str | None
) -> fusee.WorkflowDef[None, str]:
    @fusee.workflow("blocked")
    async def blocked(ctx: fusee.Ctx) -> str:
        got = await ctx.step("wait", lambda: "done" if released.wait() else "", timeout=timeout)
        await ctx.sleep("after", "1m")
        return got

    return blocked


@pytest.mark.parametrize(
    "timeout", [pytest.param(None, id="no-timeout"), pytest.param("1h", id="timeout-1h")]
)
async def test_advance_moves_virtual_time_while_a_step_function_runs(
    released: threading.Event, timeout: str | None
) -> None:
    blocked = _blocked_step_workflow(released, timeout)
    async with TestEngine(workflows=[blocked], step_grace="50ms") as t:
        run = await t.start(blocked, "b-1")
        start = t.clock.now_ms()
        async with asyncio.timeout(DEADLOCK_S):
            await t.advance("2h")
        assert t.clock.now_ms() - start == 2 * 3_600_000
        assert (await run.describe()).status == fusee.RunStatus.RUNNING
        released.set()
        # The step's late result still reaches the run, and its sleep follows.
        assert await run.result() == "done"


async def test_settle_returns_while_a_step_function_runs_and_its_result_comes_later(
    released: threading.Event,
) -> None:
    blocked = _blocked_step_workflow(released, None)
    async with TestEngine(workflows=[blocked], step_grace="50ms") as t:
        run = await t.start(blocked, "b-1")
        async with asyncio.timeout(DEADLOCK_S):
            await t.settle()
        assert t.engine.hooks.busy_steps == 1
        released.set()
        while t.engine.hooks.busy_steps:
            await t.settle()
        await t.advance("1m")
        assert (await run.describe()).status == fusee.RunStatus.COMPLETED
        assert await run.result() == "done"


async def test_settle_waits_for_a_quick_step_function_in_a_thread() -> None:
    @fusee.workflow("quick")
    async def quick(ctx: fusee.Ctx) -> int:
        a = await ctx.step("a", lambda: 1)
        await ctx.sleep("nap", "1s")
        return a + await ctx.step("b", lambda: 1)

    async with TestEngine(workflows=[quick]) as t:
        run = await t.start(quick, "q-1")
        await t.advance("1s")
        assert (await run.describe()).status == fusee.RunStatus.COMPLETED
        assert await run.result() == 2
