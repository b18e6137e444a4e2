"""What only the SQLite store has: a file format, threads, other processes, damage.

Failures are made real where SQLite can make them: a write lock held by a
second connection (as another process would hold it), files that are not
stores. Readers run in another thread and in another process while the
writer appends, coordinated by pipes and awaits, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from fusee.errors import NotFound, StoreError
from fusee.store import Entry, MemoryStore, RunRow, SqliteStore, open_store
from fusee.store import sqlite as sqlite_module
from fusee.store.sqlite import APPLICATION_ID, FILENAME, FORMAT, PAGE_SIZE


def row(id: str, run: int = 1, status: str = "running") -> RunRow:
    return RunRow(id, run, "checkout", status, 0)


@contextlib.contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A second connection to the store file, as another process would have."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "data", durability="none")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def made_store(directory: Path, lsns: range = range(1, 4)) -> None:
    s = SqliteStore(directory, durability="none")
    await s.open()
    await s.append([Entry(n, "a", 1, b"x%d" % n) for n in lsns], [row("a")])
    await s.close()


# -- the file ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_store_is_one_file_in_a_directory_created_with_its_parents(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "deep" / "er" / "data"

    await made_store(directory)

    # Closing folds the WAL back into the file: nothing else is left.
    assert sorted(p.name for p in directory.iterdir()) == [FILENAME]
    with connect(directory / FILENAME) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (FORMAT,)
        assert conn.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA page_size").fetchone() == (PAGE_SIZE,)


@pytest.mark.asyncio
async def test_a_format_4_store_gains_the_runs_error_column_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    await made_store(tmp_path)
    with connect(tmp_path / FILENAME) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN error")
        conn.execute("PRAGMA user_version = 4")

    s = SqliteStore(tmp_path, durability="none")
    await s.open()
    try:
        assert await s.get("a") == row("a")
        paused = RunRow("b", 1, "checkout", "paused", 0, error="Traceback ...\nKeyError: 'x'")
        await s.append([Entry(4, "b", 1, b"y")], [paused])
        assert await s.get("b") == paused
    finally:
        await s.close()
    with connect(tmp_path / FILENAME) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (FORMAT,) == (5,)


@pytest.mark.asyncio
async def test_a_store_from_a_newer_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    await made_store(tmp_path)
    with connect(tmp_path / FILENAME) as conn:
        conn.execute(f"PRAGMA user_version = {FORMAT + 1}")

    for readonly in (False, True):
        s = SqliteStore(tmp_path, readonly=readonly)
        with pytest.raises(StoreError) as raised:
            await s.open()
        assert str(raised.value) == (
            f"store {tmp_path / FILENAME} has format {FORMAT + 1}, newer than this fusee "
            f"understands ({FORMAT}); upgrade fusee"
        )
        await s.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "readonly", [pytest.param(False, id="writer"), pytest.param(True, id="readonly")]
)
async def test_a_file_that_is_not_a_database_is_refused_naming_it(
    tmp_path: Path, readonly: bool
) -> None:
    (tmp_path / FILENAME).write_bytes(b"these are my notes, not a database\n" * 200)

    with pytest.raises(StoreError, match=rf"{tmp_path / FILENAME} is not an SQLite database"):
        await SqliteStore(tmp_path, readonly=readonly).open()
    assert (tmp_path / FILENAME).read_bytes().startswith(b"these are my notes")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "readonly", [pytest.param(False, id="writer"), pytest.param(True, id="readonly")]
)
async def test_another_programs_database_is_refused_and_left_alone(
    tmp_path: Path, readonly: bool
) -> None:
    with connect(tmp_path / FILENAME) as conn:
        conn.execute("CREATE TABLE contacts (name TEXT)")

    with pytest.raises(StoreError, match="is an SQLite database but not a fusee store"):
        await SqliteStore(tmp_path, readonly=readonly).open()
    with connect(tmp_path / FILENAME) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (0,)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:4096] + b"\xff" * (len(data) - 4096), id="overwritten"),
    ],
)
async def test_a_damaged_database_is_refused_naming_it(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    await made_store(tmp_path, range(1, 200))
    path = tmp_path / FILENAME
    path.write_bytes(damage(path.read_bytes()))

    with pytest.raises(StoreError, match=rf"{path} is damaged"):
        await SqliteStore(tmp_path).open()


@pytest.mark.asyncio
async def test_readonly_needs_an_existing_store(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(StoreError) as raised:
        await SqliteStore(missing, readonly=True).open()
    assert str(raised.value) == (
        f"no fusee store in {missing}; start an engine there first or pass --data"
    )
    assert not missing.exists()

    with pytest.raises(StoreError, match="no fusee store in"):
        await SqliteStore(tmp_path, readonly=True).open()


@pytest.mark.asyncio
async def test_a_readonly_store_reads_but_refuses_writes(tmp_path: Path) -> None:
    await made_store(tmp_path)
    reader = SqliteStore(tmp_path, readonly=True)
    await reader.open()
    try:
        assert [n for n, _ in await reader.load("a")] == [1, 2, 3]
        assert reader.last_lsn == 3
        with pytest.raises(StoreError, match="read-only"):
            await reader.append([Entry(4, "a", 1, b"x")])
        with pytest.raises(StoreError, match="read-only"):
            await reader.next_run()
    finally:
        await reader.close()


# -- durability ----------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("durability", "synchronous"),
    [pytest.param("fsync", 2, id="fsync"), pytest.param("none", 0, id="none")],
)
async def test_each_durability_sets_sqlite_sync_and_keeps_data(
    tmp_path: Path, durability: str, synchronous: int
) -> None:
    s = SqliteStore(tmp_path, durability=durability)
    await s.open()
    try:
        assert s._synchronous == synchronous  # FULL = 2, OFF = 0
        for n in range(1, 6):
            await s.append([Entry(n, "a", 1, b"%d" % n)], [row("a")])
    finally:
        await s.close()

    again = SqliteStore(tmp_path, durability=durability)
    await again.open()
    try:
        assert await again.load("a") == [(n, b"%d" % n) for n in range(1, 6)]
    finally:
        await again.close()


def test_an_unknown_durability_is_a_value_error_naming_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'fsync'.*'none'.*not 'full'"):
        SqliteStore(tmp_path, durability="full")
    with pytest.raises(ValueError, match=r"'fsync'.*'none'.*not 'sometimes'"):
        open_store("memory", durability="sometimes")


# -- the writer thread ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_appends_queued_during_a_commit_share_the_next_transaction(
    store: SqliteStore,
) -> None:
    before = store.transactions
    with connect(store.path) as blocker:
        # Another process's write lock: the writer's commit waits on it while
        # the appends below queue up.
        blocker.execute("BEGIN IMMEDIATE")
        appends = [
            asyncio.ensure_future(store.append([Entry(n, f"w{n}", 1, b"x")], [row(f"w{n}")]))
            for n in range(1, 31)
        ]
        await asyncio.sleep(0)  # every append is queued
        blocker.execute("ROLLBACK")
        await asyncio.gather(*appends)

    # The writer took one or more before it blocked, and the rest together.
    assert store.transactions - before <= 2
    assert store.last_lsn == 30
    assert len(await store.list()) == 30


@pytest.mark.asyncio
async def test_an_append_that_finds_the_write_lock_taken_waits_off_the_loop(
    store: SqliteStore,
) -> None:
    # A lone append commits on the loop's thread, but never waits for a lock
    # there: another connection's write (a client posting a command) would
    # freeze the loop for as long as it holds it.
    await store.append([Entry(1, "a", 1, b"1")], [row("a")])
    with connect(store.path) as blocker:
        blocker.execute("BEGIN IMMEDIATE")
        blocked = asyncio.ensure_future(store.append([Entry(2, "b", 1, b"2")], [row("b")]))
        ticks = 0
        while ticks < 5:  # the loop goes on while the append waits
            await asyncio.sleep(0.01)
            ticks += 1
        assert not blocked.done()
        blocker.execute("ROLLBACK")
        await blocked
    await store.append([Entry(3, "c", 1, b"3")], [row("c")])
    assert store.last_lsn == 3
    assert sorted(r.id for r in await store.list()) == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_appends_committed_on_the_loop_let_its_other_work_in_now_and_then(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lone appends commit on the loop's thread and need not leave it: a
    # sequential run would then hold the loop for its whole length, so the
    # appends yield to the loop's other work once they held it `_HOLD_S`.
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    try:
        await store.append([Entry(1, "a", 1, b"1")], [row("a")])

        monkeypatch.setattr(sqlite_module, "_HOLD_S", 3600.0)
        before = ticks
        for n in range(2, 202):
            await store.append([Entry(n, "a", 1, b"x")], [row("a")])
        assert ticks == before  # none left the loop's turn

        monkeypatch.setattr(sqlite_module, "_HOLD_S", 0.0)
        for n in range(202, 212):
            await store.append([Entry(n, "a", 1, b"x")], [row("a")])
        assert ticks >= before + 10  # each let the ticker in
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    assert store.last_lsn == 211


@pytest.mark.asyncio
async def test_bytes_and_none_are_bound_as_they_are_and_a_programs_own_adapter_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sqlite3's adapters are the process's: the store adds an identity
    # adapter for bytes and None where the program has none of its own.
    adapters: dict[Any, Any] = sqlite3.adapters
    as_bytes, as_none = (bytes, sqlite3.PrepareProtocol), (type(None), sqlite3.PrepareProtocol)
    monkeypatch.delitem(adapters, as_none, raising=False)

    def own(value: bytes) -> bytes:
        return value

    monkeypatch.setitem(adapters, as_bytes, own)
    s = SqliteStore(tmp_path / "data", durability="none")
    await s.open()
    try:
        await s.append([Entry(1, "a", 1, b"\x00journal")], [row("a")])
        assert adapters[as_bytes] is own
        assert adapters[as_none](None) is None
        assert await s.load("a") == [(1, b"\x00journal")]
        assert await s.get("a") == row("a")
    finally:
        await s.close()


@pytest.mark.asyncio
async def test_a_failing_append_fails_those_called_behind_it_but_not_before_it(
    store: SqliteStore,
) -> None:
    """A journal has no holes: what was called before the failure was known is not written."""
    with connect(store.path) as blocker:
        blocker.execute("BEGIN IMMEDIATE")
        first = asyncio.ensure_future(store.append([Entry(1, "a", 1, b"1")], [row("a")]))
        await asyncio.sleep(0)
        store.fail_next_append(sqlite3.OperationalError("injected"))
        bad = asyncio.ensure_future(store.append([Entry(2, "b", 1, b"2")], [row("b")]))
        await asyncio.sleep(0)
        behind = asyncio.ensure_future(store.append([Entry(3, "c", 1, b"3")], [row("c")]))
        await asyncio.sleep(0)
        # Whatever the writer took before the lock stopped it, `bad` shares
        # a transaction with another append.
        blocker.execute("ROLLBACK")
        await first
        with pytest.raises(StoreError, match="injected"):
            await bad
        with pytest.raises(StoreError, match="an append called before this one failed"):
            await behind

    assert [r.id for r in await store.list()] == ["a"]
    for id in ("b", "c"):
        with pytest.raises(NotFound):
            await store.load(id)
    assert store.last_lsn == 1
    # Called once the failure was known: written, with the LSNs that were lost.
    await store.append([Entry(2, "d", 1, b"4")], [row("d")])
    assert await store.load("d") == [(2, b"4")]


@pytest.mark.asyncio
async def test_get_answers_from_a_write_in_flight_and_then_from_the_database(
    store: SqliteStore,
) -> None:
    with connect(store.path) as blocker:
        blocker.execute("BEGIN IMMEDIATE")
        writing = asyncio.ensure_future(store.append([Entry(1, "a", 1, b"1")], [row("a")]))
        await asyncio.sleep(0)
        assert (await store.get("a")) == row("a")
        assert await store.get("b") is None
        blocker.execute("ROLLBACK")
        await writing
    assert store._pending == {}
    assert (await store.get("a")) == row("a")


@pytest.mark.asyncio
async def test_a_store_locked_by_another_process_fails_the_append_and_stores_nothing(
    tmp_path: Path,
) -> None:
    s = SqliteStore(tmp_path, durability="none")
    s._busy_timeout_s = 0.05
    await s.open()
    try:
        with connect(s.path) as other:
            other.execute("BEGIN IMMEDIATE")
            results = await asyncio.gather(
                *(s.append([Entry(n, f"w{n}", 1, b"x")], [row(f"w{n}")]) for n in range(1, 4)),
                return_exceptions=True,
            )
            other.execute("ROLLBACK")
        assert [type(r) for r in results] == [StoreError] * 3
        assert "another process holds the store" in str(results[0])
        assert await s.list() == []
        assert s.last_lsn == 0
        await s.append([Entry(1, "a", 1, b"x")], [row("a")])
        assert await s.load("a") == [(1, b"x")]
    finally:
        await s.close()


@pytest.mark.asyncio
async def test_run_numbers_handed_out_before_a_crash_are_not_reused(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "live", durability="none")
    await s.open()
    try:
        handed_out = [await s.next_run() for _ in range(3)]
        await s.append([Entry(1, "a", 1, b"x")])
        # The files as they are this moment, while the store is open: a crash.
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    finally:
        await s.close()

    after = SqliteStore(tmp_path / "crashed", durability="none")
    await after.open()
    try:
        assert await after.load("a") == [(1, b"x")]
        assert await after.next_run() > max(handed_out)
    finally:
        await after.close()


# -- readers elsewhere ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_reader_in_another_thread_sees_whole_batches_while_the_writer_appends(
    store: SqliteStore,
) -> None:
    batches, size = 40, 5
    await store.append([Entry(n, "a", 1, b"%d" % n) for n in range(1, size + 1)], [row("a")])
    reader = SqliteStore(store.path.parent, readonly=True)
    await reader.open()

    async def write() -> None:
        for b in range(1, batches):
            lsns = range(b * size + 1, (b + 1) * size + 1)
            await store.append([Entry(n, "a", 1, b"%d" % n) for n in lsns])

    async def read() -> list[int]:
        seen: list[int] = []
        while not seen or seen[-1] < batches * size:
            lsns = [n for n, _ in await reader.load("a")]
            # A prefix of the log, and never part of a batch.
            assert lsns == list(range(1, len(lsns) + 1))
            assert len(lsns) % size == 0
            seen.append(len(lsns))
        return seen

    try:
        _, seen = await asyncio.gather(write(), read())
    finally:
        await reader.close()
    assert seen == sorted(seen)


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from fusee.store.sqlite import SqliteStore

    async def main() -> None:
        store = SqliteStore(sys.argv[1], readonly=True)
        await store.open()
        try:
            print("ready", flush=True)
            for line in sys.stdin:
                after = int(line)
                records = await store.load("a", after_lsn=after)
                print(" ".join(str(lsn) for lsn, _ in records), flush=True)
        finally:
            await store.close()

    asyncio.run(main())
    """
)


