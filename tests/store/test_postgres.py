"""What only the Postgres store does: shard leases and fencing, its format, its errors.

The behaviour every store shares is in test_store.py. Each test here gets a
store in a schema of its own on the session's throwaway cluster
(`postgres_cluster`); leases are timed by that server's clock, so expiry is
tested with short leases and a server-side wait (``pg_sleep``), never a
sleep in the test process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from _postgres import Cluster

import fusee
from fusee import Engine
from fusee.errors import StaleLease, StoreError
from fusee.store import Command, Entry, RunRow, open_store
from fusee.store.postgres import DEFAULT_SHARDS, FORMAT, PostgresStore, shard_of

NewStore = Callable[..., PostgresStore]


@pytest_asyncio.fixture
async def new_store(postgres_cluster: Cluster) -> AsyncIterator[NewStore]:
    """``new_store(**kw)``: an opened-later store on a fresh schema; all closed at the end."""
    made: list[PostgresStore] = []

    def make(**kw: object) -> PostgresStore:
        kw.setdefault("schema", postgres_cluster.new_name("only_pg_"))
        kw.setdefault("durability", "none")
        store = PostgresStore(postgres_cluster.dsn, **kw)  # type: ignore[arg-type]
        made.append(store)
        return store

    try:
        yield make
    finally:
        for store in made:
            await store.close()


@pytest_asyncio.fixture
async def store(new_store: NewStore) -> PostgresStore:
    store = new_store(shards=8)
    await store.open()
    return store


def entry(lsn: int, id: str = "a") -> Entry:
    return Entry(lsn, id, 1, f"{id}/{lsn}".encode())


def run_row(id: str = "a", status: str = "running") -> RunRow:
    return RunRow(id, 1, "checkout", status, 0)


async def server_sleep(store: PostgresStore, seconds: float) -> None:
    """Lets the database's clock move on (leases are timed by it)."""
    conn = await asyncpg.connect(store._dsn)
    try:
        await conn.execute("SELECT pg_sleep($1)", seconds)
    finally:
        await conn.close()


# -- leases ------------------------------------------------------------------------------


async def test_acquire_takes_free_shards_each_with_a_new_epoch(store: PostgresStore) -> None:
    first = await store.acquire_shards("w1", 3, lease_s=30)
    second = await store.acquire_shards("w2", 10, lease_s=30)

    assert first == {0: 1, 1: 1, 2: 1}
    assert second == {s: 1 for s in range(3, 8)}
    assert await store.acquire_shards("w3", 4, lease_s=30) == {}
    leases = await store.leases()
    assert {s for s, (owner, _, live) in leases.items() if owner == "w1" and live} == {0, 1, 2}


async def test_renew_keeps_the_shards_still_held_and_their_epochs(store: PostgresStore) -> None:
    held = await store.acquire_shards("w1", 2, lease_s=30)

    assert await store.renew_shards("w1", held, lease_s=30) == held
    assert await store.renew_shards("w2", held, lease_s=30) == {}
    assert await store.renew_shards("w1", [], lease_s=30) == {}


async def test_an_expired_lease_is_taken_over_with_a_bumped_epoch(store: PostgresStore) -> None:
    await store.acquire_shards("w1", 8, lease_s=0.05)
    assert await store.acquire_shards("w2", 8, lease_s=30) == {}

    await server_sleep(store, 0.1)
    taken = await store.acquire_shards("w2", 2, lease_s=30)

    assert taken == {0: 2, 1: 2}
    # The old holder's renewal tells it which shards it lost.
    assert set(await store.renew_shards("w1", range(8), lease_s=30)) == set(range(2, 8))


async def test_release_gives_shards_back_at_once(store: PostgresStore) -> None:
    held = await store.acquire_shards("w1", 8, lease_s=30)
    await store.release_shards("w2", held)  # not w2's: nothing happens
    assert await store.acquire_shards("w2", 8, lease_s=30) == {}

    await store.release_shards("w1", [0, 1])

    assert await store.acquire_shards("w2", 8, lease_s=30) == {0: 3, 1: 3}
    leases = await store.leases()
    assert leases[2] == ("w1", 1, True)


async def test_a_fenced_append_commits_while_the_epochs_hold(store: PostgresStore) -> None:
    held = await store.acquire_shards("w1", 8, lease_s=30)

    await store.append([entry(1)], [run_row()], fence=held)

    assert await store.load("a") == [(1, b"a/1")]


