"""Recovery: reopening replays every unfinished run and resumes its live work.

Every test runs on the memory store and on SQLite. A crash is
`TestEngine.crash()`: everything but the store is lost (on SQLite a new store
object opens the same directory); records not yet durable are lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

import fusee
from fusee import _codec
from fusee.record import ChildDone, Start, decode
from fusee.store import Entry, RunRow, Store

from .conftest import Host, assert_steps_ran_once

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)


async def test_a_step_running_at_the_crash_runs_again_with_the_same_key(host: Host) -> None:
    started = asyncio.Event()
    calls: list[tuple[int, str, int]] = []

    @fusee.workflow("charge")
    async def charge_wf(ctx: fusee.Ctx) -> str:
        async def charge(s: fusee.StepCtx) -> str:
            calls.append((t.crashes, s.key, s.attempt))
            if t.crashes == 0:
                started.set()
                await asyncio.Event().wait()  # the process dies mid-call
            return f"charged {s.key}"

        before = await ctx.step("before", lambda: "ok")
        return f"{before}, {await ctx.step('charge', charge)}"

    async with host(workflows=[charge_wf]) as t:
        run = await t.start(charge_wf, "c-1")
        await asyncio.wait_for(started.wait(), 10)
        await t.crash()
        assert await run.result() == "ok, charged c-1/1/1"
        # Run again after the crash, with the key of the first call.
        assert calls == [(0, "c-1/1/1", 1), (1, "c-1/1/1", 1)]
        await t.crash()
        assert await run.result() == "ok, charged c-1/1/1"
        assert len(calls) == 2


@fusee.workflow("pipeline")
async def pipeline(ctx: fusee.Ctx, n: int) -> list[Any]:
    out: list[Any] = [await ctx.step("a", lambda: n)]
    if n % 3 == 0:
        await ctx.sleep("pause", f"{n + 1}m")
    if n % 3 == 1:
        out.append(await ctx.wait_for(go))
    out.append(await ctx.step("b", lambda: n * 2))
    return out


def _expected(n: int) -> list[Any]:
    return [n, n, n * 2] if n % 3 == 1 else [n, n * 2]


async def test_recovery_resumes_every_unfinished_run_where_it_was(host: Host) -> None:
    async with host(workflows=[pipeline]) as t:
        runs = [await t.start(pipeline, f"p-{n}", n) for n in range(12)]
        await t.advance("4m")
        await t.crash()
        for n in range(1, 12, 3):
            await runs[n].signal(go, n)
        await t.settle()  # a step running at a crash would run again, rightly
        await t.crash()
        assert [await r.result() for r in runs] == [_expected(n) for n in range(12)]
        await t.crash()
        assert [await r.result() for r in runs] == [_expected(n) for n in range(12)]
        assert_steps_ran_once(t)


async def test_recovery_loads_running_runs_and_leaves_parked_ones_parked(host: Host) -> None:
    async with host(workflows=[pipeline], park_after="1m") as t:
        await t.start(pipeline, "sleeper", 9)  # sleeps 10m
        await t.start(pipeline, "waiter", 1)  # waits for a signal
        await t.advance("2m")
        assert not t.is_loaded("sleeper")
        assert not t.is_loaded("waiter")
        busy = await t.start(pipeline, "busy", 4)  # waits for a signal: suspended at once
        running = await t.start(pipeline, "running", 2)  # runs its step
        await t.settle()
        assert (await busy.describe()).status == "suspended"
        await t.crash()
        await t.settle()
        # A suspended run is recovered as a parked one, loaded or not before.
        assert not t.is_loaded("busy")
        assert not t.is_loaded("sleeper")
        assert not t.is_loaded("waiter")
        await busy.signal(go, 4)
        assert await busy.result() == [4, 4, 8]
        assert await running.result() == [2, 4]
        # The parked sleeper wakes at its time, in the engine's new life.
        await t.advance("7m")
        assert not t.is_loaded("sleeper")
        await t.advance("1m")
        assert await t.get("sleeper").result() == [9, 18]


@pytest.mark.expect_engine_errors("run 'v-1' stopped: determinism error")
async def test_a_run_whose_code_changed_stops_with_a_determinism_error(host: Host) -> None:
    @fusee.workflow("versioned")
    async def old(ctx: fusee.Ctx) -> str:
        await ctx.step("a", lambda: 1)
        await ctx.wait_for(go)
        return "old"

    @fusee.workflow("versioned")
    async def new(ctx: fusee.Ctx) -> str:
        await ctx.step("b", lambda: 1)  # was "a": the journal says otherwise
        await ctx.wait_for(go)
        return "new"

    async with host(workflows=[old]) as t:
        await t.start(old, "v-1")
        await t.settle()
        store = t.store
        await t.crash()
    async with host(workflows=[new], store=store) as t2:
        run = t2.get("v-1")
        with pytest.raises(fusee.DeterminismError) as e:
            await run.result()
        assert "'a'" in str(e.value)
        assert "'b'" in str(e.value)
        info = await run.describe()
        assert info.error is not None
        assert "determinism error" in info.error


class _FailingWrites:
    """Makes a store's appends raise while a predicate on the batch holds (a crash there)."""

    def __init__(self, store: Store, fails: Any) -> None:
        self.store = store
        self.fails = fails
        self.real = store.append
        self.failed = 0

    async def append(
        self, entries: Sequence[Entry], runs: Sequence[RunRow] = (), **fence: Any
    ) -> None:
        if self.fails([decode(e.data) for e in entries]):
            self.failed += 1
            raise fusee.StoreError("simulated crash before this write")
        await self.real(entries, runs, **fence)

    def __enter__(self) -> _FailingWrites:
        self.store.append = self.append  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.append = self.real  # type: ignore[method-assign]