@pytest.mark.asyncio
async def test_a_reader_in_another_process_follows_the_journal_while_the_engine_writes(
    store: SqliteStore,
) -> None:
    await store.append([Entry(1, "a", 1, b"start")], [row("a")])
    # The child imports fusee from where this process does.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        str(store.path.parent),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
        cwd=store.path.parent,
    )
    assert child.stdin is not None
    assert child.stdout is not None

    async def ask(after_lsn: int) -> list[int]:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(b"%d\n" % after_lsn)
        await child.stdin.drain()
        return [int(n) for n in (await child.stdout.readline()).split()]

    try:
        assert await child.stdout.readline() == b"ready\n"
        assert await ask(0) == [1]
        followed, lsn = [1], 1
        for _ in range(5):
            # `fusee show --follow`: ask for what came after the last record seen,
            # while the next batch is being written.
            writing = asyncio.ensure_future(
                store.append([Entry(n, "a", 1, b"x") for n in range(lsn + 1, lsn + 4)])
            )
            new = await ask(followed[-1])
            assert new in ([], [lsn + 1, lsn + 2, lsn + 3])
            await writing
            followed += new or await ask(followed[-1])
            lsn += 3
        assert followed == list(range(1, lsn + 1))
    finally:
        child.stdin.close()
        await child.wait()
    assert child.returncode == 0