async def test_a_fenced_append_after_a_takeover_raises_stale_lease_and_stores_nothing(
    store: PostgresStore, new_store: NewStore
) -> None:
    held = await store.acquire_shards("w1", 8, lease_s=0.05)
    await store.append([entry(1)], [run_row()], fence=held)
    other = new_store(schema=store.schema)
    await other.open()
    await server_sleep(store, 0.1)
    shard = shard_of("a", store.shards)
    taken = await other.acquire_shards("w2", 8, lease_s=30)
    assert taken[shard] == 2

    with pytest.raises(StaleLease, match="no longer holds shards") as caught:
        await store.append([entry(2)], [run_row(status="completed")], fence=held)

    assert set(caught.value.shards) == set(range(8))
    assert await other.load("a") == [(1, b"a/1")]
    row = await other.get("a")
    assert row is not None
    assert row.status == "running"
    # The new holder writes under its own epochs.
    await other.append([entry(2)], fence={shard: taken[shard]})
    assert await other.load("a") == [(1, b"a/1"), (2, b"a/2")]


async def test_a_stale_lease_fails_only_the_appends_it_fences(store: PostgresStore) -> None:
    held = await store.acquire_shards("w1", 8, lease_s=30)
    a, b = shard_of("a", 8), shard_of("b", 8)
    assert a != b
    await store.release_shards("w1", [a])

    results = await asyncio.gather(
        store.append([entry(1, "a")], fence={a: held[a]}),
        store.append([entry(2, "b")], fence={b: held[b]}),
        return_exceptions=True,
    )

    assert isinstance(results[0], StaleLease)
    assert results[0].shards == (a,)
    assert results[1] is None
    assert await store.load("b") == [(2, b"b/2")]


async def test_commands_posted_with_an_append_are_stored_with_it(store: PostgresStore) -> None:
    held = await store.acquire_shards("w1", 8, lease_s=30)
    command = Command("deliver/p/1/2", "deliver", "p", b"\x80")

    await store.append([entry(1)], [run_row()], fence=held, commands=[command])
    # Posted again (a retried batch), it is stored once.
    await store.append([entry(2)], fence=held, commands=[command])

    taken = await store.take_commands()
    assert [(c.id, c.kind, c.run_id, c.payload) for c in taken] == [
        ("deliver/p/1/2", "deliver", "p", b"\x80")
    ]
    # For the worker that holds the run it names, not the appending run's.
    assert await store.take_commands(shards=[s for s in range(8) if s != shard_of("p", 8)]) == []


async def test_a_refused_append_posts_none_of_its_commands(store: PostgresStore) -> None:
    held = await store.acquire_shards("w1", 8, lease_s=30)
    await store.release_shards("w1", [shard_of("a", 8)])

    with pytest.raises(StaleLease):
        await store.append(
            [entry(1)], fence=held, commands=[Command("deliver/p/1/2", "deliver", "p")]
        )

    assert await store.take_commands() == []
    assert await store.get_answer("deliver/p/1/2") is None


async def test_a_row_being_written_is_read_only_once_its_write_commits(
    store: PostgresStore,
) -> None:
    held = await store.acquire_shards("w1", 8, lease_s=30)
    await store.release_shards("w1", [shard_of("a", 8)])
    # A write its lease will refuse: a read meanwhile must not see its row.
    write = asyncio.ensure_future(store.append([entry(1)], [run_row()], fence=held))
    await asyncio.sleep(0)

    assert await store.get("a") is None
    with pytest.raises(StaleLease):
        await write
    ok = asyncio.ensure_future(store.append([entry(1, "b")], [run_row("b")]))
    await asyncio.sleep(0)
    row = await store.get("b")
    assert row is not None
    assert ok.done()


