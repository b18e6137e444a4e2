"""Parking: a suspended run leaves memory after ``park_after`` and is rebuilt by replay.

Every test runs on the memory store and on SQLite. A parked run is one the
engine no longer holds (`TestEngine.is_loaded(id)` is False); whatever can wake it
(a timer, a signal, an update, a cancel, a child's result, an outside
completion, a query) loads it from its journal and delivers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.testing import TestEngine

from .conftest import HeldWrites, Host, assert_steps_ran_once

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
seen_q = fusee.query("seen")
poke = fusee.update("poke", int)

TOKENS: list[str] = []


@fusee.workflow("quick-kid")
async def quick_kid(ctx: fusee.Ctx, n: int) -> int:
    await ctx.wait_for(go)
    return n * 10


@fusee.workflow("sleepy")
async def sleepy(ctx: fusee.Ctx, how: str) -> Any:
    """Counts in memory what it saw: replay must rebuild it after each park."""
    seen: list[str] = [await ctx.step("first", lambda: "first")]
    ctx.on_query(seen_q, lambda _: list(seen))

    def on_poke(n: int) -> int:
        seen.append(f"poke {n}")
        return len(seen)

    ctx.on_update(poke, on_poke)
    try:
        if how == "timer":
            await ctx.sleep("nap", "1h")
            seen.append("timer")
        elif how == "signal":
            seen.append(f"signal {await ctx.wait_for(go)}")
        elif how == "update":
            await ctx.wait_for(go)
        elif how == "child":
            result: int = await ctx.child(quick_kid, "kid", 4)
            seen.append(f"child {result}")
        elif how == "completion":
            got = await ctx.await_completion("ask", lambda s: TOKENS.append(s.token or ""))
            seen.append(f"completion {got}")
        elif how == "query":
            await ctx.wait_for(go)
    except fusee.Cancelled as e:
        seen.append(f"cancelled: {e}")
    seen.append(await ctx.step("last", lambda: "last"))
    return seen


async def _timer(t: TestEngine, run: fusee.Run[Any]) -> None:
    await t.advance("1h")


async def _signal(t: TestEngine, run: fusee.Run[Any]) -> None:
    await run.signal(go, 7)


async def _update(t: TestEngine, run: fusee.Run[Any]) -> None:
    assert await run.update(poke, 3) == 2
    assert t.is_loaded(run.id)
    await t.advance("10s")
    assert not t.is_loaded(run.id)  # parked again
    await run.signal(go, 0)


async def _cancel(t: TestEngine, run: fusee.Run[Any]) -> None:
    await run.cancel("no more")


async def _child(t: TestEngine, run: fusee.Run[Any]) -> None:
    await t.get("kid").signal(go, 1)


async def _completion(t: TestEngine, run: fusee.Run[Any]) -> None:
    await t.complete(TOKENS[-1], "yes")


async def _query(t: TestEngine, run: fusee.Run[Any]) -> None:
    assert await run.query(seen_q) == ["first"]
    await t.advance("10s")
    assert not t.is_loaded(run.id)  # parked again
    await run.signal(go, 0)


WAKES: list[Any] = [
    pytest.param("timer", _timer, ["first", "timer", "last"], id="timer"),
    pytest.param("signal", _signal, ["first", "signal 7", "last"], id="signal"),
    pytest.param("update", _update, ["first", "poke 3", "last"], id="update"),
    pytest.param("signal", _cancel, ["first", "cancelled: no more", "last"], id="cancel"),
    pytest.param("child", _child, ["first", "child 40", "last"], id="child-result"),
    pytest.param("completion", _completion, ["first", "completion yes", "last"], id="completion"),
    pytest.param("query", _query, ["first", "last"], id="query"),
]


@pytest.mark.parametrize("target", ["memory", "sqlite"])
async def test_a_result_awaited_as_its_parked_run_wakes_and_ends_gets_the_end(
    tmp_path: Path, target: str
) -> None:
    # The result's caller reads the row (parked: suspended) while the run
    # wakes and ends: it must not then wait for an end already told. On a
    # real engine: the test host's waits look again by themselves.
    where = "memory" if target == "memory" else str(tmp_path)
    async with await fusee.Engine.open(
        where, workflows=[sleepy, quick_kid], park_after="10ms", durability="none"
    ) as engine:
        run = await engine.start(sleepy, "s-9", "signal")
        while (await run.describe()).status != "suspended" or engine.runs.loaded("s-9"):
            await asyncio.sleep(0.01)
        store = engine.store
        real_get = store.get
        held = asyncio.Event()
        release = asyncio.Event()

        async def get(id: str) -> Any:
            row = await real_get(id)
            if id == "s-9" and not held.is_set():
                held.set()  # the first read, the result's: answered once the run has ended
                await release.wait()
            return row

        store.get = get  # type: ignore[method-assign]
        try:
            waiting = asyncio.ensure_future(run.result())
            await held.wait()
            await run.signal(go, 7)
            while (row := await real_get("s-9")) is None or row.status != "completed":
                await asyncio.sleep(0.001)
            release.set()
            assert await asyncio.wait_for(waiting, 5) == ["first", "signal 7", "last"]
        finally:
            store.get = real_get  # type: ignore[method-assign]


async def test_a_result_asked_while_an_ended_run_is_being_loaded_again_gets_its_end(
    tmp_path: Path,
) -> None:
    # A load of an id whose run has ended here (a message to it, recovery)
    # tells no result waiter when it finds the run ended: the end this engine
    # saw durable answers at once, whatever is loading.
    async with await fusee.Engine.open(
        str(tmp_path), workflows=[sleepy, quick_kid], durability="none"
    ) as engine:
        run = await engine.start(sleepy, "s-8", "signal")
        await run.signal(go, 7)
        assert await run.result() == ["first", "signal 7", "last"]
        real = engine.runs.is_loading
        engine.runs.is_loading = lambda id: True  # type: ignore[method-assign]
        try:
            assert await asyncio.wait_for(run.result(), 5) == ["first", "signal 7", "last"]
        finally:
            engine.runs.is_loading = real  # type: ignore[method-assign]


@pytest.mark.parametrize(("how", "wake", "expected"), WAKES)
@pytest.mark.parametrize("crash", [False, True], ids=["live", "crash-while-parked"])
async def test_a_parked_run_is_rebuilt_by_replay_when_something_arrives(
    host: Host,
    how: str,
    wake: Callable[[TestEngine, fusee.Run[Any]], Awaitable[None]],
    expected: list[str],
    crash: bool,
) -> None:
    async with host(workflows=[sleepy, quick_kid], park_after="5s") as t:
        run = await t.start(sleepy, "s-1", how)
        await t.advance("4s")
        assert t.is_loaded("s-1")  # not before park_after
        await t.advance("2s")
        assert not t.is_loaded("s-1")
        assert (await run.describe()).status == "suspended"
        if crash:
            await t.crash()
            await t.settle()
            assert not t.is_loaded("s-1")  # parked runs stay parked on reopen
        await wake(t, run)
        assert await run.result() == expected
        await t.crash()
        assert await run.result() == expected
        assert_steps_ran_once(t)


async def test_a_run_with_a_step_in_flight_or_due_is_not_parked(host: Host) -> None:
    @fusee.workflow("retrying")
    async def retrying(ctx: fusee.Ctx) -> str:
        def down(s: fusee.StepCtx) -> str:
            if s.attempt < 3:
                raise ConnectionError("down")
            return "up"

        return await ctx.step("call", down, retry=fusee.Retry(initial="10s", backoff=1.0))

    async with host(workflows=[retrying], park_after="1s") as t:
        run = await t.start(retrying, "r-1")
        await t.advance("5s")
        assert t.is_loaded("r-1")  # waiting for a retry is not suspended
        await t.crash()
        await t.advance("5s")
        assert t.is_loaded("r-1")
        assert await run.result() == "up"
        assert len(t.step_log) == 3


async def test_a_parked_run_wakes_at_its_time_after_reopening(host: Host) -> None:
    @fusee.workflow("alarm")
    async def alarm(ctx: fusee.Ctx) -> str:
        got = await ctx.wait_for(go, timeout="1h")
        return "timed out" if got is None else f"got {got}"

    async with host(workflows=[alarm], park_after="1m") as t:
        run = await t.start(alarm, "a-1")
        await t.advance("10m")
        assert not t.is_loaded("a-1")
        await t.crash()
        await t.advance("49m")
        assert not t.is_loaded("a-1")
        assert (await run.describe()).status == "suspended"
        await t.advance("1m")
        assert await run.result() == "timed out"


async def test_many_parked_runs_cost_no_memory_and_all_wake(host: Host) -> None:
    async with host(workflows=[quick_kid], park_after="1s") as t:
        runs = [await t.start(quick_kid, f"k-{i}", i) for i in range(30)]
        await t.advance("2s")
        assert all(not shard.runs for shard in t.engine.runs.shards)
        await t.crash()
        await t.settle()
        assert all(not shard.runs for shard in t.engine.runs.shards)
        for r in runs:
            await r.signal(go, 0)
        assert [await r.result() for r in runs] == [i * 10 for i in range(30)]


async def test_a_run_woken_while_its_park_is_being_written_is_still_recovered(
    host: Host,
) -> None:
    crashed = asyncio.Event()

    async def ship() -> str:
        if not crashed.is_set():
            await asyncio.Event().wait()  # the process dies while this runs
        return "shipped"

    @fusee.workflow("shipper")
    async def shipper(ctx: fusee.Ctx) -> str:
        await ctx.wait_for(go)
        return await ctx.step("ship", ship)

    async with host(workflows=[shipper], park_after="1s") as t:
        run = await t.start(shipper, "s-1")
        await t.settle()
        with HeldWrites(t.engine.store) as disk:
            # The park's "suspended" row is written, slowly...
            t.clock.advance_to(t.clock.now_ms() + 1000)
            await asyncio.wait_for(disk.waiting.wait(), 10)
            assert not t.is_loaded("s-1")
            # ...while a signal wakes the run: it must not stay "suspended".
            signal = asyncio.ensure_future(run.signal(go, 1))
            for _ in range(100):
                await asyncio.sleep(0)
            disk.release()
            await signal
        await t.crash()
        crashed.set()
        assert await run.result() == "shipped"
