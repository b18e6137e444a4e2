"""Engine versions (`fusee.remote._versions`): a run's version; pinned and auto runs in deploys.

The first tests run on the memory store, SQLite and Postgres; a deploy is
an engine of another version opened on the store the last one left (as
after a crash: nothing but the store goes from one to the next). The last
ones are a rolling deploy on Postgres: a worker of each version at once on
one store (two engines in this process, each with its own store object,
connections and leases, as workers on two machines).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _postgres import Cluster

import fusee
from fusee.engine import Engine
from fusee.record import Start, decode
from fusee.remote._versions import derived_version, version_lines, version_number
from fusee.store import Store
from fusee.store.postgres import PostgresStore

from .conftest import Host, eventually

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


# --- a rolling deploy on Postgres: a worker of each version on one store ------------------------

count = fusee.query("count")
bump = fusee.update("bump", int, int)
ran: list[str] = []


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx, n: int) -> int:
    total = [n]

    def add(k: int) -> int:
        total[0] += k
        return total[0]

    ctx.on_update(bump, add)
    ctx.on_query(count, lambda _: total[0])
    await ctx.step("first", lambda: ran.append(f"{ctx.info.id}/first"))
    got: int = await ctx.wait_for(go) or 0
    await ctx.step("second", lambda: ran.append(f"{ctx.info.id}/second"))
    return total[0] + got


class Deploy:
    """Workers (engines) of given versions on one Postgres store, and clients of it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.schema = cluster.new_name("versions_")
        self.engines: list[Engine] = []
        self.clients: list[fusee.Client] = []

    def store(self, *, client: bool = False) -> PostgresStore:
        return PostgresStore(
            self.cluster.dsn, schema=self.schema, shards=8, durability="none", client=client
        )

    async def worker(self, name: str, version: str) -> Engine:
        store = self.store()
        await store.open()
        engine = Engine(
            store,
            [tally, auto_job],
            lease="1.5s",
            worker=name,
            watchdog=None,
            version=version,
            queues=[fusee.Queue("line", concurrency=2)],
        )
        await engine.recover()
        self.engines.append(engine)
        return engine

    async def client(self) -> fusee.Client:
        client = fusee.Client(self.store(client=True), owned=True)
        await client.store.open()
        self.clients.append(client)
        return client

    async def crash(self, engine: Engine) -> None:
        """Kills ``engine``: its leases are left to run out, its store closes."""
        engine.abandon()
        self.engines.remove(engine)
        await engine.store.close()

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        for engine in self.engines:
            await engine.close()


@pytest.fixture
async def deploy(postgres_cluster: Cluster) -> AsyncIterator[Deploy]:
    ran.clear()
    d = Deploy(postgres_cluster)
    try:
        yield d
    finally:
        await d.close()


def lane_of(engine: Engine) -> int:
    assert engine.leases is not None
    return engine.leases.lane


async def test_during_a_rolling_deploy_each_version_serves_its_own_runs_messages_reach_them(
    deploy: Deploy,
) -> None:
    a = await deploy.worker("a", "v1")
    olds = [await a.start(tally, f"old-{i}", i) for i in range(4)]
    await eventually(lambda: len(ran) == 4)
    b = await deploy.worker("b", "v2")
    assert b.leases is not None
    # Each worker holds every shard of its own version's lane.
    assert len(b.leases.held) == 8
    news = [await b.start(tally, f"new-{i}", i) for i in range(3)]
    client = await deploy.client()
    # A client's start goes to the newest version with a live worker; a
    # worker's start runs on its own version.
    fresh = await client.start(tally, "fresh", 0)
    late = await a.start(tally, "late", 1)
    # Each worker learns of the other's lane at its next lease round: until
    # then, the older version's worker admits queued runs as it did alone.
    assert a.leases is not None
    await eventually(lambda: len(a.leases.live) == 2)  # type: ignore[union-attr]
    # A queued start has no version until it runs: the newest version's
    # workers admit it (no worker here is without a version).
    queued = await a.start(tally, "queued", 2, queue="line")
    await eventually(lambda: "queued/first" in ran)
    versions = [
        (await b.get(id).describe()).version for id in ("old-0", "new-0", "fresh", "late", "queued")
    ]
    assert versions == ["v1", "v2", "v2", "v1", "v2"]
    # Messages to v1's runs sent from v2's worker and from a client reach
    # v1's worker and are answered; v2's runs hear from v1's worker.
    assert await b.get("old-0").query(count) == 0
    assert await client.get("old-1").update(bump, 5) == 6
    await b.get("old-2").cancel("rolled back")
    await b.get("old-0").signal(go, 10)
    await client.get("old-1").signal(go, 10)
    await b.get("old-3").signal(go, 10)
    await b.get("late").signal(go, 1)
    for run in news:
        await a.get(run.id).signal(go, 10)
    await client.get("fresh").signal(go, 2)
    await a.get("queued").signal(go, 2)
    assert [await b.get(r.id).result() for r in (olds[0], olds[1], olds[3])] == [10, 16, 13]
    with pytest.raises(fusee.Cancelled):
        await client.get("old-2").result()
    assert [await a.get(r.id).result() for r in news] == [10, 11, 12]
    assert await fresh.result() == 2
    assert await late.result() == 2
    assert await queued.result() == 4
    # v2's worker never ran a pinned run of v1 (nor the other way): each
    # finished on the version it started on, each step once.
    for id in ("old-0", "old-1", "old-3", "late"):
        assert (await client.get(id).describe()).version == "v1"
    for id in ("new-0", "new-1", "new-2", "fresh", "queued"):
        assert (await client.get(id).describe()).version == "v2"
    assert len(ran) == len(set(ran)) == 2 * 10 - 1  # old-2 was cancelled before its second


async def test_a_v1_run_waits_while_no_v1_worker_lives_and_finishes_on_v1_after_its_restart(
    deploy: Deploy,
) -> None:
    a = await deploy.worker("a", "v1")
    b = await deploy.worker("b", "v2")
    old = await a.start(tally, "old", 1)
    moving = await a.start(auto_job, "moving")
    await eventually(lambda: "old/first" in ran)
    await deploy.crash(a)
    client = await deploy.client()
    # Sent while v1's worker still counts as live: left to v1's lane first.
    sent = asyncio.ensure_future(client.get("moving").signal(go, 3))
    # Once its lease runs out, v2's worker serves what v1's left: the auto
    # run moves to v2 at its next load (the signal reaches it there), the
    # pinned one waits, warned of.
    await eventually(lambda: lane_of(a) not in (b.leases.live if b.leases else ()))
    await asyncio.wait_for(sent, 30)
    assert await b.get(moving.id).result() == 6
    assert (await b.get("moving").describe()).version == "v2"
    with pytest.raises(fusee.UnknownWorkflow, match="started on version 'v1'"):
        await b.get("old").signal(go, 1)
    with pytest.raises(fusee.UnknownWorkflow, match="pinned"):
        await client.get("old").update(bump, 1)
    store: Any = client.store
    lines = version_lines(await store.unfinished(), dict(await store.workers()))
    assert [line.version for line in lines if line.warning] == ["v1"]
    assert (await client.get("old").describe()).status in ("running", "suspended")
    # v1's worker comes back: the run goes on there, where it was.
    await deploy.worker("a", "v1")
    await client.get("old").signal(go, 7)
    assert await b.get(old.id).result() == 8
    assert (await client.get("old").describe()).version == "v1"
    assert await start_version(b.store, "old") == version_number("v1")
    assert sorted(ran) == ["old/first", "old/second"]