# -- open_store ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_open_store_picks_the_store_its_target_names(tmp_path: Path) -> None:
    assert isinstance(open_store("memory"), MemoryStore)
    sqlite_store = open_store(tmp_path / "data", durability="none")
    assert isinstance(sqlite_store, SqliteStore)
    await sqlite_store.open()
    await sqlite_store.close()
    assert (tmp_path / "data" / FILENAME).is_file()
    assert isinstance(open_store(str(tmp_path / "data"), readonly=True), SqliteStore)


def test_open_store_refuses_urls_it_does_not_support() -> None:
    with pytest.raises(
        StoreError,
        match=r"^'redis' stores are not supported; pass a directory path .* or 'memory'$",
    ):
        open_store("redis://cache")


def test_open_store_refuses_a_readonly_memory_store() -> None:
    with pytest.raises(StoreError, match="keeps nothing to read"):
        open_store("memory", readonly=True)


async def test_only_one_writer_may_open_a_store_while_readers_may(tmp_path: Path) -> None:
    first = SqliteStore(tmp_path, durability="none")
    await first.open()
    try:
        second = SqliteStore(tmp_path, durability="none")
        with pytest.raises(StoreError, match="is open for writing in another process"):
            await second.open()
        reader = SqliteStore(tmp_path, readonly=True)
        await reader.open()
        await reader.close()
    finally:
        await first.close()
    # Closed: the next writer may open it.
    third = SqliteStore(tmp_path, durability="none")
    await third.open()
    await third.close()


