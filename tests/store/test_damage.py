"""Damaged stores fail clearly, and one damaged run affects only itself.

Each test makes its damage itself, on the file of a closed store: pages
overwritten with garbage, rows changed behind the store's back with the
sqlite3 module, files emptied, truncated or removed. What the store must do
is the same every time: refuse with a `StoreError` (`CorruptRecord` for one
run's row or journal) that names the file or the run and says what to do,
never a raw `sqlite3` error, and never a silently emptied store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from fusee.errors import CorruptRecord, StoreError
from fusee.store import Entry, MemoryStore, RunRow, SqliteStore, Store
from fusee.store.sqlite import FILENAME

# What each run's records hold: a marker that finds its pages in the file.
_PAYLOAD = b"journal of a: " + b"a" * 286


def row(id: str, run: int = 1, status: str = "running", started_ms: int = 0) -> RunRow:
    return RunRow(id, run, "checkout", status, started_ms)


@contextlib.contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection to the closed store's file, to damage it with."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


async def made_store(directory: Path) -> Path:
    """A closed store: run 'a' with 400 records over many pages, runs r1..r50 with one each."""
    s = SqliteStore(directory, durability="none")
    await s.open()
    await s.append([Entry(n, "a", 1, _PAYLOAD) for n in range(1, 401)], [row("a")])
    await s.append(
        [Entry(400 + n, f"r{n}", 1, b"r") for n in range(1, 51)],
        [row(f"r{n}", started_ms=n) for n in range(1, 51)],
    )
    await s.close()
    return directory / FILENAME


def overwrite_pages_holding(path: Path, marker: bytes, pages: int) -> None:
    """Overwrites with garbage ``pages`` of the file's pages that hold ``marker``."""
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[16:18], "big") or 65536  # the header's page size
    holding = [n for n in range(0, len(data), size) if marker in data[n : n + size]]
    assert len(holding) > pages  # the damage leaves some of them alone
    for n in holding[1 : 1 + pages]:
        data[n : n + size] = b"\xa5" * size
    path.write_bytes(bytes(data))


# -- no raw errors -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_damaged_page_fails_only_the_reads_that_meet_it_with_a_store_error(
    tmp_path: Path,
) -> None:
    path = await made_store(tmp_path)
    overwrite_pages_holding(path, _PAYLOAD, 2)

    s = SqliteStore(tmp_path, durability="none")
    await s.open()
    try:
        # One turn, so one batch: the damaged journal fails its own read only.
        damaged, other, got = await asyncio.gather(
            s.load("a"), s.load("r3"), s.get("a"), return_exceptions=True
        )
        assert isinstance(damaged, StoreError)
        assert str(damaged).startswith(f"{path} is damaged")
        assert "restore it from a backup" in str(damaged)
        assert other == [(403, b"r")]
        assert got == row("a")
        with pytest.raises(StoreError, match=rf"^{path} is damaged"):
            await s.load("a")  # alone too
        assert len(await s.list()) == 51
        await s.append([Entry(451, "b", 1, b"b")], [row("b")])
        assert await s.load("b") == [(451, b"b")]
    finally:
        await s.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "readonly", [pytest.param(False, id="writer"), pytest.param(True, id="readonly")]
)
async def test_a_damaged_page_of_the_run_rows_fails_listings_and_writes_with_a_store_error(
    tmp_path: Path, readonly: bool
) -> None:
    s = SqliteStore(tmp_path, durability="none")
    await s.open()
    note = "rows: " + "r" * 300
    await s.append(
        [Entry(n, f"r{n}", 1, b"r") for n in range(1, 101)],
        [
            RunRow(f"r{n}", 1, "checkout", "running", n, attributes={"note": note})
            for n in range(1, 101)
        ],
    )
    await s.close()
    path = tmp_path / FILENAME
    overwrite_pages_holding(path, note.encode(), 1)

    s = SqliteStore(tmp_path, durability="none", readonly=readonly)
    await s.open()
    try:
        got = await asyncio.gather(*(s.get(f"r{n}") for n in range(1, 101)), return_exceptions=True)
        assert {type(g) for g in got} == {RunRow, StoreError}
        for read in (s.list, s.unfinished):
            with pytest.raises(StoreError, match=rf"^{path} is damaged"):
                await read()
        if not readonly:
            rewrite = [row(f"r{n}") for n in range(1, 101)]
            with pytest.raises(StoreError, match=rf"^{path} is damaged"):
                await s.append([Entry(101, "r1", 1, b"x")], rewrite)
    finally:
        await s.close()


