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


async def _charge_helper(c: fusee.Ctx) -> str:
    return await c.step("charge", lambda: "ch_live")


@fusee.workflow("checkout")
async def checkout(ctx: fusee.Ctx) -> str:
    quote = await ctx.step("quote", lambda: 10)
    charged = await _charge_helper(ctx)
    return f"{quote}:{charged}"


async def test_mock_step_takes_the_workflow_def_and_replaces_the_step() -> None:
    async with TestEngine(workflows=[checkout]) as t:
        t.mock_step(checkout, "charge", lambda: "ch_test")
        assert await t.execute(checkout, "c-1") == "10:ch_test"


async def test_mock_step_takes_the_workflow_name_too() -> None:
    async with TestEngine(workflows=[checkout]) as t:
        t.mock_step("checkout", "quote", lambda: 20)
        assert await t.execute(checkout, "c-1") == "20:ch_live"


def test_mock_step_of_an_unknown_workflow_raises_unknown_workflow() -> None:
    t = TestEngine(workflows=[checkout])
    with pytest.raises(fusee.UnknownWorkflow, match="'chekout' is not one of"):
        t.mock_step("chekout", "charge", lambda: "ch_test")


@pytest.mark.parametrize(
    "step", [pytest.param("charg", id="typo"), pytest.param("refund", id="absent")]
)
def test_mock_step_of_an_unknown_step_raises_naming_the_known_steps(step: str) -> None:
    t = TestEngine(workflows=[checkout])
    with pytest.raises(ValueError, match="its steps are 'charge', 'quote'"):
        t.mock_step(checkout, step, lambda: "ch_test")


def test_mock_step_accepts_any_name_when_step_names_are_computed() -> None:
    @fusee.workflow("computed")
    async def computed(ctx: fusee.Ctx, n: int) -> list[int]:
        return [await ctx.step(f"part-{i}", lambda: 1) for i in range(n)]

    t = TestEngine(workflows=[computed])
    t.mock_step(computed, "part-3", lambda: 2)


def test_mock_step_accepts_any_name_when_ctx_goes_where_code_cannot_be_followed() -> None:
    helpers = {"charge": _charge_helper}

    @fusee.workflow("opaque")
    async def opaque(ctx: fusee.Ctx) -> str:
        return await helpers["charge"](ctx)

    t = TestEngine(workflows=[opaque])
    t.mock_step(opaque, "charge", lambda: "ch_test")