@pytest.mark.asyncio
async def test_reads_asked_in_one_turn_share_one_trip_to_the_reader(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.append([Entry(1, "a", 1, b"1"), Entry(2, "b", 1, b"2")], [row("a"), row("b")])
    trips: list[object] = []
    real = store._run_read

    def counting(fn: Any) -> Any:
        trips.append(fn)
        return real(fn)

    monkeypatch.setattr(store, "_run_read", counting)
    got = await asyncio.gather(
        store.get("a"),
        store.get("nobody"),
        store.load("b"),
        store.load("nobody"),
        store.load("a"),
        return_exceptions=True,
    )
    assert list(got[:3]) == [row("a"), None, [(2, b"2")]]
    assert isinstance(got[3], NotFound)  # one read's error is its own
    assert got[4] == [(1, b"1")]
    assert len(trips) == 1


# -- a full disk ---------------------------------------------------------------------------


def fill_disk(store: SqliteStore) -> None:
    """The next append finds the disk full: SQLite may not grow the file (SQLITE_FULL)."""

    def full(conn: sqlite3.Connection) -> None:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 1}")

    store.before_next_append(full)


def free_space(store: SqliteStore) -> None:
    store.before_next_append(lambda conn: conn.execute("PRAGMA max_page_count = 1073741823"))


