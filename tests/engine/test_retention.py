"""Retention: ``Engine.open(..., retention=)`` and ``run.delete()`` delete finished runs whole.

Every test runs on the memory store, SQLite and Postgres, live and after a
crash (a delete is durable; a run not deleted yet is still there).
"""

from __future__ import annotations

import pytest

import fusee
from fusee.errors import NotFound
from fusee.store import Store

from .conftest import Host

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
progress = fusee.event("progress", int)


@fusee.workflow("report")
async def report(ctx: fusee.Ctx, n: int) -> int:
    ctx.set_attributes({"kind": "report"})
    await ctx.set_event(progress, n)
    total = await ctx.step("sum", lambda: n + 1)
    return total


@fusee.workflow("holder")
async def holder(ctx: fusee.Ctx, n: int) -> int:
    got = await ctx.wait_for(go)
    assert got is not None
    return n + got


@fusee.workflow("parent")
async def parent(ctx: fusee.Ctx, n: int) -> str:
    await ctx.child(holder, f"child-of-{ctx.info.id}", n, detached=True)
    return "left"


async def _gone(store: Store, id: str) -> bool:
    if await store.get(id) is not None:
        return False
    with pytest.raises(NotFound):
        await store.load(id, 1)
    return True


async def test_retention_deletes_the_runs_that_ended_longer_ago_and_keeps_the_others(
    host: Host,
) -> None:
    async with host(workflows=[report, holder], retention="1d") as t:
        assert await t.execute(report, "old", 1) == 2
        await t.advance("12h")
        assert await t.execute(report, "young", 2) == 3
        waiting = await t.start(holder, "waiting", 5)
        await t.advance("13h")
        assert await _gone(t.store, "old")
        assert (await t.get("young").describe()).status == "completed"
        assert (await waiting.describe()).status == "suspended"
        with pytest.raises(NotFound):
            await t.get("old").describe()
        # The deletes are durable; what was not due is there after a restart.
        await t.crash()
        assert await _gone(t.store, "old")
        assert await t.get("young").result() == 3
        await t.advance("12h")
        assert await _gone(t.store, "young")
        # An unfinished run is never deleted, however old.
        await t.advance("3d")
        assert (await waiting.describe()).status == "suspended"
        await waiting.signal(go, 1)
        assert await waiting.result() == 6


async def test_runs_due_while_no_engine_ran_are_deleted_when_one_opens(host: Host) -> None:
    async with host(workflows=[report]) as t:
        for i in range(3):
            await t.execute(report, f"r-{i}", i)
        await t.advance("2d")
        store, now_ms = t.store, t.clock.now_ms()
    async with host(workflows=[report], store=store, start_ms=now_ms, retention="1d") as t:
        await t.settle()
        assert [await _gone(t.store, f"r-{i}") for i in range(3)] == [True] * 3


async def test_a_deleted_runs_id_starts_again_as_a_new_run(host: Host) -> None:
    async with host(workflows=[report]) as t:
        run = await t.start(report, "r-1", 1)
        assert await run.result() == 2
        assert await run.get_event(progress) == 1
        await run.delete()
        assert await _gone(t.store, "r-1")
        with pytest.raises(NotFound):
            await run.result()
        with pytest.raises(NotFound):
            await run.describe()
        await t.crash()
        assert await _gone(t.store, "r-1")
        # The default policy (REJECT) starts it: no run has the id any more.
        again = await t.start(report, "r-1", 10)
        assert await again.result() == 11
        info = await again.describe()
        assert (info.run, info.status, dict(info.attributes)) == (
            1,
            "completed",
            {"kind": "report"},
        )
        await t.crash()
        assert await t.get("r-1").result() == 11


async def test_a_run_not_deleted_before_a_crash_is_there_after_it_and_deletes_then(
    host: Host,
) -> None:
    async with host(workflows=[report]) as t:
        await t.execute(report, "r-1", 1)
        await t.crash()
        assert await t.get("r-1").result() == 2
        await t.get("r-1").delete()
        await t.crash()
        assert await _gone(t.store, "r-1")


async def test_deleting_a_run_that_has_not_finished_is_refused_until_it_is_cancelled(
    host: Host,
) -> None:
    async with host(workflows=[holder]) as t:
        run = await t.start(holder, "h-1", 1)
        await t.settle()
        with pytest.raises(fusee.RunNotFinished, match="cancel it first") as raised:
            await run.delete()
        assert (raised.value.id, raised.value.status) == ("h-1", "suspended")
        await t.crash()
        with pytest.raises(fusee.RunNotFinished):
            await run.delete()
        assert (await run.describe()).status == "suspended"
        await run.cancel("no longer needed")
        with pytest.raises(fusee.Cancelled):
            await run.result()
        await run.delete()
        assert await _gone(t.store, "h-1")
        with pytest.raises(NotFound, match="no run has id 'nobody'"):
            await t.get("nobody").delete()


async def test_a_deleted_parents_running_child_is_kept_until_it_is_finished_and_old(
    host: Host,
) -> None:
    async with host(workflows=[parent, holder], retention="1d") as t:
        assert await t.execute(parent, "p-1", 1) == "left"
        child = t.get("child-of-p-1")
        await t.advance("2d")
        assert await _gone(t.store, "p-1")
        assert (await child.describe()).status == "suspended"
        await t.crash()
        await child.signal(go, 2)
        assert await child.result() == 3
        await t.advance("1d1h")
        assert await _gone(t.store, "child-of-p-1")
