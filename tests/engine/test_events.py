"""Events (`fusee.engine._events`): ``ctx.set_event`` journaled, ``run.get_event`` from outside.

Every test on the test host runs on the memory store, SQLite and Postgres,
live and again after a crash, and counts step runs; one runs a real engine
(its wall clock, no time skipping).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.testing import crash_everywhere

from .conftest import Host, assert_steps_ran_once

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)


@dataclasses.dataclass(frozen=True)
class Progress:
    pct: int
    note: str


progress = fusee.event("progress", Progress)


@fusee.workflow("report")
async def report(ctx: fusee.Ctx) -> str:
    await ctx.set_event(progress, Progress(10, "started"))
    await ctx.step("load", lambda: "rows")
    await ctx.sleep("between", "1h")
    ctx.set_event("phase", "writing")  # not awaited: recorded when called
    await ctx.set_event(progress, Progress(90, "writing"))
    await ctx.wait_for(go)
    return "done"


async def test_an_event_set_before_a_crash_is_read_after_it_and_a_later_one_replaces_it(
    host: Host,
) -> None:
    async with host(workflows=[report]) as t:
        run = await t.start(report, "rep-1")
        assert await run.get_event(progress) == Progress(10, "started")
        await t.settle()
        await t.crash()
        assert await run.get_event(progress, timeout="1s") == Progress(10, "started")
        await t.advance("1h")
        await t.crash()
        assert await run.get_event(progress) == Progress(90, "writing")
        assert await run.get_event("phase") == "writing"
        await run.signal(go, 1)
        assert await run.result() == "done"
        # A finished run's events stay readable.
        assert await run.get_event(progress) == Progress(90, "writing")
        assert_steps_ran_once(t)


async def test_get_event_waits_until_the_run_sets_it(host: Host) -> None:
    async with host(workflows=[report]) as t:
        run = await t.start(report, "rep-2")
        before = t.clock.now_ms()
        assert await run.get_event("phase") == "writing"
        # It waited for the run's hour-long sleep, on the virtual clock.
        assert t.clock.now_ms() - before == 3_600_000
        await t.crash()
        assert await run.get_event("phase", timeout=0) == "writing"


async def test_a_waiting_reader_is_woken_by_the_value_becoming_durable(host: Host) -> None:
    async with host(workflows=[report]) as t:
        run = await t.start(report, "rep-3")
        await t.settle()
        reader = asyncio.ensure_future(t.engine.get("rep-3").get_event("phase"))
        # A few loop turns, not a settle: a reader in the test host skips
        # idle virtual time itself once the engine is quiet (as `result()`
        # does), so after a settle it may already have moved the clock to
        # the run's timer and read the value.
        for _ in range(3):
            await asyncio.sleep(0)
        assert not reader.done()
        await t.advance("1h")
        assert await asyncio.wait_for(reader, 5) == "writing"
        await t.crash()
        await run.signal(go, 1)
        assert await run.result() == "done"


async def test_get_event_raises_timeout_error_when_its_timeout_passes_first(host: Host) -> None:
    async with host(workflows=[report]) as t:
        run = await t.start(report, "rep-4")
        before = t.clock.now_ms()
        with pytest.raises(TimeoutError, match="did not set event 'phase' within 600s"):
            await run.get_event("phase", timeout="10m")
        assert t.clock.now_ms() - before == 600_000
        await t.crash()
        with pytest.raises(TimeoutError):
            await run.get_event("phase", timeout=0)


@fusee.workflow("quick")
async def quick(ctx: fusee.Ctx) -> int:
    await ctx.set_event("seen", 1)
    return 1


async def test_a_finished_run_that_never_set_the_key_raises_at_once(host: Host) -> None:
    async with host(workflows=[quick]) as t:
        run = await t.start(quick, "q-1")
        assert await run.result() == 1
        await t.crash()
        with pytest.raises(TimeoutError, match=r"ended \(completed\) without setting event 'x'"):
            await run.get_event("x")
        with pytest.raises(fusee.NotFound):
            await t.get("nobody").get_event("x")


@fusee.workflow("typed")
async def typed(ctx: fusee.Ctx) -> str:
    bad: Any = {"pct": "not a progress"}
    try:
        ctx.set_event(progress, bad)
    except fusee.PayloadError:
        await ctx.set_event("refused", True)
    return "ok"


async def test_a_value_that_does_not_fit_a_typed_key_is_refused_and_nothing_recorded(
    host: Host,
) -> None:
    async with host(workflows=[typed]) as t:
        run = await t.start(typed, "t-1")
        assert await run.result() == "ok"
        await t.crash()
        assert await run.get_event("refused") is True
        with pytest.raises(TimeoutError):
            await run.get_event(progress)


@pytest.mark.expect_engine_errors("recorded setEvent 'a' here but the code called setEvent 'b'")
async def test_replayed_code_that_sets_another_key_is_a_determinism_error(host: Host) -> None:
    @fusee.workflow("keys")
    async def old(ctx: fusee.Ctx) -> str:
        await ctx.set_event("a", 1)
        await ctx.wait_for(go)
        return "old"

    @fusee.workflow("keys")
    async def new(ctx: fusee.Ctx) -> str:
        await ctx.set_event("b", 1)  # was "a": the journal says otherwise
        await ctx.wait_for(go)
        return "new"

    async with host(workflows=[old]) as t:
        await t.start(old, "k-1")
        await t.settle()
        store = t.store
        await t.crash()
    async with host(workflows=[new], store=store) as t2:
        with pytest.raises(fusee.DeterminismError, match=r"setEvent 'a'.*setEvent 'b'"):
            await t2.get("k-1").result()


async def test_the_client_reads_an_event_from_the_store(host: Host) -> None:
    async with host(workflows=[report]) as t:
        await t.start(report, "rep-5")
        await t.advance("1h")
        async with await fusee.Client.connect(t.store) as client:
            run = client.get("rep-5")
            assert await run.get_event(progress) == Progress(90, "writing")
            assert await run.get_event("phase") == "writing"
            with pytest.raises(TimeoutError, match=r"within 0\.01s"):
                await run.get_event("never", timeout=0.01)


async def test_a_reader_of_a_queued_run_waits_for_its_admission(host: Host) -> None:
    # A queued run has no journal yet: its reader waits, as for any unset key.
    q = fusee.Queue("reports", concurrency=1)
    async with host(workflows=[report], queues=[q]) as t:
        first = await t.start(report, "rep-6", queue=q)
        second = await t.start(report, "rep-7", queue=q)
        assert (await second.describe()).status == fusee.RunStatus.QUEUED
        with pytest.raises(TimeoutError, match=r"within 1s"):
            await second.get_event(progress, timeout="1s")
        async with await fusee.Client.connect(t.store) as client:
            with pytest.raises(TimeoutError, match=r"within 0\.01s"):
                await client.get("rep-7").get_event(progress, timeout=0.01)
        await t.crash()
        reader = asyncio.ensure_future(second.get_event(progress))
        await t.settle()
        assert not reader.done()
        await t.advance("1h")
        await first.signal(go, 1)
        assert await first.result() == "done"
        assert await reader == Progress(10, "started")


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx) -> int:
    for i in range(3):
        await ctx.set_event("n", i)
        await ctx.step(f"s{i}", lambda: None)
    return 3


async def test_events_replay_at_every_crash_point() -> None:
    assert await crash_everywhere(counter) == 3


@fusee.workflow("gated_event")
async def gated_event(ctx: fusee.Ctx) -> int:
    n = await ctx.wait_for(go)
    await ctx.set_event("n", n)
    return 0


async def test_on_a_real_engine_a_waiting_reader_is_woken_by_the_durable_event(
    tmp_path: Path,
) -> None:
    async with await fusee.Engine.open(
        tmp_path, workflows=[gated_event], durability="none"
    ) as engine:
        run = await engine.start(gated_event, "g-1")
        reader = asyncio.ensure_future(run.get_event("n", timeout="30s"))
        await asyncio.sleep(0)
        assert not reader.done()
        await run.signal(go, 5)
        assert await asyncio.wait_for(reader, 30) == 5
        assert await run.result() == 0
        # The timeout runs on the wall clock's timers here.
        other = await engine.start(gated_event, "g-2")
        with pytest.raises(TimeoutError, match=r"within 0\.05s"):
            await other.get_event("n", timeout=0.05)
