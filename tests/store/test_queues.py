"""Queue admission in every store (fusee/store/_queues.py and each backend's queue code).

Run on `MemoryStore`, `SqliteStore` and `PostgresStore` (the `opener` of
test_store.py); each test reopens the store as after a crash, and the items
come back as they were. On Postgres, admissions from many connections at
once never exceed a limit.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from _postgres import Cluster
from hypothesis import given
from hypothesis import strategies as st

from fusee.errors import NotFound
from fusee.store import Entry, PostgresStore, RunRow, SqliteStore, Store
from fusee.store import sqlite as sqlite_store
from fusee.store._postgres_sql import shard_of
from fusee.store._queues import ItemBook, QueueItem, QueueLimits, plan_admission

from . import test_store
from .test_store import Opener

# The fixtures of test_store.py: a store of each kind, and its reopening.
opener = test_store.opener
store = test_store.store


def item(id: str, queue: str = "q", **kw: object) -> QueueItem:
    return QueueItem(queue, id, 1, "wf", f"in-{id}".encode(), **kw)  # type: ignore[arg-type]


async def enqueue(into: Store, *items: QueueItem) -> list[QueueItem]:
    stored = []
    for i in items:
        got = await into.enqueue(i, RunRow(i.id, i.run, i.workflow, "queued", 0))
        assert got is not None
        stored.append(got)
    return stored


@pytest.mark.asyncio
async def test_enqueue_stores_the_item_and_a_queued_row_and_refuses_a_second_of_one_id(
    opener: Opener, store: Store
) -> None:
    (first,) = await enqueue(store, item("a", key="k", priority=2))
    assert (first.state, first.key, first.priority, first.seq > 0) == ("queued", "k", 2, True)
    assert await store.enqueue(item("a"), RunRow("a", 1, "wf", "queued", 0)) is None
    row = await store.get("a")
    assert row is not None
    assert row.status == "queued"
    store = await opener.reopen(store)
    assert await store.queue_items() == [first]
    assert [r.id for r in await store.unfinished()] == ["a"]
    # No journal until admitted: not a damaged run.
    with pytest.raises(NotFound, match="'a' is queued: it has no journal until its queue"):
        await store.load("a")


@pytest.mark.asyncio
async def test_admit_takes_what_concurrency_and_per_key_allow_by_priority_then_arrival(
    opener: Opener, store: Store
) -> None:
    await enqueue(
        store,
        item("a1", key="a"),
        item("a2", key="a"),
        item("b1", key="b", priority=5),
        item("c1", key="c", priority=-1),
        item("other", queue="r"),
    )
    limits = QueueLimits("q", concurrency=3, per_key=1)
    admission = await store.admit(limits, 1000)
    assert [i.id for i in admission.items] == ["c1", "a1", "b1"]
    assert {i.admitted_ms for i in admission.items} == {1000}
    assert (admission.wake_ms, admission.left) == (None, 1)
    store = await opener.reopen(store)
    assert (await store.admit(limits, 2000)).items == []
    assert await store.release_queued("a1") == "q"
    assert await store.release_queued("a1") is None
    assert [i.id for i in (await store.admit(limits, 3000)).items] == ["a2"]
    states = {i.id: i.state for i in await store.queue_items()}
    assert states == {"c1": "admitted", "b1": "admitted", "a2": "admitted", "other": "queued"}


@pytest.mark.asyncio
async def test_a_rate_window_counts_admissions_of_ended_runs_and_says_when_it_frees(
    opener: Opener, store: Store
) -> None:
    await enqueue(store, *(item(f"r{i}") for i in range(4)))
    limits = QueueLimits("q", rate_n=2, rate_ms=1000)
    first = await store.admit(limits, 0)
    assert [i.id for i in first.items] == ["r0", "r1"]
    assert first.wake_ms == 1000
    for id in ("r0", "r1"):
        await store.release_queued(id)
    store = await opener.reopen(store)
    assert (await store.admit(limits, 999)).items == []
    assert [i.id for i in (await store.admit(limits, 1000)).items] == ["r2", "r3"]


@pytest.mark.asyncio
async def test_debounce_and_signals_change_a_queued_item_and_unqueue_takes_it_back(
    store: Store,
) -> None:
    await enqueue(store, item("d", not_before_ms=500))
    assert await store.debounce_queued("d", b"newer", 900)
    assert not await store.debounce_queued("missing", b"x", 900)
    limits = QueueLimits("q")
    held = await store.admit(limits, 800)
    assert (held.items, held.wake_ms, held.left) == ([], 900, 1)
    (taken,) = (await store.admit(limits, 900)).items
    assert taken.input == b"newer"
    assert not await store.debounce_queued("d", b"late", 2000)
    assert await store.unqueue("d") is None  # admitted: no longer queued
    assert not await store.signal_queued("d", b"to an admitted item")
    await enqueue(store, item("e"))
    assert await store.signal_queued("e", b"one")
    assert await store.signal_queued("e", b"two")
    gone = await store.unqueue("e")
    assert gone is not None
    assert (gone.id, gone.signals) == ("e", (b"one", b"two"))
    assert [i.id for i in await store.queue_items()] == ["d"]


@pytest.mark.asyncio
async def test_start_queued_lets_an_item_in_now_keeping_its_input_and_clears_its_wake(
    store: Store,
) -> None:
    await store.enqueue(
        item("s", not_before_ms=5000), RunRow("s", 1, "wf", "queued", 0, wake_ms=5000)
    )
    assert await store.debounce_queued("s", b"newer", 6000)
    assert await store.start_queued("s", 1000) == "q"
    row = await store.get("s")
    assert row is not None
    assert (row.status, row.wake_ms) == ("queued", None)
    assert await store.start_queued("missing", 1000) is None
    (taken,) = (await store.admit(QueueLimits("q"), 1000)).items
    assert (taken.id, taken.input, taken.not_before_ms) == ("s", b"newer", 1000)
    assert await store.start_queued("s", 2000) is None  # admitted: no longer queued


@pytest.mark.asyncio
async def test_items_appended_with_records_are_stored_in_their_write_and_forgotten_ones_deleted(
    opener: Opener, store: Store
) -> None:
    admitted = item("a", seq=1, state="admitted", admitted_ms=5)
    queued = item("b", seq=2, key="k", signals=(b"s",))
    entry = Entry(1, "a", 1, b"start")
    if opener.kind == "postgres":
        # Workers that share a store admit inside it, never from memory.
        with pytest.raises(ValueError, match="admits queued runs inside the database"):
            await store.append([entry], items=[admitted])
        assert store.last_lsn == 0
        return
    await store.append([entry], [RunRow("a", 1, "wf", "running", 0)], items=[admitted, queued])
    store = await opener.reopen(store)
    assert await store.queue_items() == [admitted, queued]
    done = item("a", seq=1, state="done", admitted_ms=5)
    again = replace(item("a", seq=3), run=2)  # the id's next run, queued as its last ends
    await store.append([Entry(2, "a", 1, b"done")], items=[again, done], forget=[2])
    store = await opener.reopen(store)
    assert await store.queue_items() == [again]
    assert await store.queue_items(done=True) == [done, again]


def test_plan_admission_passes_over_a_full_key_but_stops_at_a_full_queue() -> None:
    items = [item("a1", key="a", state="admitted", admitted_ms=0), item("a2", key="a", seq=1)]
    items.append(item("b1", key="b", seq=2))
    assert [i.id for i in plan_admission(QueueLimits("q", per_key=1), items, 0).items] == ["b1"]
    full = plan_admission(QueueLimits("q", concurrency=1), items, 0)
    assert (full.items, full.left) == ([], 2)
    runnable = lambda i: i.workflow == "other"  # noqa: E731 - an engine that runs only "other"
    assert plan_admission(QueueLimits("q"), items, 0, runnable=runnable).left == 0


@pytest.mark.asyncio
async def test_a_format_2_sqlite_store_gains_the_queue_items_when_an_engine_opens_it(
    tmp_path: Path,
) -> None:
    fresh = SqliteStore(tmp_path, durability="none")
    await fresh.open()
    await fresh.close()
    conn = sqlite3.connect(tmp_path / sqlite_store.FILENAME, isolation_level=None)
    conn.execute("DROP TABLE queue_items")
    conn.execute("DROP TABLE schedules")  # format 3's too
    # Format 4 added the runs' version column, format 5 their error.
    conn.execute("ALTER TABLE runs DROP COLUMN version")
    conn.execute("ALTER TABLE runs DROP COLUMN error")
    conn.execute("PRAGMA user_version = 2")
    conn.close()
    upgraded = SqliteStore(tmp_path, durability="none")
    await upgraded.open()
    try:
        await enqueue(upgraded, item("a"))
        assert [i.id for i in await upgraded.queue_items()] == ["a"]
    finally:
        await upgraded.close()
    conn = sqlite3.connect(tmp_path / sqlite_store.FILENAME)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.FORMAT == 5
    conn.close()


@pytest.mark.asyncio
async def test_a_format_2_postgres_store_gains_the_queue_tables_when_it_opens(
    postgres_cluster: Cluster,
) -> None:
    fresh = postgres_cluster.new_store()
    await fresh.open()
    await fresh.close()
    schema = fresh.schema
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        await conn.execute(f'DROP TABLE "{schema}".queue_items, "{schema}".queues')
        await conn.execute(f"UPDATE \"{schema}\".meta SET value = 2 WHERE key = 'format'")
    finally:
        await conn.close()
    upgraded = PostgresStore(postgres_cluster.dsn, schema=schema, durability="none")
    await upgraded.open()
    try:
        await enqueue(upgraded, item("a"))
        admission = await upgraded.admit(QueueLimits("q", concurrency=1), 0)
        assert [i.id for i in admission.items] == ["a"]
    finally:
        await upgraded.close()


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param(QueueLimits("q", concurrency=3), id="concurrency"),
        pytest.param(QueueLimits("q", rate_n=3, rate_ms=60_000), id="rate"),
        pytest.param(QueueLimits("q", per_key=3), id="per-key"),
    ],
)
@pytest.mark.asyncio
async def test_postgres_admissions_from_many_connections_at_once_never_exceed_a_limit(
    postgres_cluster: Cluster, limits: QueueLimits
) -> None:
    schema = postgres_cluster.new_name("queues_")
    stores = [
        PostgresStore(postgres_cluster.dsn, schema=schema, durability="none") for _ in range(4)
    ]
    for s in stores:
        await s.open()
    try:
        await enqueue(stores[0], *(item(f"i{n}", key="k") for n in range(20)))
        rounds = await asyncio.gather(*(s.admit(limits, 0) for s in stores for _ in range(3)))
        admitted = [i.id for a in rounds for i in a.items]
        assert len(admitted) == len(set(admitted)) == 3
    finally:
        for s in stores:
            await s.close()


@pytest.mark.asyncio
async def test_postgres_admissions_of_a_queue_without_limits_take_each_item_once(
    postgres_cluster: Cluster,
) -> None:
    schema = postgres_cluster.new_name("queues_")
    stores = [
        PostgresStore(postgres_cluster.dsn, schema=schema, durability="none") for _ in range(4)
    ]
    for s in stores:
        await s.open()
    try:
        await enqueue(stores[0], *(item(f"i{n}") for n in range(40)))
        rounds = await asyncio.gather(*(s.admit(QueueLimits("q"), 0) for s in stores))
        admitted = [i.id for a in rounds for i in a.items]
        assert sorted(admitted) == sorted(f"i{n}" for n in range(40))
    finally:
        for s in stores:
            await s.close()


# One operation on a book: (kind, argument).
_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.tuples(
                st.sampled_from(["q", "r"]),
                st.sampled_from([None, "k1", "k2"]),
                st.integers(-1, 1),
                st.sampled_from([0, 0, 0, 2]),
            ),
        ),
        st.tuples(st.just("admit"), st.integers(0, 3)),
        st.tuples(st.just("release"), st.integers(0, 6)),
        st.tuples(st.just("remove"), st.integers(0, 6)),
    ),
    max_size=40,
)
_limits = st.builds(
    QueueLimits,
    name=st.just("q"),
    concurrency=st.one_of(st.none(), st.integers(1, 4)),
    per_key=st.one_of(st.none(), st.integers(1, 2)),
    rate_n=st.one_of(st.none(), st.integers(1, 3)),
    rate_ms=st.integers(1, 20),
)


@given(ops=_ops, limits=_limits)
def test_a_books_admissions_are_the_rule_s_over_its_items(
    ops: list[tuple[str, Any]], limits: QueueLimits
) -> None:
    """An `ItemBook` keeps its counts between admissions; `plan_admission` counts afresh."""
    book = ItemBook()
    now = 0
    n = 0
    for kind, arg in ops:
        if kind == "add":
            queue, key, priority, not_before = arg
            book.add(item(f"i{n}", queue, key=key, priority=priority, not_before_ms=not_before))
            n += 1
        elif kind == "admit":
            now += arg
            mine = [i for i in book.items(done=True) if i.queue == limits.name]
            expected = plan_admission(limits, mine, now)
            got = book.admit_now(limits, now)
            assert (got.items, got.wake_ms, got.left) == (
                expected.items,
                expected.wake_ms,
                expected.left,
            )
        else:
            # The arg-th admitted (release) or queued (remove) item, if any.
            state = "admitted" if kind == "release" else "queued"
            ids = [i.id for i in book.items() if i.state == state]
            if ids:
                id = ids[arg % len(ids)]
                assert (book.release if kind == "release" else book.remove)(id) is not None


@pytest.mark.asyncio
async def test_a_postgres_admission_takes_a_signal_held_while_it_was_deciding(
    postgres_cluster: Cluster,
) -> None:
    # A queue with a budget serializes admissions on its lock row and reads
    # its items unlocked: a signal held for an item after that read and
    # before the item is marked admitted must come with the admitted item.
    schema = postgres_cluster.new_name("queues_")
    admitter, signaller = (
        PostgresStore(postgres_cluster.dsn, schema=schema, durability="none") for _ in range(2)
    )
    await admitter.open()
    await signaller.open()
    try:
        await enqueue(admitter, item("a"))
        in_transaction = admitter._in_transaction

        async def meanwhile(fn: Any, doing: str) -> Any:
            class Conn:
                def __init__(self, conn: Any) -> None:
                    self.conn = conn

                def __getattr__(self, name: str) -> Any:
                    return getattr(self.conn, name)

                async def fetch(self, query: str, *args: Any) -> Any:
                    rows = await self.conn.fetch(query, *args)
                    if query.lstrip().startswith("SELECT"):
                        assert await signaller.signal_queued("a", b"late")
                    return rows

            return await in_transaction(lambda conn: fn(Conn(conn)), doing)

        admitter._in_transaction = meanwhile  # type: ignore[method-assign]
        (admitted,) = (await admitter.admit(QueueLimits("q", concurrency=1), 0)).items
        assert admitted.signals == (b"late",)
    finally:
        await admitter.close()
        await signaller.close()


@pytest.mark.asyncio
async def test_a_postgres_admission_fenced_by_leases_admits_only_under_the_current_ones(
    postgres_cluster: Cluster,
) -> None:
    # A worker admits the items of its shards only while it still holds
    # them: one that took a shard over finds every item admitted before it
    # took it (its recovery starts them), and none admitted after.
    store = postgres_cluster.new_store()
    await store.open()
    try:
        epochs = await store.acquire_shards("w1", store.shards, lease_s=30)
        await enqueue(store, item("a"), item("b"))
        shard_a = shard_of("a", store.shards)
        taken_over = {**epochs, shard_a: epochs[shard_a] + 1}
        admitted = (await store.admit(QueueLimits("q"), 0, fence=taken_over)).items
        assert "a" not in [i.id for i in admitted]
        (late,) = (await store.admit(QueueLimits("q"), 0, fence=epochs)).items
        assert late.id == "a"
    finally:
        await store.close()