# -- one damaged row -----------------------------------------------------------------------

_DAMAGED_ROWS = [
    pytest.param("attributes = x'c1'", "its search attributes do not decode", id="attributes"),
    pytest.param("attributes = x'93010203'", "its search attributes do not decode", id="not-a-map"),
    pytest.param("attributes = 'text'", "its attributes is 'text'", id="attributes-text"),
    pytest.param("started_ms = 'soon'", "its started_ms is 'soon'", id="started-text"),
    pytest.param("status = 'exploded'", "its status 'exploded' is not one of", id="status"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("damage", "problem"), _DAMAGED_ROWS)
async def test_a_damaged_row_fails_its_own_get_with_corrupt_record_naming_the_run(
    tmp_path: Path, damage: str, problem: str
) -> None:
    path = await made_store(tmp_path)
    with connect(path) as conn:
        conn.execute(f"UPDATE runs SET {damage} WHERE id = 'r3'")

    s = SqliteStore(tmp_path, durability="none")
    await s.open()
    try:
        # One batch: the damaged row fails its own read only.
        damaged, other, journal = await asyncio.gather(
            s.get("r3"), s.get("r4"), s.load("r3"), return_exceptions=True
        )
        assert isinstance(damaged, CorruptRecord)
        text = str(damaged)
        assert text.startswith(f"the row of run 'r3' (run 1) in {path} is damaged: {problem}")
        assert text.endswith(f"restore {path} from a backup to read this one again")
        assert "fusee check" in text
        assert other == row("r4", started_ms=4)
        assert journal == [(403, b"r")]
    finally:
        await s.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(("damage", "problem"), _DAMAGED_ROWS)
async def test_listings_skip_a_damaged_row_and_log_a_warning_naming_it(
    tmp_path: Path, damage: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = await made_store(tmp_path)
    with connect(path) as conn:
        conn.execute(f"UPDATE runs SET {damage} WHERE id = 'r3'")

    s = SqliteStore(tmp_path, durability="none", readonly=True)
    await s.open()
    try:
        with caplog.at_level(logging.WARNING, logger="fusee"):
            listed = [r.id for r in await s.list()]
            unfinished = [r.id for r in await s.unfinished()]
            page = [r.id for r in await s.list(limit=4, after=(1, "r1"))]
    finally:
        await s.close()

    everyone = ["a", *(f"r{n}" for n in range(1, 51) if n != 3)]
    assert listed == everyone
    assert unfinished == everyone
    # The damaged row does not count against the limit.
    assert page == ["r2", "r4", "r5", "r6"]
    # One per listing that met the row (those ordered by start time may stop
    # before a damaged start time, and `unfinished` selects by status).
    warnings = [r for r in caplog.records if r.name == "fusee"]
    assert warnings
    for warning in warnings:
        assert warning.levelno == logging.WARNING
        assert "the row of run 'r3'" in warning.getMessage()
        assert problem in warning.getMessage()


# -- clear errors instead of obscure ones --------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("damage", "what"),
    [
        pytest.param(
            "DELETE FROM meta",
            "its meta table has no 'run_reserved' row (the count of run numbers handed out)",
            id="meta-row",
        ),
        pytest.param(
            "UPDATE meta SET value = 'many'",
            "its meta table has no 'run_reserved' row",
            id="meta-value",
        ),
        pytest.param("DROP TABLE meta", "its meta table is missing", id="meta-table"),
        pytest.param(
            "DROP TABLE journal; DROP TABLE runs",
            "its journal and runs tables are missing",
            id="tables",
        ),
    ],
)
@pytest.mark.parametrize(
    "readonly", [pytest.param(False, id="writer"), pytest.param(True, id="readonly")]
)
async def test_a_store_missing_part_of_its_schema_is_refused_saying_what_is_missing(
    tmp_path: Path, damage: str, what: str, readonly: bool
) -> None:
    path = await made_store(tmp_path)
    with connect(path) as conn:
        conn.executescript(damage)

    s = SqliteStore(tmp_path, durability="none", readonly=readonly)
    with pytest.raises(StoreError) as raised:
        await s.open()
    text = str(raised.value)
    assert text.startswith(f"{path} is damaged: {what}")
    assert text.endswith(
        f"restore it (with any {FILENAME}-wal beside it) from a backup, or move them aside "
        "to start an empty store there"
    )
    await s.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "kind", [pytest.param("memory", id="memory"), pytest.param("sqlite", id="sqlite")]
)
async def test_loading_a_run_that_has_a_row_but_no_records_raises_corrupt_record_naming_it(
    tmp_path: Path, kind: str
) -> None:
    # The engine indexes a run's journal (its start, its end): a run is its
    # records, and a row alone is a run whose journal is lost.
    s: Store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path, durability="none")
    await s.open()
    try:
        await s.append([Entry(1, "b", 1, b"b")], [row("a"), row("b")])
        for load in (s.load("a"), s.load("a", 1), s.load("a", after_lsn=1)):
            with pytest.raises(
                CorruptRecord, match=r"^run 'a' \(run 1\) has a row in .* but no journal records"
            ):
                await load
        assert await s.load("b", after_lsn=1) == []  # nothing new is an answer
    finally:
        await s.close()


