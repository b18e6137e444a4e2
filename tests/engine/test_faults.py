"""Bad input and faults: each is a clear `fusee.errors` error, and nothing recorded is lost.

Every test runs on the memory store and on SQLite, except those about the
SQLite file itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import io
import logging
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import _postgres
import pytest

import fusee
from fusee.cli import main
from fusee.store import MemoryStore, SqliteStore, Store
from fusee.store import sqlite as sqlite_store
from fusee.store.postgres import PostgresStore
from fusee.testing import TestEngine

from .conftest import Host, assert_steps_ran_once, eventually

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)


@dataclasses.dataclass(frozen=True)
class Order:
    id: str
    amount: int


@fusee.workflow("checkout")
async def checkout(ctx: fusee.Ctx, order: Order) -> int:
    got = await ctx.wait_for(go)
    return await ctx.step("charge", lambda: order.amount + (got or 0))


@fusee.workflow("other")
async def other(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("plus", lambda: n + 1)


async def _ids(store: Store) -> list[str]:
    return [row.id for row in await store.list()]


# --- bad input ------------------------------------------------------------------------------------


async def test_an_unknown_workflow_name_is_refused_naming_the_fix(host: Host) -> None:
    async with host(workflows=[checkout, other]) as t:
        with pytest.raises(fusee.UnknownWorkflow) as e:
            await t.start("checkuot", "c-1", Order("o", 1))
        assert "workflow 'checkuot' is not registered" in str(e.value)
        assert "checkout, other" in str(e.value)
        assert "Engine.open(..., workflows=[...])" in str(e.value)
        assert await _ids(t.engine.store) == []
        assert t.engine.store.last_lsn == 0
        await t.crash()
        assert await _ids(t.engine.store) == []


async def test_a_taken_id_is_refused_and_the_run_there_is_untouched(host: Host) -> None:
    async with host(workflows=[checkout]) as t:
        run = await t.start(checkout, "c-1", Order("o", 1))
        await t.settle()
        before = await t.engine.store.load("c-1")
        with pytest.raises(fusee.AlreadyExists, match="run 'c-1' exists"):
            await t.start(checkout, "c-1", Order("o", 2))
        await t.settle()
        assert await t.engine.store.load("c-1") == before
        await run.signal(go, 10)
        assert await run.result() == 11


async def test_an_input_that_does_not_decode_to_its_type_is_refused_by_start(
    host: Host,
) -> None:
    # Values are checked where they enter: nothing is recorded.
    async with host(workflows=[checkout]) as t:
        bad: Any = {"id": "o", "amount": "not a number"}
        with pytest.raises(fusee.PayloadError, match="amount"):
            await t.start(checkout, "c-1", bad)
        assert await _ids(t.engine.store) == []
        await t.crash()
        assert await _ids(t.engine.store) == []


async def test_an_input_that_cannot_be_encoded_is_refused_by_start(host: Host) -> None:
    async with host(workflows=[checkout]) as t:
        with pytest.raises(fusee.PayloadError, match="the input of run 'c-1'"):
            await t.start(checkout, "c-1", object())  # type: ignore[misc]
        assert await _ids(t.engine.store) == []


async def test_a_signal_payload_of_the_wrong_type_is_refused_by_run_signal(
    host: Host,
) -> None:
    @fusee.workflow("strict")
    async def strict(ctx: fusee.Ctx) -> int | None:
        return await ctx.wait_for(go, timeout="1h")

    async with host(workflows=[strict]) as t:
        run = await t.start(strict, "s-1")
        await t.settle()
        before = await t.engine.store.load("s-1")
        with pytest.raises(fusee.PayloadError, match="signal 'go'"):
            await run.signal(go, "not an int")  # type: ignore[misc]
        await t.settle()
        assert await t.engine.store.load("s-1") == before
        await t.crash()
        assert await run.result() is None


async def test_a_signal_to_a_finished_run_is_refused_and_not_recorded(host: Host) -> None:
    async with host(workflows=[other]) as t:
        run = await t.start(other, "o-1", 1)
        assert await run.result() == 2
        before = await t.engine.store.load("o-1")
        with pytest.raises(fusee.FuseeError, match="has finished"):
            await run.signal(go, 1)
        await t.settle()
        assert await t.engine.store.load("o-1") == before


@pytest.mark.expect_engine_errors("UnknownWorkflow: workflow 'checkout' is not registered")
async def test_a_run_of_a_workflow_this_engine_lacks_raises_unknown_workflow(host: Host) -> None:
    # One version throughout: what is missing here is the workflow, not its version.
    async with host(workflows=[checkout, other], version="v1") as t:
        await t.start(checkout, "c-1", Order("o", 1))
        await t.settle()
        store = t.store
    async with host(workflows=[other], store=store, version="v1") as t2:
        with pytest.raises(fusee.UnknownWorkflow, match="'checkout' is not registered"):
            await t2.get("c-1").result()
        with pytest.raises(fusee.UnknownWorkflow):
            await t2.get("c-1").signal(go, 1)
        assert await t2.execute(other, "o-1", 1) == 2  # the rest works
    async with host(workflows=[checkout], store=store, version="v1") as t3:
        await t3.get("c-1").signal(go, 1)
        assert await t3.get("c-1").result() == 2


# --- the store ------------------------------------------------------------------------------------


def _fail_next_write(store: Store) -> None:
    if isinstance(store, MemoryStore):
        store.fail_next_append(fusee.StoreError("injected: disk full"))
    elif isinstance(store, PostgresStore):
        _postgres.fail_next_append(store)
    else:
        assert isinstance(store, SqliteStore)
        store.fail_next_append(sqlite3.OperationalError("injected: disk I/O error"))


def _journal_is_whole(lsns: list[int]) -> None:
    assert lsns == sorted(set(lsns)), f"a record was written twice: {lsns}"


async def test_a_failed_write_is_retried_and_the_same_engine_carries_on(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    async with host(workflows=[checkout]) as t:
        runs = [await t.start(checkout, f"c-{i}", Order(str(i), i)) for i in range(3)]
        await runs[0].signal(go, 100)  # acknowledged: durable
        assert await runs[0].result() == 100
        await t.settle()
        _fail_next_write(t.engine.store)
        with caplog.at_level(logging.WARNING, logger="fusee"):
            signal = asyncio.ensure_future(runs[1].signal(go, 100))
            await t.settle()
            # Not acknowledged while its write waits for the retry.
            assert not signal.done()
            assert t.engine.committer.retrying
            # Nothing new is written behind the failed write: it waits too.
            later = asyncio.ensure_future(runs[2].signal(go, 1000))
            await t.settle()
            assert not later.done()
            await t.advance("1s")
            await signal
            await later
            assert await runs[1].result() == 101
            assert await runs[2].result() == 1002
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("the store failed to write" in m for m in warnings) == 1, warnings
        assert sum("the failed writes are stored" in m for m in warnings) == 1, warnings
        # The same engine takes new work.
        new = await t.start(checkout, "c-new", Order("n", 1))
        await new.signal(go, 1)
        assert await new.result() == 2
        _journal_is_whole([lsn for lsn, _ in await t.engine.store.load("c-1")])
        await t.crash()
        assert await runs[1].result() == 101
        assert await runs[2].result() == 1002
        assert_steps_ran_once(t)


def _fill_disk(store: SqliteStore) -> None:
    """SQLite may not grow its file from the next append on (SQLITE_FULL), until freed."""

    def full(conn: sqlite3.Connection) -> None:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 1}")

    store.before_next_append(full)


def _free_space(store: SqliteStore) -> None:
    store.before_next_append(lambda conn: conn.execute("PRAGMA max_page_count = 1073741823"))


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx, n: int) -> int:
    for i in range(n):
        await ctx.sleep(f"nap-{i}", "10s")
    return await ctx.step("last", lambda: n)


async def test_a_full_disk_holds_writes_until_space_is_freed_then_the_engine_carries_on(
    tmp_path: Path, fusee_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteStore(tmp_path, durability="none")
    async with fusee_engine(workflows=[checkout, napper], store=store) as t:
        first = await t.start(checkout, "c-1", Order("a", 1))
        naps = await t.start(napper, "n-1", 3)
        await t.settle()
        _fill_disk(t.engine.store)
        with caplog.at_level(logging.WARNING, logger="fusee"):
            # An input the full disk cannot take.
            big = asyncio.ensure_future(t.start(checkout, "c-big", Order("x" * 200_000, 1)))
            # Timers fire meanwhile and retries fail for minutes: one warning,
            # no traceback from a timer (the suite fails on one). The caller
            # hears of it within the write timeout.
            await t.advance("5m")
            with pytest.raises(fusee.StoreError, match=r"is full.*Nothing acknowledged is lost"):
                await big
            assert t.engine.committer.retrying
            signal = asyncio.ensure_future(first.signal(go, 7))
            await t.advance("1m")
            with pytest.raises(fusee.StoreError, match="is full"):
                await signal
            _free_space(t.engine.store)
            await t.advance("1m")
            # The writes that waited are stored: the engine resumed by itself.
            assert (await first.describe()).status == "completed"
            await t.get("c-big").signal(go, 0)
            assert await first.result() == 8
            assert await naps.result() == 3
            assert await t.get("c-big").result() == 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("the store failed to write" in m for m in warnings) == 1, warnings
        assert sum("the failed writes are stored" in m for m in warnings) == 1, warnings
        for id in ("c-1", "n-1", "c-big"):
            _journal_is_whole([lsn for lsn, _ in await t.engine.store.load(id)])
        await t.crash()
        assert await t.get("c-1").result() == 8
        assert await t.get("n-1").result() == 3
        assert await t.get("c-big").result() == 1
        assert_steps_ran_once(t)


class DiskFull:
    """Fails every append of ``store`` as a full disk does (ENOSPC), until `free`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.real = store.append
        store.append = self.append  # type: ignore[method-assign]

    async def append(self, *args: Any, **kw: Any) -> None:
        raise fusee.StoreError(
            f"the disk holding the store is full ({os.strerror(errno.ENOSPC)}): nothing of "
            "this write was stored; free some space"
        )

    def free(self) -> None:
        self.store.append = self.real  # type: ignore[method-assign]


