"""The SQLite store: the embedded default, one WAL-mode file ``fusee.db`` per directory.

Schema, format 2 (the format is ``PRAGMA user_version``; ``PRAGMA
application_id`` = `APPLICATION_ID` marks the file as a fusee store)::

    journal(lsn INTEGER PRIMARY KEY, id TEXT, run INTEGER, data BLOB)
        index (id, run, lsn)                      -- load(), by run then LSN
    runs(id TEXT PRIMARY KEY, run, workflow, status, started_ms, finished_ms,
         wake_ms, attributes BLOB, parent)        -- one row per id: its latest run
        index (started_ms, id), (status, started_ms, id), (workflow, started_ms, id)
    meta(key TEXT PRIMARY KEY, value INTEGER)
        'run_reserved': run numbers up to it may have been handed out
    commands(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, kind, run_id,
             payload BLOB, dedup, created_ms, attempts, answered_ms, ok, answer BLOB)
        index (seq) of unanswered commands        -- the inbox (format 2)

``attributes`` is a msgpack map, NULL when empty. Run numbers are reserved in
blocks (`next_run` writes once per block, riding along with appends), and
``close`` writes back the exact count, so only a crash leaves a gap.

A new store appears whole (built under a temporary name, then linked into
place), so an empty ``fusee.db``, one without SQLite's header, one shorter
than its header says with pages lost, or a ``-wal`` without its database is
damage: `open` refuses it, changing nothing, instead of starting an empty
store over the runs that were there.

The rule: only the writer thread writes. Every change goes through its
queue, in call order, so LSNs land in order and the appends queued while a
commit runs go to disk together in the next transaction (one fsync). Reads
run on a separate read-only connection in a reader thread, after the writes
queued before them; the event loop never waits on SQLite. A client store
(``client=True``: `fusee.Client`, the CLI) is the one exception: it takes no
writer lock and writes only ``commands`` rows, each in a transaction of one
statement, beside the engine that serves the store.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import queue
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias, TypeVar

import msgpack

from fusee.errors import CorruptRecord, FuseeError, StoreError
from fusee.store._base import (
    RUN_STATUSES,
    UNFINISHED_STATUSES,
    Answer,
    Command,
    Entry,
    RunRow,
    _check_batch,
    _check_command,
    _check_durability,
    _check_list_args,
    _matches,
    _normalize_filter,
    _not_found,
    _now_ms,
    _unpack_attributes,
)
from fusee.store._lock import try_lock, unlock

__all__ = ["APPLICATION_ID", "FILENAME", "FORMAT", "PAGE_SIZE", "SqliteStore", "is_served"]

FILENAME: Final = "fusee.db"
"""The store's file in its directory (SQLite adds ``-wal`` and ``-shm`` beside it)."""

FORMAT: Final = 2
"""The schema format this fusee writes; an older one is upgraded on open."""

APPLICATION_ID: Final = 0x66757365
"""``PRAGMA application_id`` of a fusee store ("fuse"): tells it from other databases."""

PAGE_SIZE: Final = 4096
"""The page size of the stores fusee creates."""

_COMMANDS_SCHEMA: Final = (
    "CREATE TABLE commands (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
    " kind TEXT NOT NULL, run_id TEXT NOT NULL, payload BLOB NOT NULL, dedup TEXT,"
    " created_ms INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, answered_ms INTEGER,"
    " ok INTEGER, answer BLOB)",
    "CREATE INDEX commands_open ON commands (seq) WHERE answered_ms IS NULL",
    "CREATE INDEX commands_answered ON commands (answered_ms) WHERE answered_ms IS NOT NULL",
)

_SCHEMA: Final = (
    "CREATE TABLE journal (lsn INTEGER PRIMARY KEY, id TEXT NOT NULL,"
    " run INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE INDEX journal_by_run ON journal (id, run, lsn)",
    "CREATE TABLE runs (id TEXT PRIMARY KEY, run INTEGER NOT NULL, workflow TEXT NOT NULL,"
    " status TEXT NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER,"
    " wake_ms INTEGER, attributes BLOB, parent TEXT)",
    "CREATE INDEX runs_by_start ON runs (started_ms, id)",
    "CREATE INDEX runs_by_status ON runs (status, started_ms, id)",
    "CREATE INDEX runs_by_workflow ON runs (workflow, started_ms, id)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO meta VALUES ('run_reserved', 0)",
    *_COMMANDS_SCHEMA,
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {FORMAT}",
)

# Statements that upgrade format N to N + 1, keyed by N: format 2 adds the
# commands inbox.
_MIGRATIONS: Final[Mapping[int, tuple[str, ...]]] = {1: _COMMANDS_SCHEMA}

_COMMAND_COLUMNS: Final = "id, kind, run_id, payload, dedup, created_ms, attempts"
_INSERT_COMMAND: Final = (
    f"INSERT OR IGNORE INTO commands ({_COMMAND_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 0)"
)
# How often `wait_commands` looks at the files for another process's commit.
_POLL_S: Final = 0.01
# The bytes of the WAL index's header that change with every commit (its
# first copy: version, change counter, mxFrame, page count, checksums, salts).
_SHM_HEADER: Final = 48
# Tries to take the writer's lock, and the pause between them (`_lock_writer`).
_LOCK_TRIES: Final = 5
_LOCK_PAUSE_S: Final = 0.01

_ROW_COLUMNS: Final = (
    "id, run, workflow, status, started_ms, finished_ms, wake_ms, attributes, parent"
)
# Statements `_insert_all` completes with one "(?, ...)" per row.
_INSERT_ENTRIES: Final = "INSERT INTO journal (lsn, id, run, data) VALUES"
_UPSERT_ROWS: Final = f"INSERT OR REPLACE INTO runs ({_ROW_COLUMNS}) VALUES"
_SET_RESERVED: Final = "UPDATE meta SET value = ? WHERE key = 'run_reserved'"

# Run numbers reserved per meta write: a crash wastes at most this many.
_RUN_BLOCK: Final = 128

# SQLite primary result codes (the low byte of an extended code).
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _CONSTRAINT, _NOTADB = (
    5, 6, 8, 10, 11, 13, 14, 19, 26,
)  # fmt: skip

_SqlRow: TypeAlias = tuple[Any, ...]
_Loaded: TypeAlias = builtins.list[tuple[int, bytes]]
_BatchedRead: TypeAlias = tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]
_T = TypeVar("_T")

log = logging.getLogger("fusee")


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