@pytest.mark.asyncio
async def test_a_run_whose_journal_was_deleted_raises_corrupt_record_and_others_load(
    tmp_path: Path,
) -> None:
    path = await made_store(tmp_path)
    with connect(path) as conn:
        conn.execute("DELETE FROM journal WHERE id = 'r3'")

    s = SqliteStore(tmp_path, durability="none")
    await s.open()
    try:
        lost, other = await asyncio.gather(s.load("r3"), s.load("r4"), return_exceptions=True)
        assert isinstance(lost, CorruptRecord)
        assert str(lost) == (
            f"run 'r3' (run 1) has a row in {path} but no journal records: its journal is lost "
            "or damaged; the other runs are not affected (`fusee check` lists every damaged "
            f"run): restore {path} from a backup to read this one again"
        )
        assert other == [(404, b"r")]
    finally:
        await s.close()


@pytest.mark.asyncio
async def test_a_record_that_is_not_bytes_raises_corrupt_record_naming_the_run_and_lsn(
    tmp_path: Path,
) -> None:
    path = await made_store(tmp_path)
    with connect(path) as conn:
        conn.execute("UPDATE journal SET data = 'text' WHERE lsn = 3")

    s = SqliteStore(tmp_path, durability="none")
    await s.open()
    try:
        with pytest.raises(
            CorruptRecord,
            match=r"^the journal of run 'a' \(run 1\) in .* damaged record at LSN 3: it holds str",
        ):
            await s.load("a")
        assert await s.load("a", after_lsn=3) == [(n, _PAYLOAD) for n in range(4, 401)]
    finally:
        await s.close()


@pytest.mark.asyncio
async def test_a_row_with_an_unknown_status_raises_corrupt_record_naming_the_run_and_status(
    tmp_path: Path,
) -> None:
    # Read as one of the known statuses, such a run would never be seen to end.
    path = await made_store(tmp_path)
    with connect(path) as conn:
        conn.execute("UPDATE runs SET status = 'exploded' WHERE id = 'a'")

    s = SqliteStore(tmp_path, durability="none")
    await s.open()
    try:
        with pytest.raises(
            CorruptRecord,
            match=r"^the row of run 'a' \(run 1\) .* its status 'exploded' is not one of cancelled",
        ):
            await s.get("a")
        assert "a" not in [r.id for r in await s.unfinished()]
    finally:
        await s.close()


# -- no silent reset -----------------------------------------------------------------------


async def crashed_store(tmp_path: Path) -> Path:
    """The files of a store copied while it is open, as a crash leaves them: with a WAL."""
    await made_store(tmp_path / "live")
    s = SqliteStore(tmp_path / "live", durability="none")
    await s.open()
    try:
        await s.append([Entry(451, "late", 1, b"late")], [row("late")])
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    finally:
        await s.close()
    wal = tmp_path / "crashed" / f"{FILENAME}-wal"
    assert wal.stat().st_size > 0
    return tmp_path / "crashed" / FILENAME


def sizes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir()}


_READERS = [pytest.param(False, id="writer"), pytest.param(True, id="readonly")]


