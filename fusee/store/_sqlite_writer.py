"""The writer thread of an SQLite store: it commits the queued writes, many to a transaction.

`SqliteStore` inherits it (`_SqliteWriter`); the loop's side queues a
`_Write` per caller and the thread answers them all after one commit (group
commit: one fsync for the appends queued meanwhile). The writer's lock on the
file (`_lock_writer`) keeps a second engine from writing the store.

The rule: one thread at a time writes the database, holding `_conn_lock`:
this thread, which hands every result back through the event loop
(`_post`), or the loop itself for an append that finds the writer idle
(`_write_here`). The loop's counters (`_failures_reported`, `_inflight`,
`_pending`) are touched on the loop only, `_failures_met` under the lock.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fusee.errors import StoreError
from fusee.store._base import Entry, RunRow
from fusee.store._lock import try_lock, unlock
from fusee.store._sqlite_mark import Mark, start_mark
from fusee.store._sqlite_open import (
    _bind_plainly,
    _check_format,
    _close,
    _counters,
    _fails_every_write,
    _roll_back,
    _store_error,
)
from fusee.store._sqlite_rows import _insert_all, _SqlRow
from fusee.store._sqlite_schema import _INSERT_ENTRIES, _SET_RESERVED, _UPSERT_ROWS

# Tries to take the writer's lock, and the pause between them (`_lock_writer`).
_LOCK_TRIES: Final = 5
_LOCK_PAUSE_S: Final = 0.01


@dataclass(slots=True)
class _Write:
    """One caller's write, queued for the writer thread."""

    entries: tuple[Entry, ...]
    rows: builtins.list[_SqlRow]
    run_reserved: int | None
    fail: Exception | None  # test hook: raised inside the transaction
    setup: Callable[[sqlite3.Connection], object] | None  # test hook: run before it
    sql: tuple[tuple[str, tuple[Any, ...]], ...]  # inbox statements, run after the rows
    max_lsn: int  # 0 when there are no entries
    # The failures the caller had seen reported when it called (see `_write`).
    epoch: int
    # Resolves with None or the StoreError; never cancelled, so reads can
    # wait on it as a barrier.
    done: asyncio.Future[StoreError | None]
    # The same answer for the caller to await: cancelling the caller cancels
    # this one only (a shield would cost the caller a loop iteration more).
    answer: asyncio.Future[StoreError | None]
    # Functions run inside the transaction, after the statements (queue
    # admission: it reads and writes in one transaction).
    calls: tuple[Callable[[sqlite3.Connection], object], ...] = ()