class SqliteStore:
    """A `fusee.store.Store` in ``DIRECTORY/fusee.db`` (SQLite, WAL mode).

    Args:
        directory: Where the store lives; created with its parents if missing
            (unless ``readonly``).
        durability: ``"fsync"`` (``synchronous=FULL``: an append is on disk
            when it returns) or ``"none"`` (``synchronous=OFF``: for tests and
            demos; a power loss may lose recent appends).
        readonly: Read an existing store only (the CLI does, while an engine
            writes it from another process).
        client: Read it, and post commands to its inbox (`fusee.Client`):
            creates the store if there is none, takes no writer lock, and
            writes nothing but ``commands`` rows.

    Raises:
        ValueError: An unknown ``durability``, or both ``readonly`` and ``client``.

    Example:
        >>> import asyncio, tempfile
        >>> from fusee.store import Entry, RunRow
        >>> async def demo(directory: str) -> list[tuple[int, bytes]]:
        ...     store = SqliteStore(directory, durability="none")
        ...     await store.open()
        ...     await store.append([Entry(1, "a", 1, b"start")],
        ...                        [RunRow("a", 1, "wf", "running", 0)])
        ...     await store.close()
        ...     reader = SqliteStore(directory, readonly=True)
        ...     await reader.open()
        ...     try:
        ...         return await reader.load("a")
        ...     finally:
        ...         await reader.close()
        >>> with tempfile.TemporaryDirectory() as d:
        ...     asyncio.run(demo(d))
        [(1, b'start')]
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        durability: str = "fsync",
        readonly: bool = False,
        client: bool = False,
    ) -> None:
        _check_durability(durability)
        if readonly and client:
            raise ValueError("a store opens read-only or as a client, not both")
        self._directory = Path(directory)
        self._path = self._directory / FILENAME
        self._durability = durability
        self._readonly = readonly or client
        self._client = client
        # A client's connection for posting commands (used on the reader thread).
        self._cconn: sqlite3.Connection | None = None
        # Commands taken since `open`; the highest command seq seen, and the
        # files' (mtime, size) when last looked at (`wait_commands`).
        self._taken: set[str] = set()
        self._seen_seq = 0
        self._files_seen: tuple[int | bytes, ...] = ()
        self._posted: asyncio.Event | None = None
        self._shm_fd: int | None = None
        self._lock_file: Any = None
        # Whether the file is shorter than its header says (see `_inspect`).
        self._suspect = False
        # How long a write waits for another process's lock before failing.
        self._busy_timeout_s = 5.0
        self._state = "new"  # -> opening -> open -> closing -> closed (-> opening again)
        self._closing: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._rconn: sqlite3.Connection | None = None
        self._last_lsn = 0
        # Above every LSN stored or queued: what the next append must exceed.
        self._accepted_lsn = 0
        self._inflight = 0
        self._tail: asyncio.Future[StoreError | None] | None = None
        # Failed appends, as the loop has seen them reported and as the writer
        # thread has met them (each side touches only its own counter).
        self._failures_reported = 0
        self._failures_met = 0
        self._last_failure: StoreError | None = None
        # The latest row of each id in a write not finished yet, with that
        # write's future: `get` answers from here rather than waiting for
        # the writer (an engine's start asks for a row on every call).
        self._pending: dict[str, tuple[RunRow, asyncio.Future[StoreError | None]]] = {}
        self._batch: builtins.list[_BatchedRead] | None = None  # reads to send after this turn
        self._run_next = 1
        self._run_reserved = 0
        self._run_lock = asyncio.Lock()
        # For tests: committed write transactions, and the connection's
        # `PRAGMA synchronous` as read back after setting it.
        self._transactions = 0
        self._synchronous: int | None = None
        self._fail_next: Exception | None = None
        self._setup_next: Callable[[sqlite3.Connection], object] | None = None

    @property
    def path(self) -> Path:
        """The database file: ``DIRECTORY/fusee.db``.

        Example:
            >>> SqliteStore("data").path.as_posix()
            'data/fusee.db'
        """
        return self._path

    @property
    def last_lsn(self) -> int:
        """The highest LSN stored, 0 when empty (for a read-only store: at open).

        Example:
            >>> SqliteStore("data").last_lsn
            0
        """
        return self._last_lsn

    async def open(self) -> None:
        """Creates the store or checks the one there, and starts its threads.

        Opening an open store does nothing; a closed one may be opened again.

        Raises:
            StoreError: The file is not a fusee store (or not a database), is
                damaged (empty, truncated, a WAL without its database, part of
                its schema missing: the message says how to restore it or move
                it aside), is from a newer fusee, is locked by another process,
                or (read-only) does not exist.

        Example:
            >>> import asyncio, tempfile
            >>> async def demo(directory: str) -> int:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     await store.close()
            ...     return store.last_lsn
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            0
        """
        if self._state == "open":
            return
        if self._state == "opening":
            raise StoreError(f"the store {self._path} is being opened already; await that open()")
        if self._state == "closing":
            await self.close()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._queue = queue.SimpleQueue()
        self._tail = None
        self._pending = {}
        self._inflight = 0
        self._failures_reported = self._failures_met = 0
        self._run_lock = asyncio.Lock()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="fusee-store-read")
        self._state = "opening"
        self._taken = set()
        self._seen_seq = 0
        self._files_seen = ()
        self._posted = asyncio.Event()
        try:
            if self._client:
                await loop.run_in_executor(self._reader, self._prepare_client)
                last_lsn, reserved = await loop.run_in_executor(self._reader, self._open_reader)
                await loop.run_in_executor(self._reader, self._open_client)
            elif self._readonly:
                last_lsn, reserved = await loop.run_in_executor(self._reader, self._open_reader)
            else:
                await loop.run_in_executor(self._reader, self._prepare_writer)
                # Checked through a read-only connection before a writable one
                # opens: refusing a damaged file then changes nothing in it (a
                # writable connection's close would fold the WAL into it).
                await loop.run_in_executor(self._reader, self._open_reader)
                ready: asyncio.Future[tuple[int, int]] = loop.create_future()
                self._writer = threading.Thread(
                    target=self._write_main,
                    args=(ready,),
                    name=f"fusee-store-write {self._directory}",
                    # A store nobody closed must not keep the process alive.
                    daemon=True,
                )
                self._writer.start()
                last_lsn, reserved = await ready
        except BaseException:
            await self._shut_down()
            self._state = "closed"
            raise
        self._last_lsn = self._accepted_lsn = last_lsn
        self._run_reserved = reserved
        self._run_next = reserved + 1
        self._state = "open"

    async def close(self) -> None:
        """Waits for the writes queued so far, then closes; closing twice is harmless.

        Example:
            >>> import asyncio
            >>> asyncio.run(SqliteStore("never-opened").close())
        """
        if self._state in ("new", "opening", "closed"):
            return
        if self._closing is not None:
            await asyncio.shield(self._closing)
            return
        loop = asyncio.get_running_loop()
        closing = self._closing = loop.create_future()
        self._state = "closing"
        try:
            if self._writer is not None:
                async with self._run_lock:
                    # Give back the unused part of the reserved block.
                    if self._run_next - 1 < self._run_reserved:
                        self._submit((), [], self._run_next - 1, None, 0)
            await self._shut_down()
        finally:
            self._state = "closed"
            self._closing = None
            closing.set_result(None)

    async def append(self, entries: Sequence[Entry], runs: Sequence[RunRow] = ()) -> None:
        """Stores ``entries`` and ``runs`` in one transaction, or nothing when it raises.

        Appends queued while the writer commits go to disk together in its
        next transaction; each returns once that transaction is committed
        (and, under ``durability="fsync"``, synced). Cancelling the caller
        does not cancel the write. When one fails, those called before its
        failure was reported fail too (a journal never has a hole).

        Args:
            entries: Records with increasing LSNs above every LSN appended before.
            runs: Rows that replace the rows of their ids, in order.

        Raises:
            ValueError: LSNs that do not increase past those appended before.
            TypeError: Record data that is not bytes, or attributes msgpack
                cannot encode.
            StoreError: The write failed (disk full, locked by another
                process, read-only store, closed store). Nothing of the batch
                is stored, and the store stays usable: an append called once
                the failure was reported is tried afresh (after space is
                freed, it succeeds). Those called before it was reported fail
                too and store nothing; once they have all returned,
                `last_lsn` is that of the last stored append, and the failed
                batches may be appended again with the same LSNs.

        Example:
            >>> import asyncio, tempfile
            >>> from fusee.store import Entry
            >>> async def demo(directory: str) -> int:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     await store.append([Entry(7, "a", 1, b"x")])
            ...     await store.close()
            ...     return store.last_lsn
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            7
        """
        self._check_writable()
        entries = tuple(entries)
        last, packed = _check_batch(entries, runs, self._accepted_lsn)
        if not entries and not runs:
            return
        rows = [
            (
                r.id,
                r.run,
                r.workflow,
                r.status,
                r.started_ms,
                r.finished_ms,
                r.wake_ms,
                blob,
                r.parent,
            )
            for r, blob in zip(runs, packed, strict=True)
        ]
        fail, self._fail_next = self._fail_next, None
        setup, self._setup_next = self._setup_next, None
        write = self._submit(entries, rows, None, fail, last if entries else 0, setup)
        pending = self._pending
        for r in runs:
            pending[r.id] = (r, write.done)
        error = await write.answer
        if error is not None:
            raise error

    async def load(
        self, id: str, run: int | None = None, *, after_lsn: int = 0
    ) -> builtins.list[tuple[int, bytes]]:
        """Returns a run's records after ``after_lsn`` as ``(lsn, data)`` in LSN order.

        Args:
            id: The workflow id.
            run: The run number; None for the id's latest run.
            after_lsn: Only records with a higher LSN are returned.

        Raises:
            NotFound: No such id, or no records for that run of it.
            CorruptRecord: The run has a row but no records (its journal is
                lost), or a record that is not bytes; the message names the run.
            StoreError: The file is damaged or unreadable.

        Example:
            >>> import asyncio, tempfile
            >>> from fusee.store import Entry
            >>> async def demo(directory: str) -> list[tuple[int, bytes]]:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     await store.append([Entry(1, "a", 1, b"x"), Entry(2, "a", 1, b"y")])
            ...     try:
            ...         return await store.load("a", 1, after_lsn=1)
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            [(2, b'y')]
        """
        await self._after_writes()
        return await self._read_batched(lambda conn: _load(conn, id, run, after_lsn, self._path))

    def _read_batched(self, fn: Callable[[sqlite3.Connection], _T]) -> asyncio.Future[_T]:
        # Reads asked for in one turn of the loop (recovery, many runs woken
        # or started at once) share one trip to the reader thread and one
        # snapshot: a trip costs more than the queries of a few hundred.
        assert self._loop is not None
        fut: asyncio.Future[_T] = self._loop.create_future()
        batch = self._batch
        if batch is None:
            batch = self._batch = []
            self._loop.call_soon(self._send_batch, batch)
        batch.append((fn, fut))
        return fut

    def _send_batch(self, batch: builtins.list[_BatchedRead]) -> None:
        assert self._loop is not None
        self._batch = None
        fns = [fn for fn, _ in batch]

        def settle(done: asyncio.Future[builtins.list[Any]]) -> None:
            error = done.exception() if not done.cancelled() else StoreError("store closed")
            for n, (_, fut) in enumerate(batch):
                if fut.done():  # its caller was cancelled
                    continue
                result = error if error is not None else done.result()[n]
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)

        try:
            self._check_open()
            reading = self._loop.run_in_executor(
                self._reader, self._run_read, lambda conn: _read_many(conn, fns, self._path)
            )
        except (StoreError, RuntimeError) as e:  # closed meanwhile
            reading = self._loop.create_future()
            reading.set_exception(e if isinstance(e, StoreError) else StoreError(str(e)))
        reading.add_done_callback(settle)

    async def get(self, id: str) -> RunRow | None:
        """Returns the row of ``id`` (its latest run), or None.

        Raises:
            CorruptRecord: The row is damaged (a field fusee never writes, an
                unknown status, attributes that do not decode); the message
                names the run. Other runs' rows read as before.
            StoreError: The file is damaged or unreadable where the row is.

        Example:
            >>> import asyncio, tempfile
            >>> async def demo(directory: str) -> RunRow | None:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     try:
            ...         return await store.get("nobody")
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     print(asyncio.run(demo(d)))
            None
        """
        latest = self._pending.get(id)
        if latest is not None:
            # Written, or being written: what a read after the write would see.
            return latest[0]
        # No write of this id is in flight, so the committed database already
        # has its latest row: no need to wait for the writer (unlike `_read`).
        self._check_open()
        return await self._read_batched(lambda conn: _get(conn, id, self._path))

    async def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        after: tuple[int, str] | None = None,
        started_from_ms: int | None = None,
        started_to_ms: int | None = None,
    ) -> builtins.list[RunRow]:
        """Returns the rows matching every filter given, by start time then id.

        Args:
            status: Only rows with this status.
            workflow: Only rows of this workflow type.
            attributes: Only rows having each of these keys with an equal value.
            limit: At most this many rows.
            newest_first: Latest start first.
            after: The ``(started_ms, id)`` of the previous page's last row.
            started_from_ms: Only rows started at or after this time.
            started_to_ms: Only rows started at or before this time.

        A damaged row (one `get` refuses with `CorruptRecord`) is left out
        and logged as a warning on the ``fusee`` logger naming its run, so
        that one damaged run does not hide the others; `fusee check` reports
        every damaged row.

        Raises:
            ValueError: An unknown status, or a negative limit.
            StoreError: The file is damaged or unreadable where the rows are.

        Example:
            >>> import asyncio, tempfile
            >>> from fusee.store import RunRow
            >>> async def demo(directory: str) -> list[str]:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     await store.append([], [RunRow("b", 1, "wf", "running", 2),
            ...                             RunRow("a", 2, "wf", "failed", 1)])
            ...     try:
            ...         return [r.id for r in await store.list(status="running")]
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            ['b']
        """
        _check_list_args(status, limit, after)
        wanted = _normalize_filter(attributes)
        page = _Page(newest_first, after, started_from_ms, started_to_ms)
        return await self._read(
            lambda conn: _list(conn, status, workflow, wanted, limit, page, self._path)
        )

    async def unfinished(self) -> builtins.list[RunRow]:
        """Returns the rows of runs that are running, suspended or paused.

        A damaged row is left out and logged, as in `list`; `fusee check`
        reports it.

        Example:
            >>> import asyncio, tempfile
            >>> async def demo(directory: str) -> list[RunRow]:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     try:
            ...         return await store.unfinished()
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            []
        """
        return await self._read(lambda conn: _unfinished(conn, self._path))

    async def next_run(self) -> int:
        """Returns a run number this store never gave out before (from 1 up).

        Raises:
            StoreError: A read-only or closed store, or the counter could not
                be written.

        Example:
            >>> import asyncio, tempfile
            >>> async def demo(directory: str) -> list[int]:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     first = [await store.next_run(), await store.next_run()]
            ...     await store.close()
            ...     await store.open()
            ...     try:
            ...         return [*first, await store.next_run()]
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            [1, 2, 3]
        """
        self._check_writable()
        if self._run_next > self._run_reserved:
            async with self._run_lock:
                self._check_writable()
                if self._run_next > self._run_reserved:
                    reserved = self._run_next - 1 + _RUN_BLOCK
                    error = await self._submit((), [], reserved, None, 0).answer
                    if error is not None:
                        raise error
                    self._run_reserved = reserved
        run = self._run_next
        self._run_next += 1
        return run

    # -- the commands inbox -------------------------------------------------------------

    async def post_command(self, command: Command) -> str:
        """Stores ``command`` in the inbox, durably; returns its id.

        A client store posts on its own connection (one short transaction,
        beside the engine's writer); the engine's store through its writer.

        Raises:
            ValueError: An unknown kind or an empty id; nothing is stored.
            StoreError: The store is read-only or closed, or the write failed.

        Example:
            >>> import asyncio, tempfile
            >>> from fusee.store import Command
            >>> async def demo(directory: str) -> list[str]:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     client = SqliteStore(directory, durability="none", client=True)
            ...     await client.open()
            ...     await client.post_command(Command("c-1", "cancel", "order-1"))
            ...     await client.close()
            ...     try:
            ...         return [c.id for c in await store.take_commands()]
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            ['c-1']
        """
        _check_command(command)
        values = (
            command.id,
            command.kind,
            command.run_id,
            command.payload,
            command.dedup,
            command.created_ms,
        )
        if self._client:
            self._check_open()
            assert self._loop is not None
            await self._loop.run_in_executor(self._reader, self._post_as_client, values)
        else:
            await self._write_inbox(((_INSERT_COMMAND, values),))
        if self._posted is not None:
            self._posted.set()
        return command.id

    async def take_commands(self, limit: int = 100) -> builtins.list[Command]:
        """The unanswered commands not taken since `open`, oldest first, each counted taken.

        Raises:
            StoreError: A read-only or client store, or the write failed.

        Example:
            >>> import asyncio, tempfile
            >>> async def demo(directory: str) -> list[Command]:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     try:
            ...         return await store.take_commands()
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            []
        """
        self._check_writable()
        taken = self._taken
        wanted = limit + len(taken)
        rows: builtins.list[_SqlRow] = await self._read(
            lambda conn: conn.execute(
                f"SELECT seq, {_COMMAND_COLUMNS} FROM commands WHERE answered_ms IS NULL"
                " ORDER BY seq LIMIT ?",
                (wanted,),
            ).fetchall()
        )
        if rows:
            self._seen_seq = max(self._seen_seq, rows[-1][0])
        fresh = [r for r in rows if r[1] not in taken][:limit]
        if not fresh:
            return []
        marks = ", ".join("?" * len(fresh))
        ids = tuple(r[1] for r in fresh)
        await self._write_inbox(
            (("UPDATE commands SET attempts = attempts + 1 WHERE id IN (" + marks + ")", ids),)
        )
        taken.update(ids)
        return [
            Command(id, kind, run_id, payload, dedup, created_ms, attempts + 1)
            for _, id, kind, run_id, payload, dedup, created_ms, attempts in fresh
        ]

    async def wait_commands(self, timeout_s: float) -> None:
        """Returns when a command may have been posted, or after ``timeout_s``.

        Another process's commit changes the WAL index (``-shm``): its
        header is read every 10 ms (no query), and only when it changed is
        the inbox asked for a command newer than the last seen.
        A command posted through this store object wakes it at once.

        Example:
            >>> import asyncio, tempfile
            >>> async def demo(directory: str) -> None:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     await store.wait_commands(0.02)
            ...     await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
        """
        self._check_open()
        assert self._loop is not None
        assert self._posted is not None
        deadline = self._loop.time() + timeout_s
        posted = self._posted
        while True:
            if posted.is_set():
                posted.clear()
                return
            files = self._files_state()
            if files != self._files_seen:
                self._files_seen = files
                newest = await self._read(
                    lambda conn: conn.execute(
                        "SELECT coalesce(max(seq), 0) FROM commands"
                    ).fetchone()[0]
                )
                if newest > self._seen_seq:
                    self._seen_seq = newest
                    return
            left = deadline - self._loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(posted.wait(), min(_POLL_S, left))

    def _files_state(self) -> tuple[int | bytes, ...]:
        # The WAL index's header (the start of -shm) counts every commit of
        # every connection (its mxFrame, and the WAL's salts after a reset):
        # a file's mtime would miss two commits within one clock tick. Its
        # descriptor stays open until the store's connections are closed:
        # closing it would drop the POSIX locks SQLite holds on the file for
        # this process, and another process's writer would write the WAL
        # beside ours.
        state: builtins.list[int | bytes] = []
        try:
            if self._shm_fd is None:
                self._shm_fd = os.open(self._path.with_name(self._path.name + "-shm"), os.O_RDONLY)
            state.append(os.pread(self._shm_fd, _SHM_HEADER, 0))
        except OSError:
            state.append(b"")
        for path in (self._path, self._path.with_name(self._path.name + "-wal")):
            try:
                st = path.stat()
            except OSError:
                state += [0, 0]
            else:
                state += [st.st_mtime_ns, st.st_size]
        return tuple(state)

    async def answer_command(self, id: str, ok: bool, payload: bytes) -> None:
        """Stores the answer to command ``id``, durably (an unknown id is ignored).

        Raises:
            StoreError: A read-only or client store, or the write failed.

        Example:
            >>> import asyncio, tempfile
            >>> from fusee.store import Command
            >>> async def demo(directory: str) -> bool:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     await store.post_command(Command("c-1", "resume", "r-1"))
            ...     await store.answer_command("c-1", True, b"")
            ...     answer = await store.get_answer("c-1")
            ...     await store.close()
            ...     return answer is not None and answer.ok
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            True
        """
        await self._write_inbox(
            (
                (
                    "UPDATE commands SET answered_ms = ?, ok = ?, answer = ?"
                    " WHERE id = ? AND answered_ms IS NULL",
                    (_now_ms(), int(bool(ok)), bytes(payload), id),
                ),
            )
        )
        self._taken.discard(id)

    async def get_answer(self, id: str) -> Answer | None:
        """The answer to command ``id``, or None while it has none.

        Example:
            >>> import asyncio, tempfile
            >>> async def demo(directory: str) -> Answer | None:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     try:
            ...         return await store.get_answer("nobody")
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     print(asyncio.run(demo(d)))
            None
        """
        found = await self._read(
            lambda conn: conn.execute(
                "SELECT ok, answer, answered_ms FROM commands"
                " WHERE id = ? AND answered_ms IS NOT NULL",
                (id,),
            ).fetchone()
        )
        if found is None:
            return None
        ok, answer, answered_ms = found
        return Answer(bool(ok), bytes(answer or b""), int(answered_ms))

    async def forget_commands(self, answered_before_ms: int) -> int:
        """Deletes the commands answered before ``answered_before_ms``; returns how many.

        Raises:
            StoreError: A read-only or client store, or the write failed.

        Example:
            >>> import asyncio, tempfile
            >>> async def demo(directory: str) -> int:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     try:
            ...         return await store.forget_commands(0)
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            0
        """
        old = await self._read(
            lambda conn: conn.execute(
                "SELECT count(*) FROM commands WHERE answered_ms < ?", (answered_before_ms,)
            ).fetchone()[0]
        )
        if old:
            await self._write_inbox(
                (("DELETE FROM commands WHERE answered_ms < ?", (answered_before_ms,)),)
            )
        return int(old)

    async def _write_inbox(self, sql: tuple[tuple[str, tuple[Any, ...]], ...]) -> None:
        # Through the writer's queue: an inbox write rides along with the
        # appends queued with it, in one transaction.
        self._check_writable()
        error = await self._submit((), [], None, None, 0, None, sql).answer
        if error is not None:
            raise error

    def _fail_next_append(self, exc: Exception) -> None:
        """Test hook: the next append raises ``exc`` inside its transaction."""
        self._fail_next = exc

    def _before_next_append(self, fn: Callable[[sqlite3.Connection], object]) -> None:
        """Test hook: the writer thread calls ``fn`` on its connection before the next append.

        For example ``PRAGMA max_page_count``, which makes SQLite's disk full.
        """
        self._setup_next = fn

    # -- the event loop's side ---------------------------------------------------------

    def _check_writable(self) -> None:
        if self._state != "open":
            raise StoreError(f"the store {self._path} is closed; await store.open() first")
        if self._client:
            raise StoreError(
                f"the store {self._path} is open as a client: it posts commands and reads; "
                "the engine serving it writes the rest (open it without client=True)"
            )
        if self._readonly:
            raise StoreError(
                f"the store {self._path} is open read-only; an engine writes it "
                "(open it without readonly=True)"
            )

    def _submit(
        self,
        entries: tuple[Entry, ...],
        rows: builtins.list[_SqlRow],
        run_reserved: int | None,
        fail: Exception | None,
        max_lsn: int,
        setup: Callable[[sqlite3.Connection], object] | None = None,
        sql: tuple[tuple[str, tuple[Any, ...]], ...] = (),
    ) -> _Write:
        loop = self._loop
        assert loop is not None
        done: asyncio.Future[StoreError | None] = loop.create_future()
        if max_lsn:
            self._accepted_lsn = max_lsn
        self._inflight += 1
        self._tail = done
        epoch = self._failures_reported
        write = _Write(
            entries,
            rows,
            run_reserved,
            fail,
            setup,
            sql,
            max_lsn,
            epoch,
            done,
            loop.create_future(),
        )
        self._queue.put(write)
        return write

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

    def _check_open(self) -> None:
        if self._state != "open":
            raise StoreError(f"the store {self._path} is closed; await store.open() first")

    async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        await self._after_writes()
        assert self._loop is not None
        return await self._loop.run_in_executor(self._reader, self._run_read, fn)

    async def _after_writes(self) -> None:
        self._check_open()
        tail = self._tail
        if tail is not None and not tail.done():
            # Reads see every append called before them, committed or failed.
            await asyncio.wait((tail,))
            self._check_open()  # closed meanwhile

    async def _shut_down(self) -> None:
        loop = asyncio.get_running_loop()
        reader = self._reader
        assert reader is not None
        try:
            # The reader first: the last connection to close folds the WAL into
            # the database and removes it, which a read-only one cannot do.
            await loop.run_in_executor(reader, self._close_reader)
            await loop.run_in_executor(reader, self._close_client)
            if self._writer is not None:
                self._queue.put(None)
                await loop.run_in_executor(reader, self._writer.join)
                self._writer = None
        finally:
            reader.shutdown(wait=True)
            self._reader = None
            # After the connections: its close drops the process's locks on -shm.
            shm, self._shm_fd = self._shm_fd, None
            if shm is not None:
                os.close(shm)
            self._unlock_writer()

    def _prepare_client(self) -> None:
        """Creates the store if there is none (a client may post before any engine ran)."""
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(
                f"cannot create the store directory {self._directory}: {e.strerror}; "
                "pass a directory you can write"
            ) from e
        # `stat` only (see `_open_reader`): `_create` makes a whole store or none.
        if not self._path.exists():
            _create(self._path, fsync=self._durability == "fsync")

    def _open_client(self) -> None:
        try:
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            level = "FULL" if self._durability == "fsync" else "OFF"
            conn.execute(f"PRAGMA synchronous = {level}")
        except sqlite3.Error as e:
            raise _store_error(e, self._path, "opening") from e
        self._cconn = conn

    def _close_client(self) -> None:
        conn, self._cconn = self._cconn, None
        if conn is not None:
            _close(conn, self._path)

    def _post_as_client(self, values: tuple[Any, ...]) -> None:
        conn = self._cconn
        assert conn is not None
        try:
            # One statement, committed alone: the client holds SQLite's write
            # lock for as short as it can, beside the engine's writer.
            conn.execute(_INSERT_COMMAND, values)
        except sqlite3.Error as e:
            raise _store_error(e, self._path, "posting a command to") from e

    def _prepare_writer(self) -> None:
        """Inspects the files, creates the store if there is none, and takes the writer's lock."""
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(
                f"cannot create the store directory {self._directory}: {e.strerror}; "
                "pass a directory you can write"
            ) from e
        suspect = _inspect(self._path)
        if suspect is None:
            _create(self._path, fsync=self._durability == "fsync")
        self._suspect = bool(suspect)
        self._lock_writer()

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

    # -- the reader thread's side ------------------------------------------------------

    def _open_reader(self) -> tuple[int, int]:
        """Opens the read-only connection and checks the store; the writer's check first."""
        if self._client:
            # No file of the store is opened but by SQLite: in a process with
            # an engine on it, closing one would drop SQLite's locks (POSIX
            # locks are the process's). SQLite's own checks follow.
            pass
        elif self._readonly:
            suspect = _inspect(self._path)
            if suspect is None:
                raise StoreError(
                    f"no fusee store in {self._directory}; start an engine there first or "
                    "pass --data"
                )
            self._suspect = suspect
        try:
            conn = sqlite3.connect(
                f"{self._path.resolve().as_uri()}?mode=ro",
                uri=True,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as e:
            raise _store_error(e, self._path, "opening") from e
        try:
            if self._suspect:
                _check_pages(conn, self._path)
            counters = (0, 0)
            if _check_format(conn, self._path, writer=not self._readonly, change=False):
                counters = _counters(conn, self._path)
        except BaseException as e:
            _close(conn, self._path)
            if isinstance(e, sqlite3.Error):
                raise _store_error(e, self._path, "opening") from e
            raise
        self._rconn = conn
        return counters

    def _close_reader(self) -> None:
        conn, self._rconn = self._rconn, None
        if conn is not None:
            _close(conn, self._path)

    def _run_read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        conn = self._rconn
        assert conn is not None
        try:
            result = fn(conn)
        except BaseException as e:
            # The read's own error is the one to report, not one from ending
            # its snapshot (on a damaged file that fails too).
            with contextlib.suppress(sqlite3.Error):
                _end_read(conn)
            if isinstance(e, sqlite3.Error):
                raise _store_error(e, self._path, "reading") from e
            raise
        try:
            _end_read(conn)
        except sqlite3.Error as e:
            raise _store_error(e, self._path, "reading") from e
        return result

    # -- the writer thread's side ------------------------------------------------------

    def _write_main(self, ready: asyncio.Future[tuple[int, int]]) -> None:
        try:
            conn, counters = self._open_writer()
        except BaseException as e:
            self._post(_settle, ready, None, e)
            return
        try:
            self._post(_settle, ready, counters, None)
            self._serve(conn)
        finally:
            _close(conn, self._path)

    def _open_writer(self) -> tuple[sqlite3.Connection, tuple[int, int]]:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(self._path, timeout=self._busy_timeout_s, isolation_level=None)
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
                before = self._failures_met
                errors = self._write(conn, writes)
                self._post(self._finish, writes, errors, self._failures_met - before)
            if len(writes) < len(jobs):  # close() queued the stop, and nothing after it
                return

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

    def _commit(self, conn: sqlite3.Connection, writes: builtins.list[_Write]) -> None:
        for w in writes:
            if w.setup is not None:
                w.setup(conn)
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
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        self._transactions += 1

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


def is_served(directory: str | os.PathLike[str]) -> bool:
    """Whether an engine (a worker, or a program's own) holds the store in ``directory`` open.

    Its writer lock is probed for an instant; an engine opening meanwhile
    tries again. Ask before this process opens the store: the probe opens
    and closes the database file, and a close drops the POSIX locks SQLite
    holds on it for the whole process.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     is_served(d)
        False
    """
    try:
        f = (Path(directory) / FILENAME).open("rb")
    except OSError:
        return False
    with f:
        if try_lock(f):
            unlock(f)
            return False
        return True


# Rows per multi-row INSERT: 4 or 9 parameters each, under SQLite's limit of
# 32,766 parameters per statement.
_ROWS_PER_INSERT: Final = 2048


def _insert_all(conn: sqlite3.Connection, insert: str, rows: Sequence[_SqlRow]) -> None:
    """Inserts ``rows`` with ``insert`` (a statement up to its VALUES), a few statements in all.

    Why not executemany: the writer thread takes the GIL back after every
    row's statement, and while the event loop's thread runs workflow code it
    gets it only after waiting out the switch interval: a batch of 200 rows
    took milliseconds and slowed the loop down. One statement per 2,048 rows
    takes it back once.
    """
    if not rows:
        return
    values = f"({', '.join('?' * len(rows[0]))})"
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        conn.execute(f"{insert} {', '.join([values] * len(chunk))}", [v for r in chunk for v in r])


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


def _check_format(conn: sqlite3.Connection, path: Path, *, writer: bool, change: bool) -> bool:
    """Checks that ``conn`` holds a fusee store of this format, or one a writer makes so.

    With ``change``, a writer creates the schema in an empty database and
    upgrades an older format. Returns whether the store is ready: False when
    a writer must create or upgrade it first (only for a writer, without
    ``change``).
    """
    app, version = _header(conn)
    if app == 0 and version == 0:
        _check_empty(conn, path)
        if not writer:
            raise StoreError(
                f"{path} is not a fusee store (an empty database); start an engine "
                "there first or pass --data"
            )
        if not change:
            return False
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have created it since we looked.
            app, version = _header(conn)
            if app == 0 and version == 0:
                _check_empty(conn, path)
                for statement in _SCHEMA:
                    conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        app, version = _header(conn)
    if app != APPLICATION_ID:
        raise _foreign(path)
    if version > FORMAT:
        raise StoreError(
            f"store {path} has format {version}, newer than this fusee understands "
            f"({FORMAT}); upgrade fusee"
        )
    if version < FORMAT and not writer:
        raise StoreError(
            f"store {path} has format {version}, older than this fusee's ({FORMAT}); "
            "open it once with an engine (not read-only) to upgrade it"
        )
    if version < FORMAT and not change:
        return False
    while version < FORMAT:
        steps = _MIGRATIONS.get(version)
        if steps is None:
            raise StoreError(
                f"store {path} has format {version}, which this fusee cannot upgrade; "
                "the file may be damaged: restore it from a backup"
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in steps:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        version += 1
    tables = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
    }
    missing = [name for name in ("journal", "runs", "meta", "commands") if name not in tables]
    if missing:
        raise _damaged(
            path,
            f"its {' and '.join(missing)} table{'s are' if len(missing) > 1 else ' is'} missing",
        )
    return True


def _check_empty(conn: sqlite3.Connection, path: Path) -> None:
    """Refuses a database without fusee's marks that is not empty (another's, or damaged)."""
    if conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]:
        raise _foreign(path)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    if pages - free > 1:
        # Pages in use that no table owns: not an empty database.
        raise _damaged(path, f"{pages - free - 1} of its pages belong to no table")


def _check_pages(conn: sqlite3.Connection, path: Path) -> None:
    """Reads every page (SQLite's quick_check): for a file shorter than its header says."""
    found = [text for (text,) in conn.execute("PRAGMA quick_check(3)")]
    if found != ["ok"]:
        # Its lines, without the heading SQLite gives them ("*** in database main ***").
        lines = [line for text in found for line in str(text).splitlines()]
        problems = "; ".join(line for line in lines if not line.startswith("***"))
        raise _damaged(path, f"it is shorter than its header says, and pages are lost ({problems})")


_SQLITE_HEADER: Final = b"SQLite format 3\x00"


def _inspect(path: Path) -> bool | None:
    """Looks at the store's files before SQLite does; raises `StoreError` if they are damaged.

    SQLite takes an empty file for a new database (and deletes a WAL beside
    it), so every run would be gone without a word. What fusee leaves is
    either no file at all or a whole database: `_create` makes it in one
    step. So an empty file, one without SQLite's header, or a WAL without
    its database is damage, refused here before SQLite opens anything.

    Returns:
        None when there is no database file (a new store), else whether the
        file is shorter than its header says: after a crash during a
        checkpoint that is repaired from the WAL, so its pages are checked.
    """
    wal = path.with_name(path.name + "-wal")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        if _size(wal):
            raise _damaged(
                path,
                f"the database file is missing, but its write-ahead log {wal.name} is there "
                f"({_size(wal):,} bytes of recent writes)",
            ) from None
        return None
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror}; check its permissions") from e
    if size == 0:
        beside = f", beside a write-ahead log of {_size(wal):,} bytes" if _size(wal) else ""
        raise _damaged(path, f"it is empty (0 bytes){beside}")
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror}; check its permissions") from e
    if len(header) < 100 or not header.startswith(_SQLITE_HEADER):
        raise _not_a_database(path)
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise _damaged(path, f"its header gives a page size of {page_size}")
    pages = int.from_bytes(header[28:32], "big")
    # The header's page count holds only when it was written with the change
    # counter (bytes 24-27 equal bytes 92-95); SQLite then relies on it.
    counted = header[24:28] == header[92:96] and pages > 0
    return size % page_size != 0 or (counted and size < pages * page_size)