@pytest.mark.asyncio
@pytest.mark.parametrize("readonly", _READERS)
@pytest.mark.parametrize(
    "crashed", [pytest.param(False, id="closed"), pytest.param(True, id="wal")]
)
async def test_an_emptied_database_is_refused_naming_it_and_left_as_it_was(
    tmp_path: Path, readonly: bool, crashed: bool
) -> None:
    path = await crashed_store(tmp_path) if crashed else await made_store(tmp_path)
    path.write_bytes(b"")
    before = sizes(path.parent)

    s = SqliteStore(path.parent, durability="none", readonly=readonly)
    with pytest.raises(StoreError) as raised:
        await s.open()
    beside = r", beside a write-ahead log of [\d,]+ bytes" if crashed else ""
    assert re.fullmatch(
        rf"{re.escape(str(path))} is damaged: it is empty \(0 bytes\){beside}; restore it "
        rf"\(with any {FILENAME}-wal beside it\) from a backup, or move them aside to start "
        "an empty store there",
        str(raised.value),
    )
    # SQLite would have taken it for a new database and deleted the WAL.
    assert sizes(path.parent) == before


@pytest.mark.asyncio
@pytest.mark.parametrize("readonly", _READERS)
async def test_a_database_truncated_beside_its_wal_is_refused_and_left_as_it_was(
    tmp_path: Path, readonly: bool
) -> None:
    path = await crashed_store(tmp_path)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    before = sizes(path.parent)

    s = SqliteStore(path.parent, durability="none", readonly=readonly)
    with pytest.raises(StoreError) as raised:
        await s.open()
    assert str(raised.value).startswith(
        f"{path} is damaged: it is shorter than its header says, and pages are lost (Page "
    )
    assert "move them aside to start an empty store there" in str(raised.value)
    # A writable connection's close would have folded the WAL into it.
    assert sizes(path.parent) == before


@pytest.mark.asyncio
@pytest.mark.parametrize("readonly", _READERS)
async def test_a_wal_without_its_database_is_refused_and_no_new_store_is_made(
    tmp_path: Path, readonly: bool
) -> None:
    path = await crashed_store(tmp_path)
    path.unlink()

    s = SqliteStore(path.parent, durability="none", readonly=readonly)
    with pytest.raises(StoreError) as raised:
        await s.open()
    assert re.fullmatch(
        rf"{re.escape(str(path))} is damaged: the database file is missing, but its "
        rf"write-ahead log {FILENAME}-wal is there \([\d,]+ bytes of recent writes\); restore "
        "it .* or move them aside to start an empty store there",
        str(raised.value),
    )
    assert not path.exists()


@pytest.mark.asyncio
async def test_a_database_whose_first_page_is_garbage_is_refused_as_not_a_database(
    tmp_path: Path,
) -> None:
    path = await made_store(tmp_path)
    data = path.read_bytes()
    path.write_bytes(b"\xa5" * 4096 + data[4096:])

    with pytest.raises(StoreError) as raised:
        await SqliteStore(tmp_path, durability="none").open()
    assert str(raised.value) == (
        f"{path} is not an SQLite database (it does not start with SQLite's header): if it "
        "was a fusee store it is damaged; restore it from a backup, or move it aside to "
        "start an empty store there"
    )
    assert path.read_bytes()[4096:] == data[4096:]


@pytest.mark.asyncio
async def test_a_store_moved_aside_leaves_room_for_a_new_empty_one(tmp_path: Path) -> None:
    path = await crashed_store(tmp_path)
    path.write_bytes(b"")
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in (FILENAME, f"{FILENAME}-wal", f"{FILENAME}-shm"):
        (path.parent / name).rename(aside / name)

    s = SqliteStore(path.parent, durability="none")
    await s.open()
    try:
        assert await s.list() == []
    finally:
        await s.close()


@pytest.mark.asyncio
async def test_a_new_store_appears_whole_and_a_crash_copy_of_it_opens(tmp_path: Path) -> None:
    live = tmp_path / "live"
    s = SqliteStore(live, durability="none")
    await s.open()
    try:
        # Made whole under a temporary name: nothing of it is left beside the store.
        assert sorted(sizes(live)) == [FILENAME, f"{FILENAME}-shm", f"{FILENAME}-wal"]
        assert (live / FILENAME).stat().st_size > 0
        await s.append([Entry(1, "a", 1, b"a")], [row("a")])
        shutil.copytree(live, tmp_path / "crashed")
    finally:
        await s.close()

    again = SqliteStore(tmp_path / "crashed", durability="none")
    await again.open()
    try:
        assert await again.load("a") == [(1, b"a")]
    finally:
        await again.close()