class _SqliteWriter:
    """The writer thread's side of `SqliteStore`, and the loop's handling of its answers.

    The attributes below are `SqliteStore`'s (set in its ``__init__``).
    """

    _path: Path
    _durability: str
    _busy_timeout_s: float
    _loop: asyncio.AbstractEventLoop | None
    _queue: queue.SimpleQueue[_Write | None]
    _last_lsn: int
    _accepted_lsn: int
    _inflight: int
    _failures_reported: int
    _failures_met: int
    _last_failure: StoreError | None
    _pending: dict[str, tuple[RunRow, asyncio.Future[StoreError | None]]]
    _transactions: int
    _synchronous: int | None
    _lock_file: Any
    _conn: sqlite3.Connection | None
    _conn_lock: threading.Lock
    _conn_waits: bool  # `_conn`'s busy timeout is the store's (see `_wait_for_locks`)
    _mark: Mark | None
    _loss: tuple[int, int] | None

    # -- the loop's side of an answer --------------------------------------------------

    def _finish(
        self, writes: builtins.list[_Write], errors: builtins.list[StoreError | None], failed: int
    ) -> None:
        self._failures_reported += failed
        for write, error in zip(writes, errors, strict=True):
            self._inflight -= 1
            if error is None and write.max_lsn > self._last_lsn:
                self._last_lsn = write.max_lsn
            write.done.set_result(error)
            if not write.answer.done():  # its caller was cancelled
                write.answer.set_result(error)
            pending = self._pending
            for sql_row in write.rows:
                latest = pending.get(sql_row[0])
                if latest is not None and latest[1] is write.done:
                    del pending[sql_row[0]]
        if self._inflight == 0:
            # LSNs of failed appends were never stored: they may be used again.
            self._accepted_lsn = self._last_lsn

    # -- the writer's lock on the store ------------------------------------------------

    def _lock_writer(self) -> None:
        # One writer per store: two engines writing one journal would run
        # the same steps twice and collide on LSNs. A lock on the database
        # file itself (`_lock`: an flock on POSIX, which Linux keeps apart
        # from the POSIX locks SQLite takes; a byte past any page on
        # Windows), so the store stays one file, and the OS drops the lock
        # when the process dies, even by SIGKILL.
        try:
            f = self._path.open("rb")
        except OSError as e:
            raise StoreError(
                f"cannot open {self._path}: {e.strerror}; check the path and its permissions"
            ) from e
        try:
            # A few tries: `is_served` (the CLI asking whether an engine serves
            # the store) holds the lock for an instant.
            for _ in range(_LOCK_TRIES):
                taken = try_lock(f)
                if taken:
                    break
                time.sleep(_LOCK_PAUSE_S)
        except OSError as e:
            f.close()
            raise StoreError(
                f"cannot lock {self._path} ({e.strerror}); put the store on a local file system"
            ) from e
        if not taken:
            f.close()
            raise StoreError(
                f"the store {self._path} is open for writing in another process; only one "
                "engine may write a store: stop it first, or send it work through "
                "`fusee signal/start/cancel/resume`"
            )
        self._lock_file = f

    def _unlock_writer(self) -> None:
        f, self._lock_file = self._lock_file, None
        if f is not None:
            try:
                unlock(f)
            finally:
                f.close()

    # -- the writer thread's side ------------------------------------------------------

    def _write_main(self, ready: asyncio.Future[tuple[int, int]]) -> None:
        try:
            conn, counters = self._open_writer()
        except BaseException as e:
            self._post(_settle, ready, None, e)
            return
        try:
            self._conn = conn
            self._conn_waits = True  # opened with the store's timeout
            self._post(_settle, ready, counters, None)
            self._serve(conn)
        finally:
            with self._conn_lock:
                self._conn = None
                # Its close folds the WAL into the database, waiting for readers.
                with contextlib.suppress(sqlite3.Error):
                    self._wait_for_locks(conn, True)
                _close(conn, self._path)
                mark, self._mark = self._mark, None
                if mark is not None:
                    mark.close()

    def _open_writer(self) -> tuple[sqlite3.Connection, tuple[int, int]]:
        conn: sqlite3.Connection | None = None
        _bind_plainly()
        try:
            # Used by the loop's thread too (`_write_here`), never at once.
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"{self._path} cannot use SQLite's WAL mode (it stays in {mode!r}); "
                    "put the store on a local file system"
                )
            level = "FULL" if self._durability == "fsync" else "OFF"
            conn.execute(f"PRAGMA synchronous = {level}")
            self._synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
            _check_format(conn, self._path, writer=True, change=True)
            counters = _counters(conn, self._path)
            if self._durability == "fsync":
                # Only durable commits are acknowledged as durable: the mark's account.
                self._mark = start_mark(conn, self._path, counters[0], self._loss)
        except BaseException as e:
            if conn is not None:
                _close(conn, self._path)
            if isinstance(e, sqlite3.Error):
                raise _store_error(e, self._path, "opening") from e
            raise
        return conn, counters

    def _serve(self, conn: sqlite3.Connection) -> None:
        q = self._queue
        while True:
            jobs = [q.get()]
            # Everything queued meanwhile shares one transaction: group commit.
            with contextlib.suppress(queue.Empty):
                while True:
                    jobs.append(q.get_nowait())
            writes = [job for job in jobs if job is not None]
            if writes:
                with self._conn_lock:
                    with contextlib.suppress(sqlite3.Error):  # then the commit reports it
                        self._wait_for_locks(conn, True)
                    before = self._failures_met
                    errors = self._write(conn, writes)
                self._post(self._finish, writes, errors, self._failures_met - before)
            if len(writes) < len(jobs):  # close() queued the stop, and nothing after it
                return

    def _write_here(self, write: _Write) -> bool:
        """Writes ``write`` on the loop's thread if the writer is idle; False if it is not.

        A lone append (the writer has nothing else queued or under way) is
        committed here rather than handed to the writer thread: the two
        thread hand-offs it saves (waking the writer, then the loop) cost
        about as much as the commit's fsync. The loop waits for the commit,
        as the append's caller would have; a write arriving while the writer
        is busy joins its next group commit as before. The loop never waits
        for a lock: when another connection holds the write lock (a client
        posting a command), the write goes to the thread, which waits for it.
        """
        if self._inflight != 1 or write.setup is not None:
            return False  # others are queued or under way; a test hook may block
        with self._conn_lock:
            conn = self._conn
            if conn is None or conn.in_transaction or write.epoch < self._failures_met:
                return False  # the thread's next commit ends a transaction left open
            try:
                self._wait_for_locks(conn, False)
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error:
                return False  # locked (or failing): the thread waits, or reports it
            before = self._failures_met
            try:
                self._commit(conn, [write], begun=True)
                errors: builtins.list[StoreError | None] = [None]
            except Exception as e:
                errors = [self._failure(e)]
        self._finish([write], errors, self._failures_met - before)
        return True

    def _wait_for_locks(self, conn: sqlite3.Connection, wait: bool) -> None:
        """Sets whether ``conn`` waits for another connection's lock; called under `_conn_lock`.

        The thread waits up to the store's busy timeout; the loop's thread
        never waits. The setting stays until the other side needs the other
        one, so a run of commits on one side sets it once (a PRAGMA costs
        about as much as the BEGIN it guards). In WAL mode only the BEGIN
        IMMEDIATE can meet a lock: once it holds the write lock, its
        transaction's statements and COMMIT do not wait for anyone.
        """
        if self._conn_waits is not wait:
            timeout_ms = round(self._busy_timeout_s * 1000) if wait else 0
            conn.execute(f"PRAGMA busy_timeout = {timeout_ms}")
            self._conn_waits = wait

    def _write(
        self, conn: sqlite3.Connection, writes: builtins.list[_Write]
    ) -> builtins.list[StoreError | None]:
        # A journal has no holes: an append called before an earlier one's
        # failure was reported (a caller that does not wait for each append
        # before the next) is not written either. Writes queue in call order,
        # so those come first here.
        stale = 0
        while stale < len(writes) and writes[stale].epoch < self._failures_met:
            stale += 1
        errors: builtins.list[StoreError | None] = [self._behind() for _ in writes[:stale]]
        writes = writes[stale:]
        if not writes:
            return errors
        try:
            self._commit(conn, writes)
            return errors + [None] * len(writes)
        except Exception as e:
            if len(writes) == 1 or _fails_every_write(e):
                return [*errors, self._failure(e), *(self._behind() for _ in writes[1:])]
        # One caller's failure (a bad value) must not fail the appends called
        # before it that shared its transaction: each alone, in order.
        for write in writes:
            if write.epoch < self._failures_met:
                errors.append(self._behind())
                continue
            try:
                self._commit(conn, [write])
                errors.append(None)
            except Exception as e:
                errors.append(self._failure(e))
        return errors

    def _failure(self, e: Exception) -> StoreError:
        error = self._last_failure = self._write_error(e)
        self._failures_met += 1
        return error

    def _behind(self) -> StoreError:
        error = StoreError(
            f"not written: an append called before this one failed ({self._last_failure})"
        )
        error.__cause__ = self._last_failure
        return error

    def _commit(
        self, conn: sqlite3.Connection, writes: builtins.list[_Write], *, begun: bool = False
    ) -> None:
        for w in writes:
            if w.setup is not None:
                w.setup(conn)
        if not begun:
            if conn.in_transaction:
                # A failed write whose rollback failed too (a full or failing
                # disk) left its transaction open: end it now, or no write would
                # ever begin again on this connection.
                conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE")
        try:
            entries = [(e.lsn, e.id, e.run, e.data) for w in writes for e in w.entries]
            _insert_all(conn, _INSERT_ENTRIES, entries)
            _insert_all(conn, _UPSERT_ROWS, [row for w in writes for row in w.rows])
            reserved = None
            for w in writes:
                if w.run_reserved is not None:
                    reserved = w.run_reserved
                if w.fail is not None:
                    raise w.fail
            if reserved is not None:
                conn.execute(_SET_RESERVED, (reserved,))
            for w in writes:
                for statement, params in w.sql:
                    conn.execute(statement, params)
                for call in w.calls:
                    call(conn)
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        self._transactions += 1
        mark = self._mark
        if mark is not None and entries:
            # After COMMIT, which fsynced the WAL: the mark never leads the disk.
            mark.move(entries[-1][0])

    def _write_error(self, e: Exception) -> StoreError:
        if isinstance(e, sqlite3.Error):
            error = _store_error(e, self._path, "writing")
        else:
            error = StoreError(f"writing {self._path} failed: {type(e).__name__}: {e}")
        error.__cause__ = e
        return error

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        # A loop closed without closing the store: nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)


def _settle(
    future: asyncio.Future[tuple[int, int]],
    result: tuple[int, int] | None,
    error: BaseException | None,
) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert result is not None
        future.set_result(result)