def _size(path: Path) -> int:
    """A file's size, 0 when it is missing."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _create(path: Path, *, fsync: bool) -> None:
    """Creates a store at ``path`` in one step: a whole database appears, or nothing.

    Built beside it under a temporary name, then linked into place, which
    fails if another process made one meanwhile (that one is used). A crash
    leaves no file, or a whole store: never an empty file, which `_inspect`
    takes for damage.
    """
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute(f"PRAGMA synchronous = {'FULL' if fsync else 'OFF'}")
                # The default, stated: `_lock` on Windows relies on pages this large.
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute("COMMIT")
                # Kept in the file's header: every later connection uses the WAL.
                conn.execute("PRAGMA journal_mode = WAL")
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise _store_error(e, path, "creating") from e
        try:
            if fsync:
                with tmp.open("rb") as f:
                    os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return  # made by another process meanwhile: that one is the store
            if fsync and sys.platform != "win32":
                # The new name is durable once its directory is (POSIX).
                dir_fd = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        except OSError as e:
            raise StoreError(
                f"cannot create {path}: {e.strerror}; check the directory's permissions and "
                "that its file system supports hard links"
            ) from e
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def _not_a_database(path: Path) -> StoreError:
    return StoreError(
        f"{path} is not an SQLite database (it does not start with SQLite's header): if it "
        "was a fusee store it is damaged; restore it from a backup, or move it aside to "
        "start an empty store there"
    )


def _header(conn: sqlite3.Connection) -> tuple[int, int]:
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    return int(app), int(version)


def _foreign(path: Path) -> StoreError:
    return StoreError(
        f"{path} is an SQLite database but not a fusee store; move it away or pass "
        "another directory"
    )


def _counters(conn: sqlite3.Connection, path: Path) -> tuple[int, int]:
    """Returns the highest LSN stored and the reserved run-number count."""
    last_lsn = conn.execute("SELECT coalesce(max(lsn), 0) FROM journal").fetchone()[0]
    found = conn.execute("SELECT value FROM meta WHERE key = 'run_reserved'").fetchone()
    if found is None or type(found[0]) is not int or type(last_lsn) is not int:
        what = (
            "its meta table has no 'run_reserved' row (the count of run numbers handed out)"
            if found is None or type(found[0]) is not int
            else f"its highest LSN reads as {last_lsn!r}"
        )
        raise _damaged(path, what)
    return last_lsn, found[0]


def _damaged(path: Path, what: str) -> StoreError:
    """The error for a store file that must not be used as it is: no run may be lost silently."""
    return StoreError(
        f"{path} is damaged: {what}; restore it (with any {path.name}-wal beside it) from a "
        "backup, or move them aside to start an empty store there"
    )


def _no_journal(id: str, run: int, path: Path) -> CorruptRecord:
    return CorruptRecord(
        f"run {id!r} (run {run}) has a row in {path} but no journal records: its journal is "
        "lost or damaged; the other runs are not affected (`fusee check` lists every damaged "
        f"run): restore {path} from a backup to read this one again"
    )


def _code(e: BaseException) -> int:
    """The SQLite primary result code of ``e``, 0 when it has none."""
    return (getattr(e, "sqlite_errorcode", None) or 0) & 0xFF


def _fails_every_write(e: Exception) -> bool:
    """Whether ``e`` comes from the database's state, not from one write's values.

    Retrying such a transaction's writes one by one would only fail each again
    (and wait out a lock once per write).
    """
    return _code(e) in (_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB)


def _store_error(e: sqlite3.Error, path: Path, doing: str) -> StoreError:
    code = _code(e)
    if code in (_BUSY, _LOCKED):
        text = (
            f"another process holds the store {path} (it stayed locked past the busy "
            "timeout); stop that process, or give this one another directory"
        )
    elif code == _FULL:
        text = (
            f"the disk holding {path} is full: nothing of this write was stored; free some "
            "space (the store takes writes again as soon as there is room)"
        )
    elif code == _READONLY:
        text = f"{path} cannot be written (read-only file or file system); check its permissions"
    elif code == _NOTADB:
        return _not_a_database(path)
    elif code == _CORRUPT:
        text = f"{path} is damaged ({e}); restore it from a backup"
    elif code == _CONSTRAINT and "journal.lsn" in str(e):
        text = (
            f"{path} already holds an LSN being appended: another process writes this "
            "store; only one engine may write a store directory"
        )
    elif code in (_CANTOPEN, _IOERR):
        text = f"{doing} {path} failed ({e}); check the path, its permissions and the disk"
    else:
        text = f"{doing} {path} failed: {e}"
    return StoreError(text)


def _read_many(
    conn: sqlite3.Connection, fns: builtins.list[Callable[[sqlite3.Connection], Any]], path: Path
) -> builtins.list[Any]:
    """Each read's result, or the error it raised: one read's damage is its own."""
    conn.execute("BEGIN")  # one snapshot for every query below
    results: builtins.list[Any] = []
    for fn in fns:
        try:
            results.append(fn(conn))
        except FuseeError as e:  # NotFound, CorruptRecord
            results.append(e)
        except sqlite3.Error as e:
            error = _store_error(e, path, "reading")
            error.__cause__ = e
            results.append(error)
    return results


def _end_read(conn: sqlite3.Connection) -> None:
    """Ends a read's snapshot (a read changes nothing: rolling back is ending)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _roll_back(conn: sqlite3.Connection) -> None:
    """Rolls back a failed transaction; the error that got here is the one to report."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _close(conn: sqlite3.Connection, path: Path) -> None:
    """Closes a connection; a failure is logged, as nothing is left to tell."""
    try:
        conn.close()
    except sqlite3.Error as e:
        log.warning("closing %s failed: %s", path, e)


def _load(
    conn: sqlite3.Connection, id: str, run: int | None, after_lsn: int, path: Path
) -> _Loaded:
    found = conn.execute("SELECT run FROM runs WHERE id = ?", (id,)).fetchone()
    row_run: int | None = found[0] if found is not None else None
    if run is None:
        run = row_run
        if run is None:
            run = conn.execute("SELECT max(run) FROM journal WHERE id = ?", (id,)).fetchone()[0]
            if run is None:
                raise _not_found(id)
    records: builtins.list[tuple[int, bytes]] = conn.execute(
        "SELECT lsn, data FROM journal WHERE id = ? AND run = ? AND lsn > ? ORDER BY lsn",
        (id, run, after_lsn),
    ).fetchall()
    if not records:
        # Nothing after ``after_lsn`` is an answer; nothing at all is not.
        has_run = (
            after_lsn > 0
            and conn.execute(
                "SELECT 1 FROM journal WHERE id = ? AND run = ? LIMIT 1", (id, run)
            ).fetchone()
        )
        if not has_run:
            if run == row_run:
                raise _no_journal(id, run, path)
            known = (
                row_run is not None
                or conn.execute("SELECT 1 FROM journal WHERE id = ? LIMIT 1", (id,)).fetchone()
            )
            raise _not_found(id, run if known else None)
    for lsn, data in records:
        if type(data) is not bytes:
            raise CorruptRecord(
                f"the journal of run {id!r} (run {run}) in {path} has a damaged record at LSN "
                f"{lsn}: it holds {type(data).__name__}, not bytes; the other runs are not "
                f"affected (`fusee check` lists every damaged run): restore {path} from a "
                "backup to read this one again"
            )
    return records


def _row(values: _SqlRow, path: Path) -> RunRow:
    """The `RunRow` of a ``runs`` row; raises `CorruptRecord` naming the run if it is damaged."""
    id, run, workflow, status, started_ms, finished_ms, wake_ms, attributes, parent = values
    problem = _row_problem(values)
    if problem is None:
        try:
            return RunRow(
                id,
                run,
                workflow,
                status,
                started_ms,
                finished_ms,
                wake_ms,
                _unpack_attributes(attributes),
                parent,
            )
        except (msgpack.UnpackException, ValueError, TypeError) as e:
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            problem = f"its search attributes do not decode ({why})"
    raise CorruptRecord(
        f"the row of run {id!r} (run {run!r}) in {path} is damaged: {problem}; the other runs "
        f"are not affected (`fusee check` lists every damaged run): restore {path} from a "
        "backup to read this one again"
    )


# What each column of a `runs` row holds, in `_ROW_COLUMNS` order (None: may be NULL).
_COLUMN_TYPES: Final = (
    ("id", str, False),
    ("run", int, False),
    ("workflow", str, False),
    ("status", str, False),
    ("started_ms", int, False),
    ("finished_ms", int, True),
    ("wake_ms", int, True),
    ("attributes", bytes, True),
    ("parent", str, True),
)


def _row_problem(values: _SqlRow) -> str | None:
    for (name, kind, nullable), value in zip(_COLUMN_TYPES, values, strict=True):
        if type(value) is not kind and not (nullable and value is None):
            return f"its {name} is {value!r}, which fusee never writes there"
    status = values[3]
    if status not in RUN_STATUSES:
        return f"its status {status!r} is not one of {', '.join(sorted(RUN_STATUSES))}"
    return None


def _rows(
    conn: sqlite3.Connection, sql: str, params: Sequence[object], path: Path
) -> Iterator[RunRow]:
    """The rows ``sql`` selects, without the damaged ones: a listing must not die of one row.

    Each damaged row skipped is logged (a warning on the ``fusee`` logger,
    naming the run); `fusee check` reports them all.
    """
    for values in conn.execute(sql, params):
        try:
            yield _row(values, path)
        except CorruptRecord as e:
            log.warning("skipped a damaged run row: %s", e)


def _get(conn: sqlite3.Connection, id: str, path: Path) -> RunRow | None:
    found = conn.execute(f"SELECT {_ROW_COLUMNS} FROM runs WHERE id = ?", (id,)).fetchone()
    return None if found is None else _row(found, path)


def _list(
    conn: sqlite3.Connection,
    status: str | None,
    workflow: str | None,
    attributes: Mapping[str, Any] | None,
    limit: int | None,
    page: _Page,
    path: Path,
) -> builtins.list[RunRow]:
    where: builtins.list[str] = []
    params: builtins.list[object] = []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if workflow is not None:
        where.append("workflow = ?")
        params.append(workflow)
    if page.after is not None:
        where.append(f"(started_ms, id) {'<' if page.newest_first else '>'} (?, ?)")
        params.extend(page.after)
    if page.started_from_ms is not None:
        where.append("started_ms >= ?")
        params.append(page.started_from_ms)
    if page.started_to_ms is not None:
        where.append("started_ms <= ?")
        params.append(page.started_to_ms)
    sql = f"SELECT {_ROW_COLUMNS} FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY started_ms DESC, id DESC" if page.newest_first else " ORDER BY started_ms, id"
    rows: builtins.list[RunRow] = []
    if limit == 0:
        return rows
    # No LIMIT in the SQL: a damaged row skipped, or one the attributes (msgpack
    # blobs SQLite cannot look into) do not match, does not count. The rows are
    # stepped through lazily, so no more are read than the page needs.
    for row in _rows(conn, sql, params, path):
        if attributes is None or _matches(row, attributes):
            rows.append(row)
            if len(rows) == limit:
                break
    return rows


@dataclass(frozen=True, slots=True)
class _Page:
    """A listing's order, cursor and start-time bounds (`SqliteStore.list`)."""

    newest_first: bool
    after: tuple[int, str] | None
    started_from_ms: int | None
    started_to_ms: int | None


def _unfinished(conn: sqlite3.Connection, path: Path) -> builtins.list[RunRow]:
    marks = ", ".join("?" * len(UNFINISHED_STATUSES))
    sql = f"SELECT {_ROW_COLUMNS} FROM runs WHERE status IN ({marks}) ORDER BY started_ms, id"
    return builtins.list(_rows(conn, sql, sorted(UNFINISHED_STATUSES), path))