@fusee.workflow("kid")
async def kid(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("grow", "1h")
    return await ctx.step("work", lambda: n * 10)


@fusee.workflow("parent")
async def parent(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.child(kid, f"{ctx.info.id}-kid", n) + 1


@pytest.mark.expect_engine_errors("the store failed; runs stop .*: simulated crash")
async def test_a_parked_parent_gets_its_childs_result_after_a_crash_lost_the_delivery(
    host: Host,
) -> None:
    async with host(workflows=[parent, kid], park_after="1m") as t:
        run = await t.start(parent, "p", 4)
        await t.advance("30m")
        assert not t.is_loaded("p")  # parked, waiting for its child
        # The child ends; the parent's record of it is never written.
        store = t.engine.store
        with _FailingWrites(store, lambda recs: any(type(r) is ChildDone for r in recs)) as w:
            await t.advance("30m")
            assert w.failed == 1
        kid_row = await store.get("p-kid")
        assert kid_row is not None
        assert kid_row.status == "completed"
        await t.crash()
        assert await run.result() == 41
        assert_steps_ran_once(t)


@pytest.mark.expect_engine_errors("the store failed; runs stop .*: simulated crash")
async def test_continue_as_new_goes_on_after_a_crash_between_the_two_runs(host: Host) -> None:
    @fusee.workflow("again")
    async def again(ctx: fusee.Ctx, n: int) -> int:
        await ctx.step("tick", lambda: n)
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n

    def new_run_starts(records: list[Any]) -> bool:
        return any(type(r) is Start and r.input != _codec.encode(0) for r in records)

    async with host(workflows=[again]) as t:
        store = t.engine.store
        with _FailingWrites(store, new_run_starts) as w:
            run = await t.start(again, "a-1", 0)
            await t.settle()
            assert w.failed == 1
        row = await store.get("a-1")
        assert row is not None
        assert row.status == "continued"
        await t.crash()
        assert await run.result() == 2
        assert_steps_ran_once(t)


async def test_a_journal_that_ends_under_an_unfinished_row_is_finished_on_load(
    host: Host,
) -> None:
    # The run's end is in its journal but its row never heard of it (a store
    # that lost the row's write): loading it must finish it, not hang.
    async with host(workflows=[parent, kid]) as t:
        run = await t.start(parent, "p", 1)
        await t.advance("2h")
        assert await run.result() == 11
        store = t.engine.store
        row = await store.get("p-kid")
        assert row is not None
        await store.append([], [RunRow(row.id, row.run, row.workflow, "running", row.started_ms)])
        await t.crash()
        assert await t.get("p-kid").result() == 10
        await t.settle()
        assert (await t.get("p-kid").describe()).status == "completed"
        assert await run.result() == 11