async def _waiting_for_writes(t: TestEngine, calls: int) -> None:
    """Until ``calls`` callers wait for their writes (a call reads the store first, for real)."""

    await eventually(lambda: t.engine.committer.callers_waiting >= calls)


async def test_on_a_full_disk_calls_raise_store_error_within_write_timeout_and_reads_do_not_wait(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    async with host(workflows=[checkout]) as t:
        parked = await t.start(checkout, "parked", Order("p", 1))
        idle = await t.start(checkout, "idle", Order("i", 1))
        first = await t.start(checkout, "c-1", Order("a", 1))
        await t.advance("1m")  # they park
        await first.signal(go, 0)
        assert await first.result() == 1
        full = DiskFull(t.engine.store)
        with caplog.at_level(logging.WARNING, logger="fusee"):
            starts = [
                asyncio.ensure_future(t.start(checkout, f"s-{i}", Order(str(i), i)))
                for i in range(40)
            ]
            signal = asyncio.ensure_future(parked.signal(go, 10))
            await _waiting_for_writes(t, 41)
            await t.advance("4s")
            assert not any(s.done() for s in starts)
            assert not signal.done()
            assert t.engine.committer.retrying
            # Reads answer from what is stored, waiting for no write.
            assert (await idle.describe()).status == "suspended"
            assert sorted([i.id async for i in t.engine.list()]) == ["c-1", "idle", "parked"]
            await t.advance("1s")  # the default write_timeout
            for call in [*starts, signal]:
                with pytest.raises(fusee.StoreError) as e:
                    await call
                assert "the disk holding the store is full" in str(e.value)
                assert "waited 5s for its write" in str(e.value)
                assert "Nothing acknowledged is lost" in str(e.value)
            # Still full: a new call answers within the bound too.
            late = asyncio.ensure_future(t.start(checkout, "late", Order("l", 1)))
            await _waiting_for_writes(t, 1)
            await t.advance("5s")
            with pytest.raises(fusee.StoreError, match="Nothing acknowledged is lost"):
                await late
            full.free()
            await t.advance("1m")  # the retry stores what waited, in order
            await eventually(lambda: not t.engine.committer.retrying)
            # What waited was stored after all: it was queued, never dropped.
            assert await parked.result() == 11
            assert (await t.get("s-39").describe()).status == "suspended"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("the store failed to write" in m for m in warnings) == 1, warnings
        await t.crash()
        assert await parked.result() == 11
        assert await first.result() == 1
        assert len([i async for i in t.engine.list()]) == 44
        assert_steps_ran_once(t)


async def test_after_reopening_on_a_full_disk_a_start_raises_store_error_and_acknowledged_runs_stay(
    host: Host,
) -> None:
    async with host(workflows=[checkout]) as t:
        run = await t.start(checkout, "c-1", Order("a", 1))
        await t.settle()
        full = DiskFull(t.engine.store)
        pending = asyncio.ensure_future(run.signal(go, 5))
        await t.settle()
        await t.crash()  # the unacknowledged signal goes with the process
        if t.engine.store is not full.store:  # SQLite: a new store object on the same file
            full = DiskFull(t.engine.store)
        assert not pending.done() or pending.cancelled() or pending.exception() is not None
        start = asyncio.ensure_future(t.start(checkout, "c-2", Order("b", 2)))
        await _waiting_for_writes(t, 1)
        await t.advance("5s")
        with pytest.raises(fusee.StoreError, match=r"full.*Nothing acknowledged is lost"):
            await start
        assert (await run.describe()).status == "suspended"
        full.free()
        await t.advance("1m")
        await run.signal(go, 5)
        assert await run.result() == 6
        assert (await t.get("c-2").describe()).status == "suspended"
        await t.crash()
        assert await run.result() == 6
        assert_steps_ran_once(t)


@pytest.mark.expect_engine_errors("the store failed; runs stop")
async def test_a_stale_lease_is_not_retried_and_timers_meanwhile_print_no_traceback(
    fusee_engine: Any,
) -> None:
    store = MemoryStore()
    async with fusee_engine(workflows=[checkout, napper], store=store) as t:
        run = await t.start(checkout, "c-1", Order("a", 1))
        await t.start(napper, "n-1", 3)
        await t.settle()
        store.fail_next_append(fusee.StaleLease([0]))
        with pytest.raises(fusee.StaleLease):
            await run.signal(go, 1)
        assert not t.engine.committer.retrying
        # The naps' timers come due on a failed store: nothing to write, and
        # no "Exception in callback" (the suite fails on one).
        await t.advance("1m")
        await t.crash()
        await run.signal(go, 1)
        assert await run.result() == 2
        assert await t.get("n-1").result() == 3


async def _flip_a_byte(store: Store, lsn: int) -> None:
    """Damages one journal record as a bad disk would (the store is closed)."""
    if isinstance(store, PostgresStore):
        await _postgres.flip_a_byte(store, lsn)
        return
    if isinstance(store, MemoryStore):
        for journal in store._journals.values():
            for i, (at, data) in enumerate(journal):
                if at == lsn:
                    journal[i] = (at, data[:-1] + bytes([data[-1] ^ 0x40]))
        return
    assert isinstance(store, SqliteStore)
    conn = sqlite3.connect(store.path)
    try:
        (data,) = conn.execute("SELECT data FROM journal WHERE lsn = ?", (lsn,)).fetchone()
        damaged = data[:-1] + bytes([data[-1] ^ 0x40])
        conn.execute("UPDATE journal SET data = ? WHERE lsn = ?", (damaged, lsn))
        conn.commit()
    finally:
        conn.close()


@pytest.mark.expect_engine_errors("CorruptRecord: the journal of run 'bad'")
@pytest.mark.parametrize("finished", [False, True], ids=["unfinished", "finished"])
async def test_a_damaged_record_is_reported_naming_its_run_and_other_runs_work(
    host: Host, finished: bool
) -> None:
    async with host(workflows=[checkout]) as t:
        bad = await t.start(checkout, "bad", Order("b", 1))
        await t.start(checkout, "good", Order("g", 2))
        if finished:
            await bad.signal(go, 0)
            assert await bad.result() == 1
        await t.settle()
        store = t.store
        entries = await store.load("bad")
        # The last record: the wait of an unfinished run, the end of a finished one.
        target = entries[-1][0]
    await _flip_a_byte(store, target)
    async with host(workflows=[checkout], store=store) as t2:
        with pytest.raises(fusee.CorruptRecord) as e:
            await t2.get("bad").result()
        assert "run 'bad'" in str(e.value)
        assert f"LSN {target}" in str(e.value)
        assert "restore the store from a backup" in str(e.value)
        assert isinstance(e.value, fusee.StoreError)
        # The other runs do not care.
        await t2.get("good").signal(go, 10)
        assert await t2.get("good").result() == 12
        new = await t2.start(checkout, "new", Order("n", 3))
        await new.signal(go, 0)
        assert await new.result() == 3


# --- the SQLite file ------------------------------------------------------------------------------


async def test_a_store_from_a_newer_format_is_refused_at_open(tmp_path: Path) -> None:
    async with await fusee.Engine.open(tmp_path, workflows=[other], durability="none") as engine:
        assert await engine.execute(other, "o-1", 1) == 2
    conn = sqlite3.connect(tmp_path / "fusee.db")
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.FORMAT
        conn.execute("PRAGMA user_version = 99")
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(fusee.StoreError, match="format 99, newer than this fusee") as e:
        await fusee.Engine.open(tmp_path, workflows=[other], durability="none")
    assert "upgrade fusee" in str(e.value)


async def test_a_database_that_is_not_a_fusee_store_is_refused_at_open(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "fusee.db")
    try:
        conn.execute("CREATE TABLE orders (id TEXT)")
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(fusee.StoreError, match="not a fusee store"):
        await fusee.Engine.open(tmp_path, workflows=[other], durability="none")


# --- a damaged write-ahead log --------------------------------------------------------------------


async def acli(*argv: str) -> tuple[int, str]:
    """The ``fusee`` command, from a thread (it runs its own event loop): exit code, output."""
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(main, list(argv), stdout=out, stderr=err)
    return code, out.getvalue() + err.getvalue()


async def _crash_copy(tmp_path: Path, runs: int) -> Path:
    """A store with ``runs`` acknowledged runs, copied while its engine is open (a crash's files).

    The copy keeps the write-ahead log (no checkpoint ran) and the
    high-water mark, as a killed process leaves them.
    """
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    async with await fusee.Engine.open(live, workflows=[checkout], watchdog=None) as engine:
        for i in range(runs):
            run = await engine.start(checkout, f"c-{i}", Order(str(i), i))
            if i % 2:
                await run.signal(go, 1)
                assert await run.result() == i + 1
        shutil.copytree(live, crashed)
    assert (crashed / "fusee.db-wal").stat().st_size > 0
    return crashed


def _truncate_wal(directory: Path) -> None:
    wal = directory / "fusee.db-wal"
    with wal.open("r+b") as f:
        f.truncate(wal.stat().st_size * 2 // 3)


def _corrupt_wal_tail(directory: Path) -> None:
    wal = directory / "fusee.db-wal"
    data = bytearray(wal.read_bytes())
    for n in range(len(data) - 3000, len(data), 7):
        data[n] ^= 0x5A
    wal.write_bytes(bytes(data))


def _delete_wal(directory: Path) -> None:
    (directory / "fusee.db-wal").unlink()
    (directory / "fusee.db-shm").unlink(missing_ok=True)


DAMAGES = [
    pytest.param(_truncate_wal, id="truncated"),
    pytest.param(_corrupt_wal_tail, id="corrupted"),
    pytest.param(_delete_wal, id="deleted"),
]


@pytest.mark.parametrize("damage", DAMAGES)
async def test_a_damaged_wal_that_lost_acknowledged_runs_is_refused_at_open_saying_what_was_lost(
    tmp_path: Path, damage: Any
) -> None:
    crashed = await _crash_copy(tmp_path, 30)
    damage(crashed)
    with pytest.raises(fusee.StoreError) as e:
        await fusee.Engine.open(crashed, workflows=[checkout], watchdog=None)
    message = str(e.value)
    assert "is behind its high-water mark" in message
    assert "acknowledged record(s) are lost" in message
    assert "Restore the store from a backup" in message
    assert "accept_loss=True" in message
    # Refused as it was: the check sees the same, and says so.
    code, out = await acli("check", "--data", str(crashed))
    assert code == 1
    assert "the store is behind its high-water mark" in out


@pytest.mark.parametrize("damage", DAMAGES)
async def test_a_damaged_wal_opens_accepting_the_loss_which_is_logged_and_recorded(
    tmp_path: Path, damage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    crashed = await _crash_copy(tmp_path, 30)
    damage(crashed)
    with caplog.at_level(logging.WARNING, logger="fusee"):
        engine = await fusee.Engine.open(
            crashed, workflows=[checkout, other], watchdog=None, accept_loss=True
        )
    async with engine:
        assert any("opened accepting the loss" in r.getMessage() for r in caplog.records)
        # The store works on from what it holds.
        assert await engine.execute(other, "after", 1) == 2
    conn = sqlite3.connect(crashed / "fusee.db")
    try:
        recorded = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'loss%'"))
    finally:
        conn.close()
    assert recorded["loss_accepted_held_lsn"] < recorded["loss_accepted_marked_lsn"]
    # Accepted once: the next open finds the store level with its mark.
    async with await fusee.Engine.open(
        crashed, workflows=[checkout, other], watchdog=None
    ) as engine:
        assert await engine.get("after").result() == 2


async def test_a_crash_copy_with_its_whole_wal_opens_with_every_acknowledged_run(
    tmp_path: Path,
) -> None:
    crashed = await _crash_copy(tmp_path, 30)
    async with await fusee.Engine.open(crashed, workflows=[checkout], watchdog=None) as engine:
        assert len([i async for i in engine.list()]) == 30
        assert await engine.get("c-29").result() == 30
    code, _ = await acli("check", "--data", str(crashed))
    assert code == 0
