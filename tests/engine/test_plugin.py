"""The pytest plugin: the ``fusee_engine`` fixture, as a project using fusee sees it."""

from __future__ import annotations

import pytest

import fusee
from fusee.pytest_plugin import EngineFactory
from fusee.store import MemoryStore

pytest_plugins = ["pytester"]

go = fusee.signal("go", int)


@fusee.workflow("hello")
async def hello(ctx: fusee.Ctx, name: str) -> str:
    await ctx.sleep("think", "1h")
    return await ctx.step("greet", lambda: f"hello {name}")


@pytest.mark.asyncio
async def test_the_fixture_makes_test_engines_that_crash_and_recover(
    fusee_engine: EngineFactory,
) -> None:
    t = fusee_engine(workflows=[hello], park_after="1m")
    async with t:
        run = await t.start(hello, "h-1", "ada")
        await t.advance("30m")
        await t.crash()
        assert await run.result() == "hello ada"
        assert len(t.step_log) == 1
    # Keywords go to TestEngine: a store to reopen, with other code.
    store = t.store
    assert isinstance(store, MemoryStore)
    async with fusee_engine(workflows=[hello], store=store) as t2:
        assert await t2.get("h-1").result() == "hello ada"


def test_the_plugin_is_found_through_its_entry_point(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(
        """
        import fusee, pytest

        @fusee.workflow("greet")
        async def greet(ctx: fusee.Ctx, name: str) -> str:
            return await ctx.step("hello", lambda: f"hello {name}")

        @pytest.mark.asyncio
        async def test_greet(fusee_engine) -> None:
            async with fusee_engine(workflows=[greet]) as t:
                assert await t.execute(greet, "g-1", "ada") == "hello ada"
                await t.crash()
                assert await t.get("g-1").result() == "hello ada"
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)


@pytest.mark.asyncio
async def test_a_handle_used_after_its_test_engine_closed_says_so(
    fusee_engine: EngineFactory,
) -> None:
    async with fusee_engine(workflows=[hello]) as t:
        run = await t.start(hello, "h-1", "ada")
    with pytest.raises(fusee.FuseeError, match="this TestEngine is closed"):
        await run.signal(go, 1)
