"""The SQLite store: the embedded default, one WAL-mode file ``fusee.db`` per directory.

Schema, format 4 (the format is ``PRAGMA user_version``; ``PRAGMA
application_id`` = `APPLICATION_ID` marks the file as a fusee store)::

    journal(lsn INTEGER PRIMARY KEY, id TEXT, run INTEGER, data BLOB)
        index (id, run, lsn)                      -- load(), by run then LSN
    runs(id TEXT PRIMARY KEY, run, workflow, status, started_ms, finished_ms,
         wake_ms, attributes BLOB, parent, version, error)  -- one per id: its latest run
        index (started_ms, id), (status, started_ms, id), (workflow, started_ms, id)
    meta(key TEXT PRIMARY KEY, value INTEGER)
        'run_reserved': run numbers up to it may have been handed out
    commands(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, kind, run_id,
             payload BLOB, dedup, created_ms, attempts, answered_ms, ok, answer BLOB)
        index (seq) of unanswered commands        -- the inbox (format 2)
    queue_items(seq INTEGER PRIMARY KEY AUTOINCREMENT, queue, id, run, workflow,
                input BLOB, key, priority, not_before_ms, state, admitted_ms, origin BLOB)
        unique index (id) of items not done       -- queued starts (format 3)
    schedules(name TEXT PRIMARY KEY, workflow, spec, paused, removed, last_tick_ms,
              done_tick_ms, buffered_ms, last_run, next_ms,
              input, dynamic, ticked_ms)          -- schedules (format 3; 4 adds the last three)

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

Its parts: `fusee.store._sqlite_schema` (format, statements, migrations),
`fusee.store._sqlite_open` (inspecting, creating and checking the file; the
errors), `fusee.store._sqlite_rows` (reading rows, damage checks) and
`fusee.store._sqlite_writer` (the writer thread and its lock on the file).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeAlias, TypeVar

from fusee.errors import StoreError
from fusee.store._base import (
    Answer,
    Command,
    Entry,
    RunRow,
    _check_batch,
    _check_command,
    _check_durability,
    _check_list_args,
    _normalize_filter,
    _now_ms,
)
from fusee.store._lock import try_lock, unlock
from fusee.store._queues import QueueItem
from fusee.store._retention import SqliteDeletes
from fusee.store._sqlite_mark import Mark, behind_error, read_mark, read_store_id
from fusee.store._sqlite_open import (
    _check_format,
    _check_pages,
    _close,
    _counters,
    _create,
    _end_read,
    _inspect,
    _store_error,
)
from fusee.store._sqlite_queues import SqliteQueues, write_items
from fusee.store._sqlite_rows import (
    _get,
    _list,
    _load,
    _Page,
    _read_many,
    _SqlRow,
    _unfinished,
)
from fusee.store._sqlite_schedules import SqliteSchedules
from fusee.store._sqlite_schema import (
    _COMMAND_COLUMNS,
    _INSERT_COMMAND,
    APPLICATION_ID,
    FILENAME,
    FORMAT,
    PAGE_SIZE,
)
from fusee.store._sqlite_writer import _SqliteWriter, _Write

__all__ = ["APPLICATION_ID", "FILENAME", "FORMAT", "PAGE_SIZE", "SqliteStore", "is_served"]

# How often `wait_commands` looks at the files for another process's commit.
_POLL_S: Final = 0.01
# The bytes of the WAL index's header that change with every commit (its
# first copy: version, change counter, mxFrame, page count, checksums, salts).
_SHM_HEADER: Final = 48


# Run numbers reserved per meta write: a crash wastes at most this many.
_RUN_BLOCK: Final = 128

# How long commits on the loop's thread may hold the loop before it runs its
# other work (`append`): a request served beside a long sequential run waits
# about this much more. A yield paid at every commit costs a sequential run a
# large share of its CPU under fsync; paid every 2 ms, a small one
# (bench/NOTES.md has the figures).
_HOLD_S: Final = 0.002


_BatchedRead: TypeAlias = tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]
_T = TypeVar("_T")

log = logging.getLogger("fusee")


class SqliteStore(SqliteQueues, _SqliteWriter, SqliteSchedules, SqliteDeletes):
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
        accept_loss: Open a store that is behind its high-water mark (its
            write-ahead log lost acknowledged records, see `behind`): the
            loss is logged at WARNING and recorded in the store's ``meta``
            table, and the mark starts again from what the store holds.

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
        accept_loss: bool = False,
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
        # The writer's connection while its thread runs, and who holds it.
        self._conn: sqlite3.Connection | None = None
        self._conn_lock = threading.Lock()
        self._conn_waits = True
        self._yielded = 0.0  # `time.monotonic()` when a commit on the loop's thread last yielded
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
        self._reads = 0  # trips to the reader thread asked for and not answered yet
        self._run_next = 1
        self._run_reserved = 0
        self._run_lock = asyncio.Lock()
        # For tests: committed write transactions, and the connection's
        # `PRAGMA synchronous` as read back after setting it.
        self._transactions = 0
        self._synchronous: int | None = None
        self._fail_next: Exception | None = None
        self._setup_next: Callable[[sqlite3.Connection], object] | None = None
        self._accept_loss = accept_loss
        # The high-water mark (`_sqlite_mark`), moved by the writer after each
        # durable commit; and the (held, marked) LSNs of a loss being accepted.
        self._mark: Mark | None = None
        self._loss: tuple[int, int] | None = None
        self._behind_lsns: tuple[int, int] | None = None

    @property
    def path(self) -> Path:
        """The database file: ``DIRECTORY/fusee.db``.

        Example:
            >>> SqliteStore("data").path.as_posix()
            'data/fusee.db'
        """
        return self._path

    @property
    def behind(self) -> tuple[int, int] | None:
        """(LSN held, LSN acknowledged) when the store is behind its high-water mark, else None.

        A writer's open refuses such a store (unless ``accept_loss``); a
        read-only one opens and says so here (`fusee check` reports it).

        Example:
            >>> SqliteStore("data").behind is None
            True
        """
        return self._behind_lsns

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
                # The mark before the store: an engine writing meanwhile moves
                # the mark only past what a later read holds (no false alarm).
                mark = await loop.run_in_executor(self._reader, read_mark, self._path)
                last_lsn, reserved = await loop.run_in_executor(self._reader, self._open_reader)
                self._behind_lsns = await loop.run_in_executor(
                    self._reader, self._behind_mark, last_lsn, mark
                )
            else:
                await loop.run_in_executor(self._reader, self._prepare_writer)
                mark = await loop.run_in_executor(self._reader, read_mark, self._path)
                # Checked through a read-only connection before a writable one
                # opens: refusing a damaged file then changes nothing in it (a
                # writable connection's close would fold the WAL into it).
                held, _ = await loop.run_in_executor(self._reader, self._open_reader)
                self._behind_lsns = await loop.run_in_executor(
                    self._reader, self._behind_mark, held, mark
                )
                self._loss = None
                if self._behind_lsns is not None:
                    if not self._accept_loss:
                        raise behind_error(self._path, *self._behind_lsns)
                    self._loss = self._behind_lsns
                    log.warning(
                        "%s: opened accepting the loss of acknowledged records %d to %d (its "
                        "write-ahead log lost them); the loss is recorded in its meta table",
                        self._path,
                        self._behind_lsns[0] + 1,
                        self._behind_lsns[1],
                    )
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

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        """Stores ``entries`` and ``runs`` in one transaction, or nothing when it raises.

        Appends queued while the writer commits go to disk together in its
        next transaction; each returns once that transaction is committed
        (and, under ``durability="fsync"``, synced). Cancelling the caller
        does not cancel the write. When one fails, those called before its
        failure was reported fail too (a journal never has a hole).

        Args:
            entries: Records with increasing LSNs above every LSN appended before.
            runs: Rows that replace the rows of their ids, in order.
            items: Queue items that replace those of their seqs, in the same
                transaction (the engine's own admissions).
            forget: Seqs of queue items deleted in it.

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
        if not entries and not runs and not items and not forget:
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
                r.version,
                r.error,
            )
            for r, blob in zip(runs, packed, strict=True)
        ]
        fail, self._fail_next = self._fail_next, None
        setup, self._setup_next = self._setup_next, None
        calls = (
            (functools.partial(write_items, items=items, forget=forget),) if items or forget else ()
        )
        write = self._submit(
            entries, rows, None, fail, last if entries else 0, setup, calls=calls, queued=False
        )
        pending = self._pending
        for r in runs:
            pending[r.id] = (r, write.done)
        if self._write_here(write):
            # Committed without leaving the loop's turn. A sequential run
            # whose every step commits here would hold the loop for its
            # whole length: it lets the loop's other work in once it has
            # held it for `_HOLD_S`.
            if time.monotonic() - self._yielded >= _HOLD_S:
                await asyncio.sleep(0)
                self._yielded = time.monotonic()
        else:
            self._queue.put(write)
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
            self._reads += 1
            self._loop.call_soon(self._send_batch, batch)
        batch.append((fn, fut))
        return fut

    def _send_batch(self, batch: builtins.list[_BatchedRead]) -> None:
        assert self._loop is not None
        self._batch = None
        fns = [fn for fn, _ in batch]

        def settle(done: asyncio.Future[builtins.list[Any]]) -> None:
            self._reads -= 1
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

    def fail_next_append(self, exc: Exception) -> None:
        """Fault-injection hook for tests: the next append raises ``exc`` inside its transaction.

        The transaction is rolled back and the append fails with the
        `StoreError` a real failure would give (``exc`` an ``sqlite3.Error``:
        its translation; else ``exc`` named), so tests see what a failed
        durable write does. One call fails one append.

        Example:
            >>> import asyncio, sqlite3, tempfile
            >>> from fusee.store import Entry
            >>> async def demo(directory: str) -> int:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     store.fail_next_append(sqlite3.OperationalError("injected"))
            ...     try:
            ...         await store.append([Entry(1, "a", 1, b"x")])
            ...     except StoreError:
            ...         pass
            ...     await store.close()
            ...     return store.last_lsn
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            0
        """
        self._fail_next = exc

    def before_next_append(self, fn: Callable[[sqlite3.Connection], object]) -> None:
        """Fault-injection hook for tests: the writer thread calls ``fn`` before the next append.

        ``fn`` gets the writer's connection, for example to set ``PRAGMA
        max_page_count``, which makes SQLite's disk full.

        Example:
            >>> import asyncio, tempfile
            >>> from fusee.store import Entry
            >>> async def demo(directory: str) -> int:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     store.before_next_append(lambda conn: conn.execute("SELECT 1"))
            ...     await store.append([Entry(1, "a", 1, b"x")])
            ...     await store.close()
            ...     return store.last_lsn
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            1
        """
        self._setup_next = fn

    @property
    def reading(self) -> bool:
        """For tests: whether a read is on its way to the reader thread, or under way there.

        `fusee.testing.TestEngine` waits for it to settle: the caller waiting
        for the read (a signal loading a parked run) is work no engine task
        holds, and the read takes real time however the virtual clock moves.

        Example:
            >>> SqliteStore("data").reading
            False
        """
        return self._reads > 0

    @property
    def transactions(self) -> int:
        """For tests: how many write transactions this store object committed since it was made.

        Example:
            >>> SqliteStore("data").transactions
            0
        """
        return self._transactions

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
        calls: tuple[Callable[[sqlite3.Connection], object], ...] = (),
        *,
        queued: bool = True,
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
            calls,
        )
        if queued:
            self._queue.put(write)
        return write

    def _check_open(self) -> None:
        if self._state != "open":
            raise StoreError(f"the store {self._path} is closed; await store.open() first")

    async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        await self._after_writes()
        assert self._loop is not None
        self._reads += 1
        try:
            return await self._loop.run_in_executor(self._reader, self._run_read, fn)
        finally:
            self._reads -= 1

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

    def _behind_mark(self, held: int, mark: tuple[int, int] | None) -> tuple[int, int] | None:
        """(held, marked) if the store holds less than its ``mark`` says it made durable."""
        if mark is None or self._rconn is None:
            return None
        marked_id, marked = mark
        store_id = read_store_id(self._rconn)
        if store_id is not None and marked_id != store_id:
            # Another store's mark (a database put in place of this one):
            # the writer's open starts a mark of its own. (A store with no
            # identity lost it with its WAL: the mark is its own.)
            log.warning("%s: its high-water mark belongs to another store; not used", self._path)
            return None
        return (held, marked) if marked > held else None

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
