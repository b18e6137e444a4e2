"""Several engines on one Postgres store: shard leases, fencing, takeover and messages across.

The engines here share one process (one event loop) but nothing else: each
has its own store object, connections and leases, as workers on several
machines do (tests/engine/test_workers.py runs them as processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from _postgres import Cluster

import fusee
from fusee._status import RunStatus
from fusee.engine import Engine
from fusee.record import Signal, Start, decode, encode
from fusee.store import RunRow
from fusee.store.postgres import PostgresStore, shard_of

from .conftest import HeldWrites, Host, eventually

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
LEASE = "1.5s"
SHARDS = 16
ran: list[str] = []


@fusee.workflow("waiter")
async def waiter(ctx: fusee.Ctx, n: int) -> int:
    await ctx.step("first", lambda: ran.append(f"{ctx.info.id}/first"))
    got = await ctx.wait_for(go) or 0
    await ctx.step("second", lambda: ran.append(f"{ctx.info.id}/second"))
    return n + got


bump = fusee.update("bump", int, int)


@fusee.workflow("bumper")
async def bumper(ctx: fusee.Ctx, n: int) -> int:
    total = [n]

    def add(k: int) -> int:
        total[0] += k
        return total[0]

    ctx.on_update(bump, add)
    await ctx.step("first", lambda: ran.append(f"{ctx.info.id}/first"))
    got = await ctx.wait_for(go) or 0
    return total[0] + got


@fusee.workflow("pinger")
async def pinger(ctx: fusee.Ctx, target: str) -> int:
    ctx.send(target, go, 5)
    return await ctx.child(waiter, f"{ctx.info.id}-kid", 100)


@fusee.workflow("nester")
async def nester(ctx: fusee.Ctx, kid: str) -> int:
    return await ctx.child(waiter, kid, 7)


WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [waiter, bumper, pinger, nester]


class Cluster2:
    """Engines on one store (a schema of the session's server), opened and closed by the test."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.schema = cluster.new_name("leases_")
        self.engines: list[Engine] = []

    def store(self) -> PostgresStore:
        return PostgresStore(self.cluster.dsn, schema=self.schema, shards=SHARDS, durability="none")

    async def open(self, name: str, *, lease: str = LEASE, **kw: Any) -> Engine:
        store = self.store()
        await store.open()
        engine = Engine(store, WORKFLOWS, lease=lease, worker=name, watchdog=None, **kw)
        await engine.recover()
        self.engines.append(engine)
        return engine

    async def held(self) -> dict[str, int]:
        """How many live leases each worker holds, by the database."""
        store = self.store()
        await store.open()
        try:
            counts: dict[str, int] = {}
            for owner, _, live in (await store.leases()).values():
                if owner is not None and live:
                    counts[owner] = counts.get(owner, 0) + 1
            return counts
        finally:
            await store.close()

    async def close(self) -> None:
        for engine in self.engines:
            await engine.close()


@pytest.fixture
async def shared(postgres_cluster: Cluster) -> AsyncIterator[Cluster2]:
    ran.clear()
    c = Cluster2(postgres_cluster)
    try:
        yield c
    finally:
        await c.close()


def held(engine: Engine) -> dict[int, int]:
    """The shards ``engine`` holds, with their epochs."""
    assert engine.leases is not None
    return engine.leases.held


def ids_on(engine: Engine, count: int, prefix: str, *, owned: bool = True) -> list[str]:
    """``count`` run ids whose shard ``engine`` holds (or, with ``owned=False``, does not)."""
    assert engine.leases is not None
    found: list[str] = []
    n = 0
    while len(found) < count:
        id = f"{prefix}-{n}"
        n += 1
        if (shard_of(id, SHARDS) in engine.leases.held) == owned:
            found.append(id)
    return found


def with_kid_elsewhere(engine: Engine, prefix: str) -> str:
    """A run id whose shard ``engine`` holds and whose ``-kid``'s shard it does not."""
    assert engine.leases is not None
    held_now = engine.leases.held
    return next(
        p for p in ids_on(engine, 64, prefix) if shard_of(f"{p}-kid", SHARDS) not in held_now
    )


async def two(shared: Cluster2) -> tuple[Engine, Engine]:
    """Engines "a" and "b", once they share the shards fairly."""
    a = await shared.open("a")
    b = await shared.open("b")
    await eventually(lambda: balanced(shared, "a", "b"))
    return a, b


async def balanced(shared: Cluster2, *names: str) -> bool:
    held = await shared.held()
    fair = -(-SHARDS // len(names))
    return sorted(held) == sorted(names) and all(
        SHARDS // len(names) <= held[n] <= fair for n in names
    )


async def test_one_engine_holds_every_shard_and_a_second_takes_half(shared: Cluster2) -> None:
    a = await shared.open("a")
    assert a.leases is not None
    assert len(a.leases.held) == SHARDS
    b = await shared.open("b")
    await eventually(lambda: balanced(shared, "a", "b"))
    assert b.leases is not None
    assert a.leases is not None
    assert not set(a.leases.held) & set(b.leases.held)


async def test_a_stopping_engine_gives_its_shards_back_at_once(shared: Cluster2) -> None:
    a, b = await two(shared)
    await b.close()
    shared.engines.remove(b)
    # Released, not left to run out: the other takes them within a round or two.
    assert a.leases is not None
    await eventually(lambda: len(held(a)) == SHARDS, within_s=3.0)


async def test_runs_started_anywhere_run_on_their_shards_owner_with_signals_across(
    shared: Cluster2,
) -> None:
    a, b = await two(shared)
    mine, theirs = ids_on(a, 5, "w"), ids_on(a, 5, "w", owned=False)
    runs = [await a.start(waiter, id, i) for i, id in enumerate(mine + theirs)]
    # Signals sent through the other engine, and from a run on each side.
    for i, id in enumerate(mine + theirs):
        engine = b if i % 2 else a
        await engine.get(id).signal(go, 10)
    assert [await r.result() for r in runs] == [i + 10 for i in range(10)]
    assert sorted(ran) == sorted([f"{id}/{s}" for id in mine + theirs for s in ("first", "second")])
    # Each run is hosted by its shard's owner only.
    assert b.leases is not None
    assert a.leases is not None
    for id in mine:
        assert shard_of(id, SHARDS) in a.leases.held
    for id in theirs:
        assert shard_of(id, SHARDS) in b.leases.held


async def test_a_send_and_a_child_reach_runs_another_engine_serves(shared: Cluster2) -> None:
    a, b = await two(shared)
    # A pinger on a's shards, its target and its child on b's.
    pinger_id = with_kid_elsewhere(a, "p")
    (target_id,) = ids_on(a, 1, "t", owned=False)
    target = await b.start(waiter, target_id, 1)
    run = await a.start(pinger, pinger_id, target_id)
    assert await target.result() == 6
    kid = f"{pinger_id}-kid"
    await eventually(lambda: b.store.get(kid))  # started by b, on a's request
    await b.get(kid).signal(go, 1)
    assert await run.result() == 101
    # Described alike from either engine (a run's row follows its end by at
    # most one group commit of its owner).
    for engine, id in ((a, target_id), (b, pinger_id), (a, pinger_id)):
        await eventually(functools.partial(_completed, engine, id))


async def test_a_childs_end_reaches_its_parent_though_the_childs_worker_dies_at_its_end(
    shared: Cluster2,
) -> None:
    a, b = await two(shared)
    pinger_id = with_kid_elsewhere(a, "q")
    (target_id,) = ids_on(a, 1, "u")
    await a.start(waiter, target_id, 1)
    run = await a.start(pinger, pinger_id, target_id)
    kid = f"{pinger_id}-kid"
    await eventually(lambda: b.runs.loaded(kid) is not None)
    # b dies the moment the child's end is durable: nothing it would do
    # after that (posting the delivery, say) happens.
    ended = b.ended

    def end_then_die(state: Any, done: Any, lsn: int) -> None:
        ended(state, done, lsn)
        if state.id == kid:
            b.committer.on_durable(lsn, b.abandon)

    b.ended = end_then_die  # type: ignore[method-assign]
    await b.get(kid).signal(go, 1)
    await eventually(lambda: b.closed)
    shared.engines.remove(b)
    await b.store.close()

    assert await asyncio.wait_for(run.result(), 30) == 101


async def _completed(engine: Engine, id: str) -> bool:
    return (await engine.get(id).describe()).status == "completed"


async def test_a_crashed_engines_runs_move_once_its_lease_runs_out(shared: Cluster2) -> None:
    a, b = await two(shared)
    ids = ids_on(a, 6, "c")
    runs = [await a.start(waiter, id, i) for i, id in enumerate(ids)]
    await eventually(lambda: sum(r.endswith("/first") for r in ran) == len(ids))
    a.abandon()  # a crash: no lease given back
    shared.engines.remove(a)
    await a.store.close()
    loop = asyncio.get_running_loop()
    crashed = loop.time()
    assert b.leases is not None
    await eventually(lambda: len(held(b)) == SHARDS)
    # Within the lease and one round of the survivor.
    assert loop.time() - crashed <= 1.5 + b.leases.interval + 1.0
    for id in ids:
        await b.get(id).signal(go, 1)
    assert [await b.get(r.id).result() for r in runs] == [i + 1 for i in range(len(ids))]
    # The first steps were recorded before the crash: none ran again.
    assert sorted(ran) == sorted([f"{id}/{s}" for id in ids for s in ("first", "second")])


async def test_a_write_under_a_taken_over_lease_is_refused_and_its_runs_dropped(
    shared: Cluster2, postgres_cluster: Cluster
) -> None:
    a = await shared.open("a", lease="30s")
    (id,) = ids_on(a, 1, "f")
    run = await a.start(waiter, id, 1)
    await eventually(lambda: f"{id}/first" in ran)
    shard = shard_of(id, SHARDS)
    # Another worker takes the shard over (its lease ran out, say).
    await _steal(postgres_cluster, shared.schema, shard)
    before = len(await a.store.load(id))
    # The signal's record is refused; the signal goes on to the shard's new
    # owner, as a command in the inbox (the thief serves none: it waits).
    signal = asyncio.ensure_future(a.get(id).signal(go, 1))
    await eventually(lambda: shard not in held(a))
    assert a.runs.loaded(id) is None
    await eventually(lambda: _posted(postgres_cluster, shared.schema, id))
    assert not signal.done()
    signal.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await signal
    # Nothing of the refused write is stored.
    assert len(await a.store.load(id)) == before
    assert (await run.describe()).status in ("running", "suspended")


async def test_records_queued_for_runs_of_a_dropped_shard_are_never_written(
    shared: Cluster2,
) -> None:
    a = await shared.open("a", lease="30s")
    (id,) = ids_on(a, 1, "h")
    await a.start(waiter, id, 1)
    await eventually(lambda: f"{id}/first" in ran)
    before = await a.store.load(id)
    # Queued in the turn its runs are dropped (the shard lost, say): were it
    # written later, under this lease or a new one of the same worker, it
    # would follow records the lost lease refused.
    lsn = a.committer.append(id, 1, encode(Signal(1, "go", 0, b"\x05", None)))
    a.drop_shards([shard_of(id, SHARDS)])

    with pytest.raises(fusee.StaleLease):
        await asyncio.wait_for(a.committer.durable(lsn), 10)
    await a.committer.flush()
    assert await a.store.load(id) == before


async def test_a_child_whose_shard_moves_as_it_starts_is_started_by_the_new_owner(
    shared: Cluster2, postgres_cluster: Cluster
) -> None:
    a = await shared.open("a", lease="30s")
    parent_id, kid = next(
        (p, f"{p}-kid")
        for p in ids_on(a, 40, "n")
        if shard_of(f"{p}-kid", SHARDS) != shard_of(p, SHARDS)
    )
    # The child's shard is taken over, and a does not know yet: its start's
    # record is refused, and the start goes to the shard's new owner.
    await _steal(postgres_cluster, shared.schema, shard_of(kid, SHARDS))
    await a.start(nester, parent_id, kid)

    await eventually(lambda: _posted(postgres_cluster, shared.schema, kid, "start"))
    assert await a.store.get(kid) is None


async def test_a_result_waited_for_as_its_run_moves_is_waited_for_where_it_went(
    shared: Cluster2,
) -> None:
    a = await shared.open("a", lease="30s", park_after="10ms")
    (id,) = ids_on(a, 1, "m")
    run = await a.start(waiter, id, 1)
    await eventually(lambda: f"{id}/first" in ran and a.runs.loaded(id) is None)  # parked
    shard = shard_of(id, SHARDS)
    read = a.store.get

    async def read_as_it_moves(run_id: str) -> Any:
        found = await read(run_id)
        if run_id == id:
            a.lost_shards([shard])  # taken over while the row was read
        return found

    a.store.get = read_as_it_moves  # type: ignore[method-assign,assignment]
    waiting = asyncio.ensure_future(run.result())
    await eventually(lambda: a.runs.shard_index(id) not in held(a))
    await asyncio.sleep(0.2)
    # Not waited for here, where nothing would ever end it: through the store.
    assert id not in a._results
    assert not waiting.done()
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


@pytest.mark.parametrize("message", ["signal", "update"])
@pytest.mark.parametrize("caller", ["engine", "client"])
async def test_a_message_whose_lease_ran_out_and_came_back_mid_write_reaches_its_run_not_its_caller(
    shared: Cluster2, postgres_cluster: Cluster, message: str, caller: str
) -> None:
    a = await shared.open("a", lease="30s")
    assert a.leases is not None
    (id,) = ids_on(a, 1, "m")
    run = await a.start(bumper, id, 1)
    await eventually(lambda: f"{id}/first" in ran)
    shard = shard_of(id, SHARDS)
    client = fusee.Client(shared.store(), owned=True)
    await client.store.open()
    target = a.get(id) if caller == "engine" else client.get(id)
    with HeldWrites(a.store) as writes:
        call = asyncio.ensure_future(
            target.signal(go, 10) if message == "signal" else target.update(bump, 10)
        )
        await writes.waiting.wait()
        # While the message's write is on its way, the lease runs out (a
        # thief takes the shard), then comes back under a new epoch: the
        # write is refused, though this worker holds the shard again.
        await _steal(postgres_cluster, shared.schema, shard)
        await a.leases._round()
        assert shard not in held(a)
        await _expire(postgres_cluster, shared.schema, shard)
        await a.leases._round()
        assert shard in held(a)
    # The refused message goes through the store's inbox to the shard's
    # holder (this worker again), and is applied once.
    answer = await asyncio.wait_for(call, 30)
    if message == "update":
        assert answer == 11
        await a.get(id).signal(go, 100)
    assert await run.result() == (111 if message == "update" else 11)
    assert sorted(ran) == [f"{id}/first"]
    await client.close()


async def _expire(cluster: Cluster, schema: str, shard: int) -> None:
    conn = await asyncpg.connect(cluster.dsn)
    try:
        await conn.execute(
            f"UPDATE \"{schema}\".shard_leases SET lease_until = '-infinity' WHERE shard = $1",
            shard,
        )
    finally:
        await conn.close()


async def _steal(cluster: Cluster, schema: str, shard: int) -> None:
    conn = await asyncpg.connect(cluster.dsn)
    try:
        await conn.execute(
            f'UPDATE "{schema}".shard_leases SET owner = $1, epoch = epoch + 1 WHERE shard = $2',
            "thief",
            shard,
        )
    finally:
        await conn.close()


async def _posted(cluster: Cluster, schema: str, id: str, kind: str = "signal") -> bool:
    conn = await asyncpg.connect(cluster.dsn)
    try:
        found = await conn.fetchval(
            f'SELECT count(*) FROM "{schema}".commands WHERE run_id = $1 AND kind = $2',
            id,
            kind,
        )
    finally:
        await conn.close()
    return bool(found)


@pytest.mark.parametrize("store_kind", [pytest.param("postgres", id="postgres")])
async def test_an_ended_runs_row_held_for_its_outbox_is_never_written_once_its_shard_is_dropped(
    host: Host,
) -> None:
    # The run ends while a send of its is unconfirmed: its final row waits
    # for the outbox. Its shard is lost before the `Done` is durable, so the
    # `Done` is never written; nor may the row be, once the send confirms.
    @fusee.workflow("ender")
    async def ender(ctx: fusee.Ctx) -> int:
        return await ctx.wait_for(go) or 0

    async with host(workflows=[ender]) as t:
        engine = t.engine
        run = await t.start(ender, "ends")
        await t.settle()
        state = engine.runs.loaded("ends")
        assert state is not None
        state.outbox.add(99)  # a send still on its way
        with HeldWrites(engine.store) as held:
            signal = asyncio.ensure_future(run.signal(go, 1))
            await held.waiting.wait()
            await eventually(lambda: state.final_row is not None)
            engine.drop_shards([engine.runs.shard_index("ends")])
            engine.outbox_done(state, 99)
            held.release()
            with contextlib.suppress(fusee.FuseeError):
                await signal
        await engine.committer.flush()
        row = await engine.store.get("ends")
        assert row is not None
        assert row.status != "completed"


@fusee.workflow("renewer")
async def renewer(ctx: fusee.Ctx, left: int) -> int:
    got = await ctx.wait_for(go) or 0
    if left > 0:
        ctx.continue_as_new(left - 1)
    return got


async def continued_as_its_shard_goes(engine: Engine, run: fusee.Run[Any]) -> int:
    """Signals ``run`` (a `renewer` of 1) to continue as new as its shard is dropped; the shard.

    Its `Done` is durable and its row "continued", its next run not started.
    """
    shard = engine.runs.shard_index(run.id)
    with HeldWrites(engine.store) as held:
        first = asyncio.ensure_future(run.signal(go, 1))
        await held.waiting.wait()
        engine.drop_shards([shard])
        held.release()
        await first
    await engine.committer.flush()
    row = await engine.store.get(run.id)
    assert row is not None
    assert (row.run, row.status, engine.runs.loaded(run.id)) == (1, "continued", None)
    return shard


@pytest.mark.parametrize("store_kind", [pytest.param("postgres", id="postgres")])
async def test_a_run_continued_as_its_shard_is_dropped_is_continued_by_the_shards_next_owner(
    host: Host,
) -> None:
    # Its `Done` lands as its shard goes: the next run is not started here
    # (it would be a run of a shard this worker no longer holds). Whoever
    # holds the shard next starts it from the "continued" row: its recovery,
    # or a message to the id, which waits for it meanwhile (here, this
    # worker still holds the lease: the message starts it).
    async with host(workflows=[renewer]) as t:
        engine = t.engine
        run = await t.start(renewer, "renews", 1)
        await t.settle()
        shard = await continued_as_its_shard_goes(engine, run)
        await run.signal(go, 2)
        assert await run.result() == 2
        await engine.recover_shards({shard})  # finds it continued already
        assert [r.run for r in await engine.store.list()] == [2]


async def test_a_continued_run_read_before_its_next_run_started_and_parked_is_not_continued_again(
    tmp_path: Path,
) -> None:
    # Recovery and a message each continue a "continued" row they read: one
    # read before the next run started (and parked: not loaded) must not
    # start that next run a second time.
    async with await fusee.Engine.open(
        str(tmp_path), workflows=[renewer], park_after="10ms", durability="none"
    ) as engine:
        run = await engine.start(renewer, "renews-2", 1)
        await run.signal(go, 1)
        while (
            (row := await engine.store.get("renews-2")) is None
            or (
                row.run,
                row.status,
            )
            != (2, "suspended")
            or engine.runs.loaded("renews-2") is not None
        ):
            await asyncio.sleep(0.005)
        await engine._continue(RunRow("renews-2", 1, "renewer", RunStatus.CONTINUED, 0))
        await run.signal(go, 5)
        assert await run.result() == 5
        starts = [
            rec
            for _, data in await engine.store.load("renews-2", 2)
            if isinstance(rec := decode(data), Start)
        ]
        assert len(starts) == 1


@pytest.mark.parametrize("target", ["memory", "sqlite"])
async def test_many_messages_at_once_to_a_continued_run_start_its_next_run(
    tmp_path: Path, target: str
) -> None:
    # Its `Done` is durable, its next run not started (its shard went as the
    # `Done` landed): each message starts the next run, or finds it started;
    # none may leave it to another whose load it saw under way.
    async with await fusee.Engine.open(
        "memory" if target == "memory" else str(tmp_path), workflows=[renewer], durability="none"
    ) as engine:
        run = await engine.start(renewer, "renews-3", 1)
        await continued_as_its_shard_goes(engine, run)
        sent = [run.signal(go, i, dedup=f"d{i}") for i in range(2, 8)]
        outcomes = await asyncio.wait_for(asyncio.gather(*sent, return_exceptions=True), 10)
        # The next run ends at its first signal: the others find it ended.
        assert [type(o).__name__ for o in outcomes].count("NoneType") >= 1
        assert {type(o).__name__ for o in outcomes} <= {"NoneType", "RunFinished"}
        assert await asyncio.wait_for(run.result(), 10) in range(2, 8)
        kinds = [type(decode(data)).__name__ for _, data in await engine.store.load("renews-3", 2)]
        assert kinds.count("Start") == 1