async def test_rows_read_at_once_share_a_read_each_ended_one_with_its_end_record(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.append([entry(1), entry(2)], [run_row()])
    await store.append([entry(3, "b"), entry(4, "b")], [run_row("b", "completed")])
    # A run of "c" ended, then "c" started again: its latest run has no end yet.
    await store.append([entry(5, "c")], [run_row("c", "failed")])
    await store.append([Entry(6, "c", 2, b"c/6")], [RunRow("c", 2, "checkout", "running", 0)])
    trips: list[str] = []
    query = store._query

    async def counted(fn: Any, doing: str) -> Any:
        trips.append(doing)
        return await query(fn, doing)

    monkeypatch.setattr(store, "_query", counted)
    ids = ["a", "b", "c", "nobody", "a"]
    rows = await asyncio.gather(*(store.get(id) for id in ids))
    ended = await asyncio.gather(*(store.get_ended(id) for id in ids))

    assert trips == ["reading", "reading"]
    assert [r and (r.id, r.run, r.status) for r in rows] == [
        ("a", 1, "running"),
        ("b", 1, "completed"),
        ("c", 2, "running"),
        None,
        ("a", 1, "running"),
    ]
    assert [(row, end) for row, end in ended] == [
        (rows[0], None),
        (rows[1], (4, b"b/4")),
        (rows[2], None),
        (None, None),
        (rows[0], None),
    ]
    # A run ending in a write still under way reads once the write commits.
    write = asyncio.ensure_future(store.append([entry(7, "d")], [run_row("d", "completed")]))
    await asyncio.sleep(0)
    row, end = await store.get_ended("d")
    assert write.done()
    assert (row and row.status, end) == ("completed", (7, b"d/7"))


async def test_a_commit_whose_answer_was_lost_is_not_taken_for_another_workers_records(
    store: PostgresStore, new_store: NewStore
) -> None:
    # The next holder of the shard wrote its own records at the LSNs of a
    # commit whose connection was lost: that commit did not land.
    held = await store.acquire_shards("w1", 8, lease_s=30)
    other = new_store(schema=store.schema)
    await other.open()
    await other.append([entry(1)], fence=held)
    mine = types.SimpleNamespace(entries=(Entry(1, "a", 1, b"mine"),), fence=tuple(held.items()))
    theirs = types.SimpleNamespace(entries=(entry(1),), fence=tuple(held.items()))

    assert await store._landed([mine]) is False  # type: ignore[list-item]
    assert await store._landed([theirs]) is True  # type: ignore[list-item]


async def test_a_takeover_skips_a_shard_whose_fenced_commit_is_in_flight(
    store: PostgresStore,
) -> None:
    # A fenced commit locks its lease rows: a takeover meanwhile takes the
    # other shards rather than bumping an epoch under a commit in flight.
    held = await store.acquire_shards("w1", 8, lease_s=0.05)
    await server_sleep(store, 0.1)
    conn = await asyncpg.connect(store._dsn)
    try:
        async with conn.transaction():
            await conn.fetch(
                f"SELECT shard FROM {store.schema}.shard_leases WHERE shard = 0 FOR SHARE"
            )
            taken = await asyncio.wait_for(store.acquire_shards("w2", 8, lease_s=30), 30)
    finally:
        await conn.close()

    assert set(taken) == set(range(1, 8))
    assert await store.renew_shards("w1", held, lease_s=30) == {0: 1}


async def test_reads_never_block_an_append(store: PostgresStore) -> None:
    await store.append([entry(1)], [run_row()])
    conn = await asyncpg.connect(store._dsn)
    try:
        # A long reader holding its snapshot, as a UI or a CLI listing would.
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            assert await conn.fetchval(f"SELECT count(*) FROM {store.schema}.journal") == 1
            await asyncio.wait_for(store.append([entry(2)], [run_row(status="completed")]), 30)
            assert await conn.fetchval(f"SELECT count(*) FROM {store.schema}.journal") == 1
    finally:
        await conn.close()

    assert await store.load("a") == [(1, b"a/1"), (2, b"a/2")]


async def test_lease_arguments_are_checked(store: PostgresStore) -> None:
    with pytest.raises(ValueError, match="lease_s"):
        await store.acquire_shards("w1", 1, lease_s=0)
    with pytest.raises(ValueError, match="owner"):
        await store.acquire_shards("", 1, lease_s=1)
    assert await store.acquire_shards("w1", 0, lease_s=1) == {}


# -- rows carry their shard --------------------------------------------------------------


async def test_every_journal_and_run_row_carries_its_shard(store: PostgresStore) -> None:
    ids = [f"order-{n}" for n in range(20)]
    await store.append(
        [Entry(n + 1, id, 1, b"x") for n, id in enumerate(ids)], [run_row(id) for id in ids]
    )

    conn = await asyncpg.connect(store._dsn)
    try:
        journal = await conn.fetch(f"SELECT id, shard FROM {store.schema}.journal")
        runs = await conn.fetch(f"SELECT id, shard FROM {store.schema}.runs")
    finally:
        await conn.close()
    assert {r["id"]: r["shard"] for r in journal} == {id: shard_of(id, 8) for id in ids}
    assert {r["id"]: r["shard"] for r in runs} == {id: shard_of(id, 8) for id in ids}
    mine = {s for s in range(8) if s % 2 == 0}
    assert {r.id for r in await store.unfinished(shards=mine)} == {
        id for id in ids if shard_of(id, 8) in mine
    }


async def test_a_second_writer_of_the_same_lsn_is_refused_by_the_primary_key(
    store: PostgresStore, new_store: NewStore
) -> None:
    other = new_store(schema=store.schema)
    await other.open()
    await store.append([entry(1)], [run_row()])

    with pytest.raises(StoreError, match="another engine writes the same shards"):
        await other.append([entry(1)])


# -- lanes: workers of several versions on one store -------------------------------------


async def test_each_version_a_worker_serves_has_a_lane_with_its_own_copy_of_the_shards(
    store: PostgresStore, new_store: NewStore
) -> None:
    v2 = new_store(schema=store.schema)
    client = new_store(schema=store.schema, client=True)
    await v2.open()
    await client.open()
    assert (await store.serve_version("v1"), await v2.serve_version("v2")) == (1, 2)
    assert await store.serve_version("v1") == 1  # a version keeps its lane
    await store.join("w1", 30, "v1")
    await v2.join("w2", 30, "v2")
    assert await store.lanes() == ({"v1": 1, "v2": 2}, {1, 2})
    # Each lane's worker holds every shard of its own lane, and both write
    # one shard at once, each under its own lane's slot of it.
    held1 = await store.acquire_shards("w1", 8, lease_s=30)
    held2 = await v2.acquire_shards("w2", 8, lease_s=30)
    assert set(held1) == set(held2) == set(range(8))
    s = shard_of("a", 8)
    await store.append(
        [entry(1, "a")], [RunRow("a", 1, "wf", "running", 0, version="v1")], fence={s: held1[s]}
    )
    await v2.append(
        [entry(1, "b")],
        [RunRow("b", 1, "wf", "running", 0, version="v2")],
        fence={shard_of("b", 8): held2[shard_of("b", 8)]},
    )
    conn = await asyncpg.connect(store._dsn)
    try:
        journal = {
            r["id"]: r["shard"]
            for r in await conn.fetch(f"SELECT id, shard FROM {store.schema}.journal")
        }
    finally:
        await conn.close()
    assert journal == {"a": 8 + s, "b": 16 + shard_of("b", 8)}
    # A command reaches the lane of its run's version; a worker's start its
    # own lane, a client's the newest lane with a live worker.
    await client.post_command(Command.new("signal", "a"))
    await client.post_command(Command.new("signal", "b"))
    await client.post_command(Command.new("start", "c"))
    await store.post_command(Command.new("start", "d"))
    taken1 = await store.take_commands(shards=range(8))
    taken2 = await v2.take_commands(shards=range(8))
    assert sorted(c.run_id for c in taken1) == ["a", "d"]
    assert sorted(c.run_id for c in taken2) == ["b", "c"]
    # With no live worker of v1, its runs' commands go to the newest lane.
    await store.leave("w1")
    assert (await store.lanes())[1] == {2}
    await client.post_command(Command.new("cancel", "a"))
    assert [c.run_id for c in await v2.take_commands(shards=range(8))] == ["a"]


# -- format, shards, reopening -----------------------------------------------------------


async def test_a_new_store_records_its_format_and_shard_count(new_store: NewStore) -> None:
    store = new_store()
    await store.open()

    assert store.shards == DEFAULT_SHARDS
    assert len(await store.leases()) == DEFAULT_SHARDS
    conn = await asyncpg.connect(store._dsn)
    try:
        meta = {r[0]: r[1] for r in await conn.fetch(f"SELECT key, value FROM {store.schema}.meta")}
    finally:
        await conn.close()
    assert meta["format"] == FORMAT
    assert meta["shards"] == DEFAULT_SHARDS


async def test_reopening_keeps_the_data_the_shard_count_and_the_leases(
    store: PostgresStore, new_store: NewStore
) -> None:
    held = await store.acquire_shards("w1", 2, lease_s=30)
    await store.append([entry(1), entry(2, "b")], [run_row(), run_row("b")], fence=held)
    await store.close()

    again = new_store(schema=store.schema)
    await again.open()

    assert again.shards == 8
    assert again.last_lsn == 2
    assert await again.load("a") == [(1, b"a/1")]
    assert await again.renew_shards("w1", held, lease_s=30) == held


async def test_a_different_shard_count_for_an_existing_store_is_refused(
    store: PostgresStore, new_store: NewStore
) -> None:
    with pytest.raises(StoreError, match="has 8 shards, not 16"):
        await new_store(schema=store.schema, shards=16).open()


async def test_a_format_4_store_gains_the_runs_error_column_and_keeps_its_rows(
    store: PostgresStore, new_store: NewStore
) -> None:
    held = await store.acquire_shards("w1", 8, lease_s=30)
    await store.append([entry(1)], [run_row()], fence=held)
    await store.close()
    conn = await asyncpg.connect(store._dsn)
    try:
        await conn.execute(f"ALTER TABLE {store.schema}.runs DROP COLUMN error")
        await conn.execute(f"UPDATE {store.schema}.meta SET value = 4 WHERE key = 'format'")
    finally:
        await conn.close()

    again = new_store(schema=store.schema)
    await again.open()
    assert await again.get("a") == run_row()
    held = await again.acquire_shards("w1", 8, lease_s=30)
    paused = RunRow("b", 1, "checkout", "paused", 0, error="Traceback ...\nKeyError: 'x'")
    await again.append([entry(2, "b")], [paused], fence=held)
    assert await again.get("b") == paused
    conn = await asyncpg.connect(store._dsn)
    try:
        value = await conn.fetchval(f"SELECT value FROM {store.schema}.meta WHERE key = 'format'")
    finally:
        await conn.close()
    assert value == FORMAT == 5


async def test_a_newer_format_refuses_to_open(store: PostgresStore, new_store: NewStore) -> None:
    conn = await asyncpg.connect(store._dsn)
    try:
        await conn.execute(
            f"UPDATE {store.schema}.meta SET value = $1 WHERE key = 'format'", FORMAT + 1
        )
    finally:
        await conn.close()

    with pytest.raises(StoreError, match=f"has format {FORMAT + 1}, newer .* upgrade fusee"):
        await new_store(schema=store.schema).open()


async def test_tables_that_are_not_a_store_are_left_alone(
    postgres_cluster: Cluster, new_store: NewStore
) -> None:
    schema = postgres_cluster.new_name("foreign_")
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.runs (x int)")
    finally:
        await conn.close()

    with pytest.raises(StoreError, match="not a fusee store"):
        await new_store(schema=schema).open()


async def test_a_readonly_store_reads_and_refuses_writes(
    store: PostgresStore, new_store: NewStore
) -> None:
    await store.append([entry(1)], [run_row()])
    reader = new_store(schema=store.schema, readonly=True)
    await reader.open()

    assert await reader.load("a") == [(1, b"a/1")]
    with pytest.raises(StoreError, match="read-only"):
        await reader.append([entry(2)])
    with pytest.raises(StoreError, match="read-only"):
        await reader.acquire_shards("w1", 1, lease_s=1)
    with pytest.raises(StoreError, match="no fusee store in schema"):
        await new_store(readonly=True).open()


async def test_fsync_durability_commits_synchronously(new_store: NewStore) -> None:
    store = new_store(durability="fsync")
    await store.open()
    await store.append([entry(1)], [run_row()])
    assert store._pool is not None

    async with store._pool.acquire() as conn:
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
        assert await conn.fetchval("SHOW fsync") == "on"


async def test_group_commit_writes_overlapping_appends_in_one_transaction(
    store: PostgresStore,
) -> None:
    await store.append([entry(1)])
    before = store.transactions

    await asyncio.gather(*(store.append([entry(n, f"r{n}")]) for n in range(2, 52)))

    assert store.transactions - before < 50
    assert store.last_lsn == 51


# -- open_store, Engine.open and connection errors ---------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("postgresql://u:pw@db/app", id="postgresql"),
        pytest.param("postgres://u:pw@db/app", id="postgres"),
    ],
)
def test_open_store_makes_a_postgres_store_for_its_urls(url: str) -> None:
    store = open_store(url, durability="none", readonly=True)

    assert isinstance(store, PostgresStore)
    assert store._durability == "none"
    assert store._readonly


