"""The watchdog: workflow code that never yields fails its run with `WatchdogError`; others go on.

Every test runs on the memory store, SQLite and Postgres, live and after a
crash. The watchdog counts real time (it watches the loop's thread), with a
short limit here; nothing in the tests waits for it but the runs' results.
"""

from __future__ import annotations

import sys

import pytest

import fusee

from .conftest import Host, assert_steps_ran_once

pytestmark = [
    pytest.mark.asyncio,
    # A tracer (a debugger, coverage) turns the engine's watchdog off.
    pytest.mark.skipif(sys.gettrace() is not None, reason="the watchdog is off under a tracer"),
]

go = fusee.signal("go", int)


def spin() -> None:
    while True:
        pass


@fusee.workflow("runaway")
async def runaway(ctx: fusee.Ctx, n: int) -> int:
    first = await ctx.step("first", lambda: n)
    await ctx.wait_for(go)
    spin()
    return first


@fusee.workflow("steady")
async def steady(ctx: fusee.Ctx, n: int) -> int:
    got = await ctx.wait_for(go)
    return await ctx.step("add", lambda: n + (got or 0))


async def _fails_with_watchdog_error(run: fusee.Run[int]) -> None:
    with pytest.raises(fusee.WorkflowFailed) as e:
        await run.result()
    assert e.value.type == "WatchdogError"
    assert "workflow code of run 'r-1' has run" in e.value.message
    assert "without yielding" in e.value.message
    # Its stack: the code that did not yield, where it was interrupted.
    assert "in spin" in e.value.message
    assert "in spin" in e.value.traceback


async def test_a_workflow_that_never_yields_fails_with_watchdog_error_and_other_runs_go_on(
    host: Host,
) -> None:
    async with host(workflows=[runaway, steady], watchdog="200ms") as t:
        bad = await t.start(runaway, "r-1", 1)
        good = await t.start(steady, "s-1", 1)
        await t.settle()
        await bad.signal(go, 0)  # it spins from here
        with pytest.raises(fusee.WatchdogError, match="run 'r-1'"):
            await t.settle()  # the test host raises the watchdog's report once
        await _fails_with_watchdog_error(bad)
        await good.signal(go, 10)
        assert await good.result() == 11
        new = await t.start(steady, "s-2", 2)
        await new.signal(go, 1)
        assert await new.result() == 3
        await t.crash()
        await _fails_with_watchdog_error(bad)
        assert await good.result() == 11
        assert_steps_ran_once(t)


async def test_a_run_that_spins_after_a_crash_is_interrupted_there_too(host: Host) -> None:
    async with host(workflows=[runaway, steady], watchdog="200ms") as t:
        bad = await t.start(runaway, "r-1", 1)
        good = await t.start(steady, "s-1", 1)
        await t.settle()
        await t.crash()  # replayed to its wait; it spins once signalled
        await bad.signal(go, 0)
        with pytest.raises(fusee.WatchdogError, match="run 'r-1'"):
            await t.settle()
        await _fails_with_watchdog_error(bad)
        await good.signal(go, 5)
        assert await good.result() == 6
        assert_steps_ran_once(t)
