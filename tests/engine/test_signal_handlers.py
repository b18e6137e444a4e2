"""Signal handlers, named and dynamic: live, after a crash and on every store."""

from __future__ import annotations

import pytest

import fusee
from fusee.record import Handled, decode
from fusee.testing import TestEngine, crash_everywhere

from .conftest import Host, assert_steps_ran_once

pytestmark = pytest.mark.asyncio

LIFE = [pytest.param(False, id="live"), pytest.param(True, id="crashed")]

coin = fusee.signal("coin", int)
close = fusee.signal("close", bool)
tally_q = fusee.query("tally")


@fusee.workflow("turnstile")
async def turnstile(ctx: fusee.Ctx) -> dict[str, object]:
    coins: list[int] = []
    notes: list[str] = []

    async def note(name: str, payload: object) -> None:
        # Async: it runs as workflow code, its step recorded where it runs.
        notes.append(await ctx.step("note", lambda: f"{name}={payload}"))

    ctx.on_query(tally_q, lambda _: {"coins": list(coins), "notes": list(notes)})
    # Signals sent while the run sleeps reach the handlers once they are set.
    await ctx.sleep("open", "1m")
    ctx.on_signal(coin, coins.append)
    ctx.on_signal(None, note)
    closed = await ctx.wait_for(close)
    return {"coins": coins, "notes": notes, "closed": closed}


@pytest.mark.parametrize("crash", LIFE)
async def test_named_and_dynamic_handlers_get_their_signals_and_a_wait_keeps_its_own(
    host: Host, crash: bool
) -> None:
    # Defined here, not in the workflow's module: names the workflow does not know.
    colour = fusee.signal("colour", str)
    size = fusee.signal("size", int)
    async with host(workflows=[turnstile]) as t:
        run = await t.start(turnstile, "gate-1")
        await run.signal(coin, 1)
        await run.signal(colour, "red")
        await run.signal(coin, 2)
        await t.settle()
        assert await run.query(tally_q) == {"coins": [], "notes": []}
        await t.advance("1m")
        assert await run.query(tally_q) == {"coins": [1, 2], "notes": ["colour=red"]}
        if crash:
            await t.crash()
        await run.signal(size, 42)
        await run.signal(coin, 5)
        await t.settle()
        assert await run.query(tally_q) == {
            "coins": [1, 2, 5],
            "notes": ["colour=red", "size=42"],
        }
        # The workflow's own `close` goes to its wait, not to the dynamic handler.
        await run.signal(close, True)
        assert await run.result() == {
            "coins": [1, 2, 5],
            "notes": ["colour=red", "size=42"],
            "closed": True,
        }
        await t.crash()
        assert (await run.result())["coins"] == [1, 2, 5]
        assert_steps_ran_once(t)


@fusee.workflow("early-bird")
async def early_bird(ctx: fusee.Ctx) -> list[object]:
    heard: list[object] = []
    ctx.on_signal(None, lambda name, payload: heard.append((name, payload)))
    await ctx.step("prepare", lambda: "ready")
    # `close` came before this wait began: the dynamic handler left it buffered.
    heard.append(await ctx.wait_for(close))
    return heard


async def test_a_signal_the_workflow_waits_for_stays_buffered_for_a_later_wait(
    host: Host,
) -> None:
    async with host(workflows=[early_bird]) as t:
        run = await t.start(early_bird, "bird-1")
        await run.signal(close, False)
        assert await run.result() == [False]


@fusee.workflow("latecomer")
async def latecomer(ctx: fusee.Ctx) -> list[object]:
    # Defined inside the workflow: a name its module does not know.
    late = fusee.signal("late", str)
    heard: list[object] = []
    ctx.on_signal(None, lambda name, payload: heard.append(payload))
    await ctx.sleep("nap", "1m")
    # The dynamic handler took the earlier `late`: this wait does not get it.
    heard.append(await ctx.wait_for(late, timeout="1m"))
    return heard