async def test_engine_open_runs_workflows_on_postgres(postgres_cluster: Cluster) -> None:
    @fusee.workflow("greet")
    async def greet(ctx: fusee.Ctx, name: str) -> str:
        return await ctx.step("say", lambda: f"hello {name}")

    # The DSN's database, in the default schema "fusee".
    async with await Engine.open(
        postgres_cluster.dsn, workflows=[greet], durability="none"
    ) as engine:
        assert await engine.execute(greet, "g-1", "ana") == "hello ana"
    async with await Engine.open(postgres_cluster.dsn, workflows=[greet]) as engine:
        info = await engine.get("g-1").describe()
        assert info.status == "completed"


SECRET = "s3cr3t-Pa55"


def _bad_dsns(cluster: Cluster) -> list[tuple[str, str]]:
    return [
        (cluster.dsn_for("postgres", password=SECRET), "refused the password"),
        (f"postgresql://fusee:{SECRET}@127.0.0.1:1/postgres", "cannot reach the Postgres server"),
        (f"postgresql://fusee:{SECRET}@127.0.0.1:notaport/x", "is not a valid Postgres URL"),
        (f"postgresql://fusee@127.0.0.1:{cluster.port}/x?password={SECRET}", "refused"),
        (cluster.dsn_for("no_such_db"), "has no such database"),
    ]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(0, id="wrong-password"),
        pytest.param(1, id="unreachable"),
        pytest.param(2, id="bad-dsn"),
        pytest.param(3, id="password-in-query"),
        pytest.param(4, id="no-database"),
    ],
)
async def test_connection_errors_are_clear_store_errors_without_the_password(
    postgres_cluster: Cluster, case: int
) -> None:
    dsn, message = _bad_dsns(postgres_cluster)[case]
    store = PostgresStore(dsn)

    with pytest.raises(StoreError, match=message) as caught:
        await store.open()

    for text in (str(caught.value), repr(caught.value), str(store), repr(store)):
        assert SECRET not in text
        assert postgres_cluster.password not in text
    assert caught.value.__cause__ is None  # the driver's error may quote the DSN
    assert caught.value.__suppress_context__


