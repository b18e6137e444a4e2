"""Bulk actions on the engine: ``cancel_many``, ``resume_many``, ``fork_many``.

Every test runs on the memory store, SQLite and Postgres, and again after a
crash (what a bulk action did is durable; a second one finds it done).
"""

from __future__ import annotations

import datetime

import pytest

import fusee

from .conftest import Host

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
DOWN: set[str] = set()


@fusee.workflow("holder")
async def holder(ctx: fusee.Ctx, n: int) -> int:
    ctx.set_attributes({"tier": "gold" if n % 2 else "basic"})
    got = await ctx.wait_for(go)
    assert got is not None
    return n + got


@fusee.workflow("pay")
async def pay(ctx: fusee.Ctx, amount: int) -> int:
    id = ctx.info.id
    fee = await ctx.step("fee", lambda: 1)

    def charge() -> int:
        if id in DOWN:
            raise ConnectionError("bank down")
        return amount + fee

    retry = fusee.Retry(attempts=1, on_exhausted="fail" if amount >= 100 else "pause")
    return await ctx.step("charge", charge, retry=retry)


async def test_cancel_many_cancels_each_run_the_filters_match_once(host: Host) -> None:
    async with host(workflows=[holder]) as t:
        runs = [await t.start(holder, f"h-{n}", n) for n in range(4)]
        await t.advance("1h")
        late = await t.start(holder, "h-late", 5)
        await t.settle()
        now = datetime.datetime.fromtimestamp(t.clock.now_ms() / 1000, datetime.UTC)
        gold = await t.engine.cancel_many(
            attributes={"tier": "gold"}, started_to=now - datetime.timedelta(minutes=1)
        )
        assert (gold.done, dict(gold.skipped)) == (("h-1", "h-3"), {})
        await t.crash()
        for run in (runs[1], runs[3]):
            with pytest.raises(fusee.Cancelled):
                await run.result()
        dry = await t.engine.cancel_many(workflow="holder", status="suspended", dry_run=True)
        assert dry.done == ("h-0", "h-2", "h-late")
        rest = await t.engine.cancel_many(workflow="holder", status="suspended", reason="closing")
        assert rest.done == ("h-0", "h-2", "h-late")
        with pytest.raises(fusee.Cancelled, match="closing"):
            await late.result()
        again = await t.engine.cancel_many(workflow="holder", status="suspended")
        assert again.done == ()


async def test_fork_many_forks_failed_runs_at_their_failed_step_and_resume_many_paused_ones(
    host: Host,
) -> None:
    DOWN.update({"p-1", "p-2", "p-3"})
    try:
        async with host(workflows=[pay], on_pause="wait") as t:
            failed = [await t.start(pay, f"p-{n}", 100 * n) for n in (1, 2)]
            paused = await t.start(pay, "p-3", 3)
            for run in failed:
                with pytest.raises(fusee.WorkflowFailed, match="bank down"):
                    await run.result()
            await t.settle()
            assert (await paused.describe()).status == "paused"
            forks = await t.engine.fork_many(status="failed", workflow="pay")
            assert forks.done == ("p-1-retry", "p-2-retry")
            await t.crash()
            assert [await t.get(id).result() for id in forks.done] == [101, 201]
            # The fee step before the failure ran in the old runs only.
            assert {seq for _, (id, _run, seq) in t.step_log if id.endswith("-retry")} == {1}
            DOWN.clear()
            resumed = await t.engine.resume_many(status="paused")
            assert (resumed.done, dict(resumed.skipped)) == (("p-3",), {})
            await t.crash()
            assert await t.get("p-3").result() == 4
    finally:
        DOWN.clear()
