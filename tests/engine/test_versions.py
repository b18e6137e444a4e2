"""Engine versions (`fusee.remote._versions`): a run's version; pinned and auto runs in deploys.

Every test runs on the memory store, SQLite and Postgres; a deploy is an
engine of another version opened on the store the last one left (as after
a crash: nothing but the store goes from one to the next).
"""

from __future__ import annotations

import pytest

import fusee
from fusee.record import Start, decode
from fusee.remote._versions import derived_version, version_number
from fusee.store import Store

from .conftest import Host

pytestmark = pytest.mark.asyncio

# 2026-01-01T00:00:00Z, the test host's default start.
T0 = 1_767_225_600_000
go = fusee.signal("go", int)


@fusee.workflow("pinned_job")
async def pinned_job(ctx: fusee.Ctx) -> int:
    got: int = await ctx.wait_for(go) or 0
    return await ctx.step("double", lambda: got * 2)


@fusee.workflow("auto_job", versioning="auto")
async def auto_job(ctx: fusee.Ctx) -> int:
    got: int = await ctx.wait_for(go) or 0
    return await ctx.step("double", lambda: got * 2)


async def start_version(store: Store, id: str) -> int:
    start = decode((await store.load(id))[0][1])
    assert isinstance(start, Start)
    return start.version


async def test_every_run_records_the_version_it_started_on_given_or_derived(host: Host) -> None:
    async with host(workflows=[pinned_job], version="2026.03.1") as t:
        run = await t.start(pinned_job, "p-1")
        await t.crash()
        assert (await run.describe()).version == "2026.03.1"
        assert await start_version(t.store, "p-1") == version_number("2026.03.1")
        await run.signal(go, 4)
        assert await run.result() == 8
        store = t.store
    async with host(workflows=[pinned_job], store=store) as t2:
        run = await t2.start(pinned_job, "p-2")
        derived = derived_version([pinned_job])
        assert (await run.describe()).version == t2.engine.version == derived
        assert len(derived) == 12
    with pytest.raises(ValueError, match="an engine version is 1 to 100"):
        host(workflows=[pinned_job], version="two words")


async def test_a_pinned_run_waits_for_an_engine_of_its_version_after_a_deploy(
    host: Host,
) -> None:
    async with host(workflows=[pinned_job], version="v1") as t:
        old = await t.start(pinned_job, "old")
        await t.settle()
        store = t.store
        await t.crash()
    async with host(workflows=[pinned_job], version="v2", store=store, start_ms=T0) as t2:
        await t2.settle()
        # Not replayed on v2's code: it waits for a worker of v1.
        with pytest.raises(fusee.UnknownWorkflow, match="started on version 'v1'"):
            await t2.get("old").signal(go, 1)
        new = await t2.start(pinned_job, "new")
        await new.signal(go, 2)
        assert await new.result() == 4
        info = await t2.get("old").describe()
        assert (info.version, info.status) == ("v1", "suspended")
        await t2.crash()
        with pytest.raises(fusee.UnknownWorkflow, match="pinned"):
            await t2.get("old").signal(go, 1)
        store = t2.store
        await t2.crash()
    async with host(workflows=[pinned_job], version="v1", store=store, start_ms=T0) as t3:
        await t3.get(old.id).signal(go, 5)
        assert await t3.get(old.id).result() == 10
        assert await start_version(t3.store, "old") == version_number("v1")
        assert (await t3.get("new").describe()).version == "v2"


async def test_an_auto_run_moves_to_the_new_version_at_its_next_load(host: Host) -> None:
    async with host(workflows=[auto_job], version="v1") as t:
        run = await t.start(auto_job, "a-1")
        await t.settle()
        assert (await run.describe()).version == "v1"
        store = t.store
        await t.crash()
    async with host(workflows=[auto_job], version="v2", store=store, start_ms=T0) as t2:
        await t2.get("a-1").signal(go, 3)
        assert await t2.get("a-1").result() == 6
        assert (await t2.get("a-1").describe()).version == "v2"
        # Its journal keeps the version it started on.
        assert await start_version(t2.store, "a-1") == version_number("v1")