def test_a_missing_asyncpg_says_how_to_install_it() -> None:
    # A child process: asyncpg is blocked from importing there only.
    code = (
        "import sys, asyncio\n"
        "sys.modules['asyncpg'] = None\n"
        "import fusee\n"
        "from fusee.store import open_store\n"
        "assert 'asyncpg' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n"
        "    asyncio.run(open_store('postgresql://db/app').open())\n"
        "except fusee.StoreError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout

    assert "pip install 'fusee[postgres]'" in out


def test_importing_fusee_imports_no_store_backend() -> None:
    code = (
        "import sys, fusee, fusee.store\n"
        "print(sorted(m for m in sys.modules if m.startswith(('asyncpg', 'fusee.store.'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout

    assert "asyncpg" not in out
    assert "fusee.store.postgres" not in out


# --- a connection lost mid-commit ------------------------------------------------------------


def cut_connection(store: PostgresStore, *, after_commit: bool) -> list[int]:
    """Loses the first commit's connection: before its COMMIT, or after it with its answer."""
    real = store._commit
    calls: list[int] = []

    async def flaky(writes: list[Any]) -> None:
        calls.append(len(writes))
        if len(calls) == 1 and not after_commit:
            raise ConnectionResetError("injected: connection reset inside the transaction")
        await real(writes)
        if len(calls) == 1:
            raise ConnectionResetError("injected: the commit's answer was lost")

    store._commit = flaky  # type: ignore[method-assign]
    return calls


@pytest.mark.asyncio
async def test_a_commit_cut_off_before_its_end_is_sent_again(store: PostgresStore) -> None:
    calls = cut_connection(store, after_commit=False)
    await store.append([entry(1), entry(2)], [RunRow("a", 1, "wf", "running", 0)])
    assert len(calls) == 2  # looked up, not there: sent again
    assert await store.load("a") == [(1, b"a/1"), (2, b"a/2")]


@pytest.mark.asyncio
async def test_a_commit_whose_answer_was_lost_is_found_and_not_written_twice(
    store: PostgresStore,
) -> None:
    calls = cut_connection(store, after_commit=True)
    await store.append([entry(1), entry(2)], [RunRow("a", 1, "wf", "running", 0)])
    assert len(calls) == 1  # looked up, there already
    assert await store.load("a") == [(1, b"a/1"), (2, b"a/2")]
    await store.append([entry(3)])
    assert [lsn for lsn, _ in await store.load("a")] == [1, 2, 3]