def big_batch(first: int, id: str) -> list[Entry]:
    return [Entry(n, id, 1, b"%d" % n * 500) for n in range(first, first + 40)]


@pytest.mark.asyncio
async def test_a_full_disk_fails_the_append_storing_nothing_and_the_same_store_then_appends(
    tmp_path: Path,
) -> None:
    s = SqliteStore(tmp_path, durability="fsync")
    await s.open()
    try:
        await s.append([Entry(1, "a", 1, b"a")], [row("a")])
        fill_disk(s)
        with pytest.raises(StoreError) as raised:
            await s.append(big_batch(2, "a"), [row("a", status="suspended")])
        assert str(raised.value) == (
            f"the disk holding {s.path} is full: nothing of this write was stored; free some "
            "space (the store takes writes again as soon as there is room)"
        )
        with pytest.raises(StoreError, match="is full"):  # still full
            await s.append(big_batch(2, "a"), [row("a", status="suspended")])
        assert await s.load("a") == [(1, b"a")]
        assert await s.get("a") == row("a")
        assert s.last_lsn == 1

        free_space(s)
        # The same batch again, on the same store object: no reopening.
        await s.append(big_batch(2, "a"), [row("a", status="suspended")])
        assert [lsn for lsn, _ in await s.load("a")] == list(range(1, 42))
        assert await s.get("a") == row("a", status="suspended")
        assert s.last_lsn == 41
    finally:
        await s.close()

    again = SqliteStore(tmp_path)
    await again.open()
    try:
        assert [lsn for lsn, _ in await again.load("a")] == list(range(1, 42))
    finally:
        await again.close()


@pytest.mark.asyncio
async def test_after_a_full_disk_appends_called_behind_it_fail_and_can_all_be_appended_again(
    store: SqliteStore,
) -> None:
    """What an engine's committer retries: every batch from the failed one on, in order."""
    await store.append([Entry(1, "a", 1, b"a")], [row("a")])
    fill_disk(store)
    batches = [big_batch(2, "a"), [Entry(42, "b", 1, b"b")], [Entry(43, "c", 1, b"c")]]
    results = await asyncio.gather(
        *(store.append(b, [row(b[0].id)]) for b in batches), return_exceptions=True
    )
    assert [type(r) for r in results] == [StoreError] * 3
    assert "is full" in str(results[0])
    assert "not written: an append called before this one failed" in str(results[1])
    assert store.last_lsn == 1
    assert [r.id for r in await store.list()] == ["a"]

    free_space(store)
    for b in batches:
        await store.append(b, [row(b[0].id)])
    assert store.last_lsn == 43
    assert [r.id for r in await store.list()] == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_a_write_transaction_a_failed_rollback_left_open_does_not_block_later_appends(
    store: SqliteStore,
) -> None:
    # A rollback that fails too (the disk still failing) leaves the writer's
    # connection inside the transaction: the next append must still begin.
    store.before_next_append(lambda conn: conn.execute("BEGIN"))
    await store.append([Entry(1, "a", 1, b"a")], [row("a")])
    assert await store.load("a") == [(1, b"a")]
