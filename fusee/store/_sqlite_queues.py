"""The SQLite store's queue items: the ``queue_items`` table (format 3) and its admission.

`fusee.store.SqliteStore` inherits `SqliteQueues`. The rule: every change
to ``queue_items`` runs on the writer thread inside one transaction (a
function queued with the writer's other writes), so an admission reads the
items it counts and marks the ones it admits in the same transaction; one
engine writes a store, so nothing else changes them in between.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final, TypeVar

import msgpack

from fusee.errors import StoreError
from fusee.store._base import RunRow
from fusee.store._queues import (
    Admission,
    QueueItem,
    QueueLimits,
    forgettable,
    plan_admission,
)
from fusee.store._sqlite_rows import _ROWS_PER_INSERT, _insert_all
from fusee.store._sqlite_schema import _UPSERT_ROWS
from fusee.store._sqlite_writer import _Write

__all__ = ["SqliteQueues", "write_items"]

_T = TypeVar("_T")

_COLUMNS: Final = (
    "queue, id, run, workflow, input, key, priority, seq, not_before_ms, state, admitted_ms,"
    " origin, signals"
)
_ACTIVE: Final = f"SELECT {_COLUMNS} FROM queue_items WHERE id = ? AND state != 'done'"


_WRITE_ITEMS: Final = f"INSERT INTO queue_items ({_COLUMNS}) VALUES"
_ON_SEQ: Final = (
    " ON CONFLICT (seq) DO UPDATE SET queue = excluded.queue, id = excluded.id,"
    " run = excluded.run, workflow = excluded.workflow, input = excluded.input,"
    " key = excluded.key, priority = excluded.priority, not_before_ms = excluded.not_before_ms,"
    " state = excluded.state, admitted_ms = excluded.admitted_ms, origin = excluded.origin,"
    " signals = excluded.signals"
)


def write_items(
    conn: sqlite3.Connection, items: Sequence[QueueItem], forget: Sequence[int]
) -> None:
    """Stores an engine's queue item changes (`Store.append`'s ``items``) in its transaction.

    Deletions first, then the items in seq order: an older item of an id
    leaves the active states before a newer one of the same id enters them
    (the unique index allows one active item per id).
    """
    for start in range(0, len(forget), _ROWS_PER_INSERT):
        chunk = forget[start : start + _ROWS_PER_INSERT]
        conn.execute(f"DELETE FROM queue_items WHERE seq IN ({', '.join('?' * len(chunk))})", chunk)
    rows = [
        (
            i.queue,
            i.id,
            i.run,
            i.workflow,
            i.input,
            i.key,
            i.priority,
            i.seq,
            i.not_before_ms,
            i.state,
            i.admitted_ms,
            i.origin,
            msgpack.packb(list(i.signals), use_bin_type=True) if i.signals else None,
        )
        for i in sorted(items, key=_seq_of)
    ]
    _insert_all(conn, _WRITE_ITEMS, rows, _ON_SEQ)


def _seq_of(item: QueueItem) -> int:
    return item.seq


def _item(values: tuple[Any, ...]) -> QueueItem:
    q, id, run, wf, input, key, priority, seq, not_before, state, admitted, origin, sigs = values
    signals = tuple(msgpack.unpackb(sigs)) if sigs else ()
    return QueueItem(
        q,
        id,
        run,
        wf,
        bytes(input),
        key,
        priority,
        seq,
        not_before,
        state,
        admitted,
        bytes(origin),
        signals,
    )


class SqliteQueues:
    """`Store`'s queue methods on SQLite (see `fusee.store._queues`).

    Example:
        >>> import asyncio, tempfile
        >>> from fusee.store import RunRow, SqliteStore
        >>> async def demo(directory: str) -> list[str]:
        ...     store = SqliteStore(directory, durability="none")
        ...     await store.open()
        ...     try:
        ...         await store.enqueue(QueueItem("q", "a", 1, "wf", b""),
        ...                             RunRow("a", 1, "wf", "queued", 0))
        ...         admission = await store.admit(QueueLimits("q", concurrency=1), 0)
        ...         return [i.id for i in admission.items]
        ...     finally:
        ...         await store.close()
        >>> with tempfile.TemporaryDirectory() as d:
        ...     asyncio.run(demo(d))
        ['a']
    """

    _check_writable: Callable[[], None]
    _submit: Callable[..., _Write]
    _read: Callable[[Callable[[sqlite3.Connection], Any]], Any]

    async def _in_writer(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        self._check_writable()
        box: list[_T] = []

        def call(conn: sqlite3.Connection) -> None:
            # A transaction retried alone after its group failed runs it again.
            box[:] = [fn(conn)]

        write = self._submit((), [], None, None, 0, None, (), calls=(call,))
        error = await write.answer
        if error is not None:
            raise error
        return box[0]

    async def enqueue(self, item: QueueItem, row: RunRow) -> QueueItem | None:
        """Stores queued ``item`` and ``row`` in one transaction; None if ``id`` has an item."""

        def write(conn: sqlite3.Connection) -> QueueItem | None:
            if conn.execute(_ACTIVE, (item.id,)).fetchone() is not None:
                return None
            cur = conn.execute(
                "INSERT INTO queue_items (queue, id, run, workflow, input, key, priority,"
                " not_before_ms, state, origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?)",
                (
                    item.queue,
                    item.id,
                    item.run,
                    item.workflow,
                    item.input,
                    item.key,
                    item.priority,
                    item.not_before_ms,
                    item.origin,
                ),
            )
            conn.execute(
                _UPSERT_ROWS + " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                (
                    row.id,
                    row.run,
                    row.workflow,
                    row.status,
                    row.started_ms,
                    None,
                    row.wake_ms,
                    None,
                    row.parent,
                    row.version,
                ),
            )
            seq = cur.lastrowid
            assert seq is not None
            return QueueItem(
                item.queue,
                item.id,
                item.run,
                item.workflow,
                item.input,
                item.key,
                item.priority,
                seq,
                item.not_before_ms,
                "queued",
                None,
                item.origin,
            )

        return await self._in_writer(write)

    async def debounce_queued(self, id: str, input: bytes, not_before_ms: int) -> bool:
        """Replaces queued ``id``'s input and admission time; False if it is not queued."""

        def write(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE queue_items SET input = ?, not_before_ms = ?"
                " WHERE id = ? AND state = 'queued'",
                (input, not_before_ms, id),
            )
            return cur.rowcount > 0

        return await self._in_writer(write)

    async def start_queued(self, id: str, now_ms: int) -> str | None:
        """Lets queued ``id`` in from ``now_ms`` on; its queue, or None if it is not queued."""

        def write(conn: sqlite3.Connection) -> str | None:
            found = conn.execute(
                "UPDATE queue_items SET not_before_ms = min(not_before_ms, ?)"
                " WHERE id = ? AND state = 'queued' RETURNING queue",
                (now_ms, id),
            ).fetchone()
            if found is None:
                return None
            conn.execute("UPDATE runs SET wake_ms = NULL WHERE id = ? AND status = 'queued'", (id,))
            return str(found[0])

        return await self._in_writer(write)

    async def signal_queued(self, id: str, signal: bytes) -> bool:
        """Adds ``signal`` to queued ``id``'s signals; False if it is not queued."""

        def write(conn: sqlite3.Connection) -> bool:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM queue_items WHERE id = ? AND state = 'queued'", (id,)
            ).fetchone()
            if found is None:
                return False
            item = _item(found)
            packed = msgpack.packb([*item.signals, signal], use_bin_type=True)
            conn.execute("UPDATE queue_items SET signals = ? WHERE seq = ?", (packed, item.seq))
            return True

        return await self._in_writer(write)

    async def admit(
        self,
        limits: QueueLimits,
        now_ms: int,
        runnable: Callable[[QueueItem], bool] | None = None,
        released: Collection[str] = (),
    ) -> Admission:
        """Frees ``released``'s slots, then admits what ``limits`` allow, in one transaction."""

        def write(conn: sqlite3.Connection) -> Admission:
            if released:
                conn.executemany(
                    "UPDATE queue_items SET state = 'done' WHERE id = ? AND state = 'admitted'",
                    [(id,) for id in released],
                )
            items = [
                _item(v)
                for v in conn.execute(
                    f"SELECT {_COLUMNS} FROM queue_items WHERE queue = ?", (limits.name,)
                )
            ]
            old = [(i.seq,) for i in items if forgettable(i, now_ms, limits.rate_ms)]
            if old:
                conn.executemany("DELETE FROM queue_items WHERE seq = ?", old)
            admission = plan_admission(limits, items, now_ms, runnable)
            conn.executemany(
                "UPDATE queue_items SET state = 'admitted', admitted_ms = ? WHERE seq = ?",
                [(now_ms, i.seq) for i in admission.items],
            )
            return admission

        return await self._in_writer(write)

    async def release_queued(self, id: str) -> str | None:
        """Run ``id`` ended: its admitted item frees its slot; returns its queue, or None."""

        def write(conn: sqlite3.Connection) -> str | None:
            found = conn.execute(
                "SELECT seq, queue FROM queue_items WHERE id = ? AND state = 'admitted'", (id,)
            ).fetchone()
            if found is None:
                return None
            conn.execute("UPDATE queue_items SET state = 'done' WHERE seq = ?", (found[0],))
            return str(found[1])

        return await self._in_writer(write)

    async def unqueue(self, id: str) -> QueueItem | None:
        """Removes ``id``'s item if it is still queued; returns it, or None."""

        def write(conn: sqlite3.Connection) -> QueueItem | None:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM queue_items WHERE id = ? AND state = 'queued'", (id,)
            ).fetchone()
            if found is None:
                return None
            item = _item(found)
            conn.execute("DELETE FROM queue_items WHERE seq = ?", (item.seq,))
            return item

        return await self._in_writer(write)

    async def queue_items(self, *, done: bool = False) -> builtins.list[QueueItem]:
        """Every queued or admitted item (``done``: and every done one kept), by arrival."""
        where = "" if done else " WHERE state != 'done'"

        def read(conn: sqlite3.Connection) -> builtins.list[QueueItem]:
            try:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM queue_items{where} ORDER BY seq"
                ).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"reading the queue items failed: {e}") from e
            return [_item(v) for v in rows]

        items: builtins.list[QueueItem] = await self._read(read)
        return items
