"""Behaviour every store shares: run on `MemoryStore`, `SqliteStore` and `PostgresStore`.

The rule under test is the store module's: a store gives back exactly the
bytes it was given, in LSN order, and an append is all or nothing. Reopening
is what the engine does after a crash: the memory store reopens the same
object (as the test host does); SQLite opens a new store object on the same
directory, Postgres one on the same schema (each test has a schema of its
own in the session's throwaway cluster).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import _postgres
import pytest
import pytest_asyncio
from _postgres import Cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusee import record
from fusee.errors import CorruptRecord, NotFound, StoreError
from fusee.store import (
    RUN_STATUSES,
    UNFINISHED_STATUSES,
    Entry,
    MemoryStore,
    PostgresStore,
    RunRow,
    SqliteStore,
    Store,
)


@dataclasses.dataclass
class Opener:
    """Opens the store under test, and opens it again as after a crash."""

    kind: str
    directory: Path
    postgres: Cluster | None = None
    memory: MemoryStore = dataclasses.field(default_factory=MemoryStore)
    opened: list[Store] = dataclasses.field(default_factory=list)
    schema: str = ""

    async def open(self) -> Store:
        store: Store
        if self.kind == "memory":
            store = self.memory
        elif self.kind == "postgres":
            assert self.postgres is not None
            if not self.schema:
                self.schema = self.postgres.new_name("store_")
            store = PostgresStore(self.postgres.dsn, schema=self.schema, durability="none")
        else:
            store = SqliteStore(self.directory, durability="none")
        await store.open()
        self.opened.append(store)
        return store

    async def reopen(self, store: Store) -> Store:
        await store.close()
        return await self.open()

    def fail_next_append(self, store: Store) -> None:
        if isinstance(store, MemoryStore):
            store.fail_next_append(StoreError("injected: disk full"))
        elif isinstance(store, PostgresStore):
            # Raised inside the transaction, after the rows went in.
            _postgres.fail_next_append(store)
        else:
            assert isinstance(store, SqliteStore)
            # Raised inside the transaction, after the rows went in: the
            # rollback is what keeps them out.
            store.fail_next_append(sqlite3.OperationalError("injected: disk I/O error"))


STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres"),
]


@pytest_asyncio.fixture(params=STORES)
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    # The cluster starts (once per session) only when a Postgres test runs.
    cluster = request.getfixturevalue("postgres_cluster") if request.param == "postgres" else None
    o = Opener(request.param, tmp_path / "store", cluster)
    try:
        yield o
    finally:
        for store in o.opened:
            await store.close()


@pytest_asyncio.fixture
async def store(opener: Opener) -> Store:
    return await opener.open()


def row(
    id: str,
    run: int = 1,
    *,
    status: str = "running",
    workflow: str = "checkout",
    started_ms: int = 0,
    **attributes: object,
) -> RunRow:
    return RunRow(id, run, workflow, status, started_ms, attributes=attributes)


def entries(id: str, run: int, lsns: range | list[int]) -> list[Entry]:
    return [Entry(lsn, id, run, f"{id}/{run}/{lsn}".encode()) for lsn in lsns]


def pairs(es: list[Entry]) -> list[tuple[int, bytes]]:
    return [(e.lsn, e.data) for e in es]


@pytest.mark.asyncio
async def test_appended_records_load_in_lsn_order(store: Store) -> None:
    first, second = entries("a", 1, range(1, 4)), entries("a", 1, range(4, 6))
    await store.append(first, [row("a")])
    await store.append(second)

    assert await store.load("a") == pairs(first + second)
    assert store.last_lsn == 5


@pytest.mark.asyncio
async def test_one_append_holds_records_of_many_runs(store: Store) -> None:
    batch = [Entry(1, "a", 1, b"a1"), Entry(2, "b", 1, b"b1"), Entry(3, "a", 1, b"a2")]
    await store.append(batch, [row("a"), row("b")])

    assert await store.load("a") == [(1, b"a1"), (3, b"a2")]
    assert await store.load("b") == [(2, b"b1")]


@pytest.mark.asyncio
async def test_load_after_lsn_returns_only_later_records(store: Store) -> None:
    batch = entries("a", 1, [2, 5, 9])
    await store.append(batch, [row("a")])

    assert await store.load("a", after_lsn=0) == pairs(batch)
    assert await store.load("a", after_lsn=4) == pairs(batch[1:])
    assert await store.load("a", after_lsn=5) == pairs(batch[2:])
    assert await store.load("a", after_lsn=9) == []


@pytest.mark.asyncio
async def test_load_defaults_to_the_latest_run_and_explicit_runs_stay_readable(
    store: Store,
) -> None:
    old, new = entries("a", 1, range(1, 3)), entries("a", 7, range(3, 5))
    await store.append(old, [row("a", 1, status="continued")])
    await store.append(new, [row("a", 7)])

    assert await store.load("a") == pairs(new)
    assert await store.load("a", 7) == pairs(new)
    assert await store.load("a", 1) == pairs(old)


@pytest.mark.asyncio
async def test_load_follows_the_row_not_the_highest_run(store: Store) -> None:
    # The row names the latest run; a higher-numbered run with records but no
    # row (its start not yet reflected in the row) does not take over.
    await store.append(entries("a", 5, [1]), [row("a", 3)])
    await store.append(entries("a", 3, [2]))

    assert await store.load("a") == [(2, b"a/3/2")]


@pytest.mark.asyncio
async def test_load_of_an_id_without_a_row_reads_its_highest_run(store: Store) -> None:
    await store.append(entries("a", 1, [1]) + entries("a", 2, [2]))

    assert await store.load("a") == [(2, b"a/2/2")]


@pytest.mark.asyncio
async def test_a_run_with_a_row_and_no_records_is_a_corrupt_record_naming_it(
    store: Store,
) -> None:
    await store.append([], [row("a", 4)])

    with pytest.raises(CorruptRecord, match="'a'"):
        await store.load("a")
    with pytest.raises(CorruptRecord, match="'a'"):
        await store.load("a", 4)


@pytest.mark.asyncio
async def test_load_of_an_unknown_id_raises_not_found_naming_it(store: Store) -> None:
    await store.append(entries("a", 1, [1]), [row("a")])

    with pytest.raises(NotFound, match=r"'order-9'.*fusee list"):
        await store.load("order-9")
    with pytest.raises(NotFound, match=r"'order-9'.*fusee list"):
        await store.load("order-9", 1)
    with pytest.raises(NotFound, match=r"run 2 of 'a'"):
        await store.load("a", 2)


@pytest.mark.asyncio
async def test_a_row_replaces_the_previous_row_of_its_id(store: Store) -> None:
    await store.append(entries("a", 1, [1]), [row("a", 1, customer="ada")])
    done = RunRow("a", 1, "checkout", "completed", 0, finished_ms=10, wake_ms=None)
    await store.append(entries("a", 1, [2]), [done])

    assert await store.get("a") == done
    assert await store.get("b") is None
    assert [r.id for r in await store.list()] == ["a"]


@pytest.mark.asyncio
async def test_rows_keep_every_field(store: Store) -> None:
    full = RunRow(
        "child-1",
        3,
        "ship",
        "suspended",
        1_700_000_000_000,
        finished_ms=None,
        wake_ms=1_700_000_060_000,
        attributes={"customer": "ada", "total": 12.5, "tags": ["a", "b"], "n": None, "by": {1: 2}},
        parent="order-1",
    )
    await store.append([], [full])

    assert await store.get("child-1") == full


@pytest.mark.asyncio
async def test_the_last_row_of_an_id_in_one_batch_wins(store: Store) -> None:
    await store.append([], [row("a", 1, status="continued"), row("a", 2)])

    got = await store.get("a")
    assert got is not None
    assert (got.run, got.status) == (2, "running")


@pytest.mark.asyncio
async def test_list_filters_combine_and_order_by_start_then_id(store: Store) -> None:
    rows = [
        row("c", started_ms=2, status="running", workflow="checkout", tier="gold"),
        row("b", started_ms=2, status="completed", workflow="checkout", tier="gold"),
        row("a", started_ms=3, status="running", workflow="ship", tier="gold"),
        row("d", started_ms=1, status="running", workflow="checkout", tier="silver"),
        row("e", started_ms=5, status="failed", workflow="checkout"),
    ]
    await store.append([], rows)

    async def ids(**filters: object) -> list[str]:
        return [r.id for r in await store.list(**filters)]  # type: ignore[arg-type]

    assert await ids() == ["d", "b", "c", "a", "e"]
    assert await ids(status="running") == ["d", "c", "a"]
    assert await ids(workflow="checkout") == ["d", "b", "c", "e"]
    assert await ids(status="running", workflow="checkout") == ["d", "c"]
    assert await ids(attributes={"tier": "gold"}) == ["b", "c", "a"]
    assert await ids(attributes={"tier": "gold"}, status="running") == ["c", "a"]
    assert await ids(attributes={"tier": "gold", "other": 1}) == []
    assert await ids(limit=2) == ["d", "b"]
    assert await ids(attributes={"tier": "gold"}, limit=2) == ["b", "c"]
    assert await ids(limit=0) == []
    assert await ids(status="paused") == []


@pytest.mark.asyncio
async def test_list_pages_newest_first_with_a_cursor_and_time_bounds(store: Store) -> None:
    await store.append(
        [],
        [
            row("c", started_ms=2, status="running"),
            row("b", started_ms=2, status="completed"),
            row("a", started_ms=3, status="running"),
            row("d", started_ms=1, status="completed"),
            row("e", started_ms=5, status="failed"),
        ],
    )

    async def ids(**filters: object) -> list[str]:
        return [r.id for r in await store.list(**filters)]  # type: ignore[arg-type]

    assert await ids(newest_first=True) == ["e", "a", "c", "b", "d"]
    assert await ids(newest_first=True, limit=2) == ["e", "a"]
    assert await ids(newest_first=True, after=(3, "a"), limit=2) == ["c", "b"]
    assert await ids(newest_first=True, after=(2, "b")) == ["d"]
    assert await ids(after=(2, "b")) == ["c", "a", "e"]
    assert await ids(newest_first=True, status="running", after=(3, "a")) == ["c"]
    assert await ids(started_from_ms=2, started_to_ms=3) == ["b", "c", "a"]
    assert await ids(newest_first=True, started_to_ms=2) == ["c", "b", "d"]
    with pytest.raises(ValueError, match="after must be"):
        await store.list(after=("2", "b"))  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_attribute_filters_compare_values_as_msgpack_returns_them(store: Store) -> None:
    await store.append([], [row("a", tags=("x", "y"), n=1)])

    (found,) = await store.list(attributes={"tags": ("x", "y")})
    assert found.attributes["tags"] == ["x", "y"]
    assert await store.list(attributes={"n": 1}) == [found]
    assert await store.list(attributes={"n": 2}) == []


@pytest.mark.asyncio
async def test_list_refuses_an_unknown_status_and_a_negative_limit(store: Store) -> None:
    with pytest.raises(ValueError, match="'runing' is not one of"):
        await store.list(status="runing")
    with pytest.raises(ValueError, match="limit"):
        await store.list(limit=-1)


@pytest.mark.asyncio
async def test_unfinished_lists_running_suspended_and_paused_runs(store: Store) -> None:
    statuses = sorted(RUN_STATUSES)
    await store.append(
        [], [row(status, status=status, started_ms=i) for i, status in enumerate(statuses)]
    )

    found = await store.unfinished()

    assert {r.status for r in found} == UNFINISHED_STATUSES
    assert [r.started_ms for r in found] == sorted(r.started_ms for r in found)


@pytest.mark.asyncio
async def test_next_run_never_repeats_also_across_reopening(opener: Opener, store: Store) -> None:
    seen = [await store.next_run() for _ in range(5)]
    for _ in range(3):
        store = await opener.reopen(store)
        seen += [await store.next_run() for _ in range(3)]

    assert seen[0] == 1
    assert seen == sorted(set(seen))


@pytest.mark.asyncio
async def test_concurrent_next_run_calls_get_distinct_numbers(store: Store) -> None:
    numbers = await asyncio.gather(*(store.next_run() for _ in range(300)))

    assert sorted(numbers) == list(range(1, 301))


@pytest.mark.asyncio
async def test_reopening_keeps_everything(opener: Opener, store: Store) -> None:
    await store.append(entries("a", 1, range(1, 4)), [row("a", tier="gold")])
    await store.append(entries("b", 2, range(4, 6)), [row("b", 2, status="completed")])
    before = (await store.load("a"), await store.load("b"), await store.list())

    store = await opener.reopen(store)

    assert (await store.load("a"), await store.load("b"), await store.list()) == before
    assert store.last_lsn == 5
    await store.append(entries("a", 1, [6]))
    assert (await store.load("a"))[-1] == (6, b"a/1/6")


@pytest.mark.asyncio
async def test_a_failed_append_stores_nothing_of_its_batch(opener: Opener, store: Store) -> None:
    await store.append(entries("a", 1, [1]), [row("a")])
    opener.fail_next_append(store)

    with pytest.raises(StoreError, match="injected"):
        await store.append(
            entries("a", 1, [2, 3]) + entries("b", 1, [4]),
            [row("a", status="completed"), row("b")],
        )

    assert await store.load("a") == [(1, b"a/1/1")]
    assert await store.get("b") is None
    got = await store.get("a")
    assert got is not None
    assert got.status == "running"
    assert store.last_lsn == 1
    # The failed batch's LSNs were never stored: the engine may append them again.
    await store.append(entries("a", 1, [2]))
    assert await store.load("a") == [(1, b"a/1/1"), (2, b"a/1/2")]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("lsns", "message"),
    [
        pytest.param([3], "does not exceed the store's last LSN 5", id="below-last"),
        pytest.param([5], "does not exceed the store's last LSN 5", id="equal-to-last"),
        pytest.param([6, 8, 7], "must increase within a batch: 7 after 8", id="decreasing"),
        pytest.param([6, 6], "must increase within a batch: 6 after 6", id="repeated"),
    ],
)
async def test_lsns_that_do_not_increase_raise_value_error_and_store_nothing(
    store: Store, lsns: list[int], message: str
) -> None:
    await store.append(entries("a", 1, range(1, 6)), [row("a")])

    with pytest.raises(ValueError, match=message):
        await store.append(entries("a", 1, lsns), [row("a", status="failed")])

    assert [lsn for lsn, _ in await store.load("a")] == [1, 2, 3, 4, 5]
    got = await store.get("a")
    assert got is not None
    assert got.status == "running"


@pytest.mark.asyncio
async def test_bad_values_are_refused_before_anything_is_stored(store: Store) -> None:
    with pytest.raises(TypeError, match="bytes"):
        await store.append([Entry(1, "a", 1, bytearray(b"x"))])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="msgpack"):
        await store.append([], [row("a", when=object())])
    with pytest.raises(TypeError, match="names of 'a' must be str"):
        await store.append([], [RunRow("a", 1, "wf", "running", 0, attributes={1: "x"})])  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="'done' of 'a' is not one of"):
        await store.append([], [row("a", status="done")])

    assert await store.list() == []
    assert store.last_lsn == 0


@pytest.mark.asyncio
async def test_concurrent_appends_from_many_tasks_land_in_lsn_order(store: Store) -> None:
    lsn = 0

    async def writer(id: str) -> None:
        nonlocal lsn
        for i in range(10):
            # Taken and passed to append with no await between, as the engine does.
            lsn += 1
            await store.append([Entry(lsn, id, 1, f"{id}:{i}".encode())], [row(id)])
            if i % 3 == 0:
                await asyncio.sleep(0)

    ids = [f"w{n}" for n in range(50)]
    await asyncio.gather(*(writer(id) for id in ids))

    assert store.last_lsn == 500
    every: list[int] = []
    for id in ids:
        journal = await store.load(id)
        assert [data for _, data in journal] == [f"{id}:{i}".encode() for i in range(10)]
        assert [n for n, _ in journal] == sorted(n for n, _ in journal)
        every += [n for n, _ in journal]
    assert sorted(every) == list(range(1, 501))


@pytest.mark.asyncio
async def test_reads_see_appends_called_before_them(store: Store) -> None:
    appending = asyncio.ensure_future(store.append(entries("a", 1, [1, 2]), [row("a")]))
    await asyncio.sleep(0)  # the append is called (and queued), not finished

    assert await store.load("a") == [(1, b"a/1/1"), (2, b"a/1/2")]
    await appending


@pytest.mark.asyncio
async def test_a_damaged_record_comes_back_as_stored(store: Store) -> None:
    good = record.encode(record.Start(run=1, id="a", wtype="checkout", input=b"\xc0"))
    damaged = bytes([good[0], good[1] ^ 0xFF]) + good[2:]
    await store.append([Entry(1, "a", 1, good), Entry(2, "a", 1, damaged)], [row("a")])

    (_, first), (_, second) = await store.load("a")

    assert (first, second) == (good, damaged)
    assert isinstance(record.decode(first), record.Start)
    with pytest.raises(CorruptRecord):
        record.decode(second)


@pytest.mark.asyncio
async def test_empty_bytes_and_large_records_round_trip(store: Store) -> None:
    big = bytes(range(256)) * 4096
    await store.append([Entry(1, "a", 1, b""), Entry(2, "a", 1, big)], [row("a")])

    assert await store.load("a") == [(1, b""), (2, big)]


@pytest.mark.asyncio
async def test_a_closed_store_refuses_calls_and_closing_twice_is_harmless(store: Store) -> None:
    await store.close()
    await store.close()

    with pytest.raises(StoreError, match="closed"):
        await store.append(entries("a", 1, [1]))
    with pytest.raises(StoreError, match="closed"):
        await store.load("a")
    with pytest.raises(StoreError, match="closed"):
        await store.next_run()


@pytest.mark.asyncio
async def test_close_waits_for_appends_in_flight(opener: Opener, store: Store) -> None:
    appends = [
        asyncio.ensure_future(store.append(entries("a", 1, [lsn]), [row("a")]))
        for lsn in range(1, 21)
    ]
    await asyncio.sleep(0)

    await store.close()

    await asyncio.gather(*appends)
    store = await opener.open()
    assert [lsn for lsn, _ in await store.load("a")] == list(range(1, 21))


def test_stores_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(MemoryStore(), Store)
    assert isinstance(SqliteStore(tmp_path), Store)
    assert isinstance(PostgresStore("postgresql://db/fusee"), Store)


# -- a property: whatever the batches, each run loads exactly what was appended ------------

_ids = st.sampled_from(["a", "b", "c"])
_batches = st.lists(
    st.lists(st.tuples(_ids, st.integers(1, 3), st.binary(max_size=20)), max_size=6),
    min_size=1,
    max_size=8,
)


async def _round_trip(store: Store, batches: list[list[tuple[str, int, bytes]]]) -> None:
    await store.open()
    try:
        lsn = 0
        model: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
        for batch in batches:
            es = []
            for id, run, data in batch:
                lsn += 1
                es.append(Entry(lsn, id, run, data))
                model.setdefault((id, run), []).append((lsn, data))
            await store.append(es)
        for (id, run), journal in model.items():
            assert await store.load(id, run) == journal
            middle = journal[len(journal) // 2][0]
            assert await store.load(id, run, after_lsn=middle) == [
                p for p in journal if p[0] > middle
            ]
        assert store.last_lsn == lsn
    finally:
        await store.close()


@pytest.mark.parametrize("kind", STORES)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batches=_batches)
def test_each_run_loads_exactly_its_appended_records(
    kind: str, batches: list[list[tuple[str, int, bytes]]], request: pytest.FixtureRequest
) -> None:
    if kind == "memory":
        asyncio.run(_round_trip(MemoryStore(), batches))
        return
    if kind == "postgres":
        cluster: Cluster = request.getfixturevalue("postgres_cluster")
        asyncio.run(_round_trip(cluster.new_store(), batches))
        return
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(_round_trip(SqliteStore(directory, durability="none"), batches))
