"""The memory store: journals and run rows in Python dicts, for tests and demos.

The test host simulates a crash by dropping everything but this object and
opening it again, so the rule is: what an append stored outlives ``close``
and ``open``, and an append stores all of its batch or, when it raises,
nothing. Every append is "durable" the moment it returns.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import replace
from operator import itemgetter
from typing import Any

from fusee._status import RunStatus
from fusee.errors import CorruptRecord, StoreError
from fusee.store._base import (
    UNFINISHED_STATUSES,
    Answer,
    Command,
    Entry,
    RunRow,
    _check_batch,
    _check_command,
    _check_list_args,
    _in_page,
    _matches,
    _normalize_filter,
    _not_found,
    _now_ms,
    _queued,
    _unpack_attributes,
)
from fusee.store._queues import MemoryQueues, QueueItem
from fusee.store._retention import MemoryDeletes
from fusee.store._schedules import MemorySchedules

__all__ = ["MemoryStore"]

_lsn_of = itemgetter(0)


class MemoryStore(MemoryQueues, MemorySchedules, MemoryDeletes):
    """A `fusee.store.Store` in memory; ``close`` then ``open`` keeps the data.

    Example:
        >>> import asyncio
        >>> from fusee.store import Entry, RunRow
        >>> async def demo() -> tuple[list[tuple[int, bytes]], int]:
        ...     store = MemoryStore()
        ...     await store.open()
        ...     await store.append([Entry(1, "a", 1, b"start")],
        ...                        [RunRow("a", 1, "wf", "running", 0)])
        ...     await store.close()
        ...     await store.open()          # a "crash": the data is still there
        ...     return await store.load("a"), store.last_lsn
        >>> asyncio.run(demo())
        ([(1, b'start')], 1)
    """

    def __init__(self) -> None:
        super().__init__()
        self._journals: dict[tuple[str, int], builtins.list[tuple[int, bytes]]] = {}
        # The highest run with records, per id: `load` falls back to it for an
        # id whose row was never written.
        self._latest_run: dict[str, int] = {}
        self._rows: dict[str, RunRow] = {}
        self._last_lsn = 0
        self._runs_used = 0
        self._open = False
        self._fail_next: StoreError | None = None
        # The inbox, in posting order (dicts keep it), with each command's answer.
        self._commands: dict[str, tuple[Command, Answer | None]] = {}
        # Commands taken since the last `open`: an engine's next life takes
        # again those it had not answered.
        self._taken: set[str] = set()
        self._posted: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    async def open(self) -> None:
        """Opens the store; on an open store (a crashed engine's) it reopens it.

        Example:
            >>> import asyncio
            >>> store = MemoryStore()
            >>> asyncio.run(store.open())
            >>> store.last_lsn
            0
        """
        self._open = True
        self._taken = set()

    async def close(self) -> None:
        """Closes the store, keeping its data for the next `open`.

        Example:
            >>> import asyncio
            >>> asyncio.run(MemoryStore().close())   # closing what is closed is harmless
        """
        self._open = False

    @property
    def last_lsn(self) -> int:
        """The highest LSN stored, 0 when empty.

        Example:
            >>> MemoryStore().last_lsn
            0
        """
        return self._last_lsn

    def fail_next_append(self, exc: StoreError) -> None:
        """Test hook: the next valid `append` raises ``exc`` and stores nothing.

        Lets engine tests see what a failed durable write (disk full, a lock)
        does to runs waiting on it. One call fails one append.

        Example:
            >>> import asyncio
            >>> from fusee.store import Entry
            >>> async def demo() -> int:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     store.fail_next_append(StoreError("disk full"))
            ...     try:
            ...         await store.append([Entry(1, "a", 1, b"x")])
            ...     except StoreError:
            ...         pass
            ...     return store.last_lsn
            >>> asyncio.run(demo())
            0
        """
        self._fail_next = exc

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        """Stores ``entries``, ``runs`` and queue item changes together, or nothing when it raises.

        Args:
            entries: Records with increasing LSNs above `last_lsn`.
            runs: Rows that replace the rows of their ids, in order.
            items: Queue items that replace those of their seqs (an engine's
                own admissions, see `fusee.store.Store.append`).
            forget: Seqs of queue items deleted.

        Raises:
            ValueError: LSNs that do not increase past `last_lsn`.
            TypeError: Record data that is not bytes, or attributes msgpack
                cannot encode.
            StoreError: The store is closed, or `fail_next_append` asked for it.

        Example:
            >>> import asyncio
            >>> from fusee.store import Entry
            >>> async def demo() -> int:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     await store.append([Entry(1, "a", 1, b"x"), Entry(2, "b", 1, b"y")])
            ...     return store.last_lsn
            >>> asyncio.run(demo())
            2
        """
        self._check_open()
        last, packed = _check_batch(entries, runs, self._last_lsn)
        if self._fail_next is not None:
            exc, self._fail_next = self._fail_next, None
            raise exc
        journals = self._journals
        for e in entries:
            key = (e.id, e.run)
            journal = journals.get(key)
            if journal is None:
                journal = journals[key] = []
                if e.run > self._latest_run.get(e.id, 0):
                    self._latest_run[e.id] = e.run
            journal.append((e.lsn, e.data))
        self._last_lsn = last
        for row, blob in zip(runs, packed, strict=True):
            if blob is not None:
                # Through msgpack, so rows read back as an SQLite store's would
                # (tuples as lists): tests pass or fail alike on both stores.
                row = RunRow(
                    row.id,
                    row.run,
                    row.workflow,
                    row.status,
                    row.started_ms,
                    row.finished_ms,
                    row.wake_ms,
                    _unpack_attributes(blob),
                    row.parent,
                    row.version,
                    row.error,
                )
            self._rows[row.id] = row
        if items or forget:
            self._write_items(items, forget)

    async def load(
        self, id: str, run: int | None = None, *, after_lsn: int = 0
    ) -> builtins.list[tuple[int, bytes]]:
        """Returns a run's records after ``after_lsn`` as ``(lsn, data)`` in LSN order.

        Args:
            id: The workflow id.
            run: The run number; None for the id's latest run.
            after_lsn: Only records with a higher LSN are returned.

        Raises:
            NotFound: No such id, no records for that run of it, or a queued
                run (it has no journal until its queue admits it).
            CorruptRecord: The run has a row but no records (a row appended
                alone); the message names the run.

        Example:
            >>> import asyncio
            >>> from fusee.store import Entry
            >>> async def demo() -> list[tuple[int, bytes]]:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     await store.append([Entry(1, "a", 1, b"x"), Entry(2, "a", 1, b"y")])
            ...     return await store.load("a", after_lsn=1)
            >>> asyncio.run(demo())
            [(2, b'y')]
        """
        self._check_open()
        row = self._rows.get(id)
        if run is None:
            run = row.run if row is not None else self._latest_run.get(id)
            if run is None:
                raise _not_found(id)
        journal = self._journals.get((id, run))
        if journal is None:
            if row is not None and row.run == run and row.status == RunStatus.QUEUED:
                raise _queued(id)
            if row is not None and row.run == run:
                # As in an SQLite store: a run is its journal, and a row
                # without one is a run that cannot be replayed.
                raise CorruptRecord(
                    f"run {id!r} (run {run}) has a row in this memory store but no journal "
                    "records; append a run's first record with its first row"
                )
            known = row is not None or id in self._latest_run
            raise _not_found(id, run if known else None)
        if after_lsn <= 0:
            return journal[:]
        return journal[bisect_right(journal, after_lsn, key=_lsn_of) :]

    async def get(self, id: str) -> RunRow | None:
        """Returns the row of ``id``, or None.

        Example:
            >>> import asyncio
            >>> async def demo() -> RunRow | None:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     return await store.get("nobody")
            >>> print(asyncio.run(demo()))
            None
        """
        self._check_open()
        return self._rows.get(id)

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

        Raises:
            ValueError: An unknown status, or a negative limit.

        Example:
            >>> import asyncio
            >>> from fusee.store import RunRow
            >>> async def demo() -> list[str]:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     await store.append([], [RunRow("b", 1, "wf", "running", 2),
            ...                             RunRow("a", 2, "wf", "completed", 1)])
            ...     return [r.id for r in await store.list(workflow="wf")]
            >>> asyncio.run(demo())
            ['a', 'b']
        """
        self._check_open()
        _check_list_args(status, limit, after)
        wanted = _normalize_filter(attributes)
        rows = [
            row
            for row in self._rows.values()
            if (status is None or row.status == status)
            and (workflow is None or row.workflow == workflow)
            and (wanted is None or _matches(row, wanted))
            and _in_page(row, newest_first, after, started_from_ms, started_to_ms)
        ]
        rows.sort(key=_started_then_id, reverse=newest_first)
        return rows if limit is None else rows[:limit]

    async def unfinished(self) -> builtins.list[RunRow]:
        """Returns the rows of runs that are running, suspended or paused.

        Example:
            >>> import asyncio
            >>> async def demo() -> list[RunRow]:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     return await store.unfinished()
            >>> asyncio.run(demo())
            []
        """
        self._check_open()
        rows = [row for row in self._rows.values() if row.status in UNFINISHED_STATUSES]
        rows.sort(key=_started_then_id)
        return rows

    async def next_run(self) -> int:
        """Returns a run number this store never gave out before: 1, 2, 3, ...

        Example:
            >>> import asyncio
            >>> async def demo() -> list[int]:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     return [await store.next_run(), await store.next_run()]
            >>> asyncio.run(demo())
            [1, 2]
        """
        self._check_open()
        self._runs_used += 1
        return self._runs_used

    async def post_command(self, command: Command) -> str:
        """Stores ``command`` in the inbox; returns its id (posting an id twice keeps one).

        Raises:
            ValueError: An unknown kind or an empty id.
            StoreError: The store is closed.

        Example:
            >>> import asyncio
            >>> from fusee.store import Command
            >>> async def demo() -> list[str]:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     await store.post_command(Command("c-1", "cancel", "order-1"))
            ...     return [c.id for c in await store.take_commands()]
            >>> asyncio.run(demo())
            ['c-1']
        """
        self._check_open()
        _check_command(command)
        if command.id not in self._commands:
            self._commands[command.id] = (command, None)
            posted = self._posted
            if posted is not None:
                loop, event = posted
                try:
                    running = asyncio.get_running_loop()
                except RuntimeError:
                    running = None
                if running is loop:
                    event.set()
                else:
                    loop.call_soon_threadsafe(event.set)
        return command.id

    async def take_commands(self, limit: int = 100) -> builtins.list[Command]:
        """The unanswered commands not taken since `open`, oldest first, each counted taken.

        Example:
            >>> import asyncio
            >>> from fusee.store import Command
            >>> async def demo() -> list[int]:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     await store.post_command(Command("c-1", "cancel", "order-1"))
            ...     first = await store.take_commands()
            ...     again = await store.take_commands()      # taken already
            ...     await store.close()
            ...     await store.open()                        # a new life takes it again
            ...     return [len(again), *(c.attempt for c in first + await store.take_commands())]
            >>> asyncio.run(demo())
            [0, 1, 2]
        """
        self._check_open()
        taken: builtins.list[Command] = []
        for id, (command, answer) in self._commands.items():
            if len(taken) >= limit:
                break
            if answer is not None or id in self._taken:
                continue
            command = replace(command, attempt=command.attempt + 1)
            self._commands[id] = (command, None)
            self._taken.add(id)
            taken.append(command)
        return taken

    async def wait_commands(self, timeout_s: float) -> None:
        """Returns once a command is posted (or at once if one waits), or after ``timeout_s``.

        Example:
            >>> import asyncio
            >>> async def demo() -> None:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     await store.wait_commands(0.01)
            >>> asyncio.run(demo())
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        if self._posted is None or self._posted[0] is not loop:
            self._posted = (loop, asyncio.Event())
        event = self._posted[1]
        if any(a is None and id not in self._taken for id, (_, a) in self._commands.items()):
            return
        event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)

    async def answer_command(self, id: str, ok: bool, payload: bytes) -> None:
        """Stores the answer to command ``id`` (an unknown id is ignored).

        Example:
            >>> import asyncio
            >>> from fusee.store import Command
            >>> async def demo() -> bool:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     await store.post_command(Command("c-1", "resume", "r-1"))
            ...     await store.answer_command("c-1", True, b"")
            ...     answer = await store.get_answer("c-1")
            ...     return answer is not None and answer.ok
            >>> asyncio.run(demo())
            True
        """
        self._check_open()
        found = self._commands.get(id)
        if found is not None and found[1] is None:
            self._commands[id] = (found[0], Answer(bool(ok), bytes(payload), _now_ms()))

    async def get_answer(self, id: str) -> Answer | None:
        """The answer to command ``id``, or None.

        Example:
            >>> import asyncio
            >>> async def demo() -> Answer | None:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     return await store.get_answer("nobody")
            >>> print(asyncio.run(demo()))
            None
        """
        self._check_open()
        found = self._commands.get(id)
        return None if found is None else found[1]

    async def forget_commands(self, answered_before_ms: int) -> int:
        """Deletes the commands answered before ``answered_before_ms``; returns how many.

        Example:
            >>> import asyncio
            >>> asyncio.run(MemoryStore().open())
        """
        self._check_open()
        old = [
            id
            for id, (_, answer) in self._commands.items()
            if answer is not None and answer.answered_ms < answered_before_ms
        ]
        for id in old:
            del self._commands[id]
        return len(old)

    def _check_open(self) -> None:
        if not self._open:
            raise StoreError("the memory store is closed; await store.open() before using it")


def _started_then_id(row: RunRow) -> tuple[int, str]:
    return (row.started_ms, row.id)