@pytest.mark.parametrize("crash", LIFE)
async def test_a_signal_the_dynamic_handler_took_is_no_later_waits(host: Host, crash: bool) -> None:
    async with host(workflows=[latecomer]) as t:
        run = await t.start(latecomer, "late-1")
        await run.signal(fusee.signal("late", str), "first")
        await t.settle()
        if crash:
            await t.crash()
        await t.advance("1m")
        await run.signal(fusee.signal("late", str), "second")
        assert await run.result() == ["first", "second"]


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx) -> list[str]:
    calls: list[str] = []

    async def thank(name: str, payload: object) -> None:
        calls.append(f"{name} {payload}")
        await ctx.step("thank", lambda: f"thanks for {payload}")

    ctx.on_signal(coin, lambda n: calls.append(f"coin {n}"))
    ctx.on_signal(None, thank)
    await ctx.step("count", lambda: 0)
    await ctx.sleep("nap", "1m")
    await ctx.wait_for(close)
    await ctx.step("report", lambda: len(calls))
    return calls


async def test_a_replay_calls_the_handlers_in_journal_order_after_a_crash_anywhere() -> None:
    tip = fusee.signal("tip", int)

    async def drive(t: TestEngine, run: fusee.Run[list[str]]) -> None:
        try:
            await run.signal(coin, 1, dedup="c1")
            await run.signal(tip, 5, dedup="t5")
            await run.signal(coin, 2, dedup="c2")
            await run.signal(close, True, dedup="x")
        except fusee.RunFinished:
            return

    assert await crash_everywhere(tally, drive=drive) == ["coin 1", "tip 5", "coin 2"]


@fusee.workflow("fussy", on_error="pause")
async def fussy(ctx: fusee.Ctx) -> int:
    coins: list[int] = []

    def take(n: int) -> None:
        if n < 0:
            raise ValueError(f"a coin of {n}")
        coins.append(n)

    ctx.on_signal(coin, take)
    await ctx.wait_for(close)
    return sum(coins)


@fusee.workflow("strict-fussy")
async def strict_fussy(ctx: fusee.Ctx) -> int:
    return await fussy.fn(ctx)


@pytest.mark.parametrize("crash", LIFE)
async def test_a_handler_that_raises_fails_the_run_or_pauses_it(host: Host, crash: bool) -> None:
    async with host(workflows=[fussy, strict_fussy]) as t:
        failing = await t.start(strict_fussy, "fussy-1")
        pausing = await t.start(fussy, "fussy-2")
        for run in (failing, pausing):
            await run.signal(coin, 3)
            await run.signal(coin, -1)
        with pytest.raises(fusee.WorkflowFailed, match="a coin of -1"):
            await failing.result()
        with pytest.raises(fusee.RunPaused, match="ValueError: a coin of -1"):
            await pausing.result()
        if crash:
            await t.crash()
            with pytest.raises(fusee.WorkflowFailed, match="a coin of -1"):
                await failing.result()
            # Recovered on the same code, it pauses again at the same signal.
            with pytest.raises(fusee.RunPaused, match="a coin of -1"):
                await pausing.result()
        assert (await failing.describe()).status == "failed"
        assert (await pausing.describe()).status == "paused"


@fusee.workflow("relay")
async def relay(ctx: fusee.Ctx, n: int) -> list[str]:
    got: list[str] = []
    ctx.on_signal(coin, lambda c: got.append(f"coin {c}"))
    if n == 0:
        await ctx.wait_for(close)
        ctx.continue_as_new(1)
    # The next run: a coin the handler got in the run before is not carried to it.
    late = await ctx.wait_for(coin, timeout="1m")
    return [*got, f"waited {late}"]


async def test_a_signal_a_handler_got_is_not_carried_by_a_continue_as_new_whatever_the_crash() -> (
    None
):
    async def drive(t: TestEngine, run: fusee.Run[list[str]]) -> None:
        try:
            await run.signal(coin, 1, dedup="c1")
            await run.signal(close, True, dedup="x")
        except fusee.RunFinished:
            return

    assert await crash_everywhere(relay, 0, drive=drive) == ["waited None"]


@pytest.mark.parametrize("crash", LIFE)
async def test_each_signal_a_handler_got_is_marked_once_in_the_journal(
    host: Host, crash: bool
) -> None:
    async with host(workflows=[tally]) as t:
        run = await t.start(tally, "marked-1")
        await run.signal(coin, 1)
        await run.signal(fusee.signal("tip"), 5)
        await t.settle()
        if crash:
            await t.crash()
        await t.advance("1m")
        await run.signal(close, True)
        assert await run.result() == ["coin 1", "tip 5"]
        records = [decode(data) for _, data in await t.store.load("marked-1")]
        assert [r.ordinal for r in records if isinstance(r, Handled)] == [0, 1]
