"""Deleting finished runs: `Store.delete_runs` in each backend (memory, SQLite, Postgres).

A run is deleted whole: its row and the journal records of every run of its
id (continue-as-new chains included), where its events, streams, attributes
and signals live. Queue items are not touched: a done item leaves with its
queue's rate window, and a queued or admitted one belongs to a run that has
not finished.

The rule: the check that a run may go (its row says completed, failed or
cancelled, ended before the cutoff) is made inside the write that deletes it,
so a run started again under its id meanwhile (``IdPolicy.REPLACE``) is never
deleted. A ``continued`` row is never deleted: its next run is about to start.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Final, TypeVar

from fusee._status import RunStatus
from fusee.store._base import RunRow

__all__ = [
    "DELETABLE_STATUSES",
    "MemoryDeletes",
    "PostgresDeletes",
    "SqliteDeletes",
    "check_delete_args",
    "deletable",
]

_T = TypeVar("_T")

DELETABLE_STATUSES: Final = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
"""The statuses of runs `Store.delete_runs` deletes."""

_STATUS_LIST: Final = tuple(sorted(s.value for s in DELETABLE_STATUSES))


def check_delete_args(
    ids: Collection[str] | None, finished_before_ms: int | None, limit: int
) -> builtins.list[str] | None:
    """Checks `Store.delete_runs`'s arguments; returns ``ids`` as a list without repeats.

    Example:
        >>> check_delete_args(["a", "b", "a"], None, 10)
        ['a', 'b']
    """
    if type(limit) is not int or limit < 1:
        raise ValueError(f"limit must be an int of 1 or more, not {limit!r}")
    if finished_before_ms is not None and type(finished_before_ms) is not int:
        raise ValueError(
            f"finished_before_ms must be Unix time in milliseconds (an int), "
            f"not {finished_before_ms!r}"
        )
    if ids is None:
        return None
    if isinstance(ids, str):
        raise TypeError(f"ids must be a collection of run ids, not the string {ids!r}")
    return list(dict.fromkeys(ids))[:limit]


def deletable(row: RunRow | None, finished_before_ms: int | None) -> bool:
    """Whether `Store.delete_runs` deletes the run of ``row``.

    Example:
        >>> deletable(RunRow("a", 1, "wf", "completed", 0, finished_ms=5), 10)
        True
        >>> deletable(RunRow("a", 1, "wf", "running", 0), None)
        False
    """
    if row is None or row.status not in DELETABLE_STATUSES:
        return False
    if finished_before_ms is None:
        return True
    return row.finished_ms is not None and row.finished_ms < finished_before_ms


class MemoryDeletes:
    """`Store.delete_runs` for `fusee.store.memory.MemoryStore`."""

    _rows: dict[str, RunRow]
    _journals: dict[tuple[str, int], builtins.list[tuple[int, bytes]]]
    _latest_run: dict[str, int]
    _check_open: Callable[[], None]

    async def delete_runs(
        self,
        ids: Collection[str] | None = None,
        *,
        finished_before_ms: int | None = None,
        limit: int = 100,
    ) -> builtins.list[str]:
        """Deletes up to ``limit`` finished runs and their journals; returns their ids.

        Args:
            ids: Only these runs (None: any finished run).
            finished_before_ms: Only runs that ended before this time (None:
                whenever they ended).
            limit: At most this many runs.

        Example:
            >>> import asyncio
            >>> from fusee.store import Entry, MemoryStore, RunRow
            >>> async def demo() -> tuple[list[str], RunRow | None]:
            ...     store = MemoryStore()
            ...     await store.open()
            ...     await store.append([Entry(1, "a", 1, b"x")],
            ...                        [RunRow("a", 1, "wf", "completed", 0, 5)])
            ...     return await store.delete_runs(finished_before_ms=10), await store.get("a")
            >>> asyncio.run(demo())
            (['a'], None)
        """
        self._check_open()
        wanted = check_delete_args(ids, finished_before_ms, limit)
        if wanted is None:
            rows = sorted(
                (r for r in self._rows.values() if deletable(r, finished_before_ms)),
                key=lambda r: (r.started_ms, r.id),
            )[:limit]
            gone = [r.id for r in rows]
        else:
            gone = [id for id in wanted if deletable(self._rows.get(id), finished_before_ms)]
        if not gone:
            return []
        doomed = set(gone)
        for key in [k for k in self._journals if k[0] in doomed]:
            del self._journals[key]
        for id in gone:
            del self._rows[id]
            self._latest_run.pop(id, None)
        return gone


# The highest LSN the store ever held, kept in `meta` before records are
# deleted: the store's next LSNs stay above every one it gave out, and its
# high-water mark (`fusee.store._sqlite_mark`) never finds it behind.
_SQLITE_KEEP_FLOOR: Final = (
    "INSERT INTO meta (key, value) SELECT 'lsn_floor', coalesce(max(lsn), 0) FROM journal"
    " WHERE true ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)"
)
_SQLITE_STATUS_IN: Final = f"status IN ({', '.join(repr(s) for s in _STATUS_LIST)})"


def sqlite_lsn_floor(conn: sqlite3.Connection) -> int:
    """The LSN floor `delete_runs` kept in an SQLite store's ``meta`` table (0 if none).

    Example:
        >>> conn = sqlite3.connect(":memory:")
        >>> _ = conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER)")
        >>> sqlite_lsn_floor(conn)
        0
    """
    found = conn.execute("SELECT value FROM meta WHERE key = 'lsn_floor'").fetchone()
    return int(found[0]) if found is not None and type(found[0]) is int else 0


def _sqlite_delete(
    conn: sqlite3.Connection,
    wanted: builtins.list[str] | None,
    finished_before_ms: int | None,
    limit: int,
) -> builtins.list[str]:
    age = ""
    params: tuple[Any, ...] = ()
    if finished_before_ms is not None:
        # started_ms <= finished_ms: the bound on the start lets the status
        # index narrow the scan to runs old enough.
        age = " AND started_ms < ? AND finished_ms < ?"
        params = (finished_before_ms, finished_before_ms)
    if wanted is None:
        gone = [
            str(r[0])
            for r in conn.execute(
                f"SELECT id FROM runs WHERE {_SQLITE_STATUS_IN}{age}"
                " ORDER BY started_ms, id LIMIT ?",
                (*params, limit),
            )
        ]
    else:
        gone = [
            id
            for id in wanted
            if conn.execute(
                f"SELECT 1 FROM runs WHERE id = ? AND {_SQLITE_STATUS_IN}{age}", (id, *params)
            ).fetchone()
            is not None
        ]
    if gone:
        conn.execute(_SQLITE_KEEP_FLOOR)
        conn.executemany("DELETE FROM runs WHERE id = ?", [(id,) for id in gone])
        conn.executemany("DELETE FROM journal WHERE id = ?", [(id,) for id in gone])
    return gone


class SqliteDeletes:
    """`Store.delete_runs` for `fusee.store.sqlite.SqliteStore`, in its writer's queue."""

    _in_writer: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

    async def delete_runs(
        self,
        ids: Collection[str] | None = None,
        *,
        finished_before_ms: int | None = None,
        limit: int = 100,
    ) -> builtins.list[str]:
        """Deletes up to ``limit`` finished runs and their journals in one transaction.

        Args:
            ids: Only these runs (None: any finished run, oldest start first).
            finished_before_ms: Only runs that ended before this time (None:
                whenever they ended).
            limit: At most this many runs.

        Returns:
            The ids deleted.

        Raises:
            StoreError: A read-only or client store, or the write failed
                (nothing is deleted).

        Example:
            >>> import asyncio, tempfile
            >>> from fusee.store import SqliteStore
            >>> async def demo(directory: str) -> list[str]:
            ...     store = SqliteStore(directory, durability="none")
            ...     await store.open()
            ...     try:
            ...         return await store.delete_runs(["nobody"])
            ...     finally:
            ...         await store.close()
            >>> with tempfile.TemporaryDirectory() as d:
            ...     asyncio.run(demo(d))
            []
        """
        wanted = check_delete_args(ids, finished_before_ms, limit)
        if wanted == []:
            return []
        gone: builtins.list[str] = await self._in_writer(
            lambda conn: _sqlite_delete(conn, wanted, finished_before_ms, limit)
        )
        return gone


class PostgresDeletes:
    """`Store.delete_runs` for `fusee.store.postgres.PostgresStore`: one statement."""

    _q: str
    _query: Callable[..., Awaitable[Any]]
    _check_writable: Callable[[], None]

    async def delete_runs(
        self,
        ids: Collection[str] | None = None,
        *,
        finished_before_ms: int | None = None,
        limit: int = 100,
    ) -> builtins.list[str]:
        """Deletes up to ``limit`` finished runs and their journals in one statement.

        Rows another transaction holds are skipped (``SKIP LOCKED``): workers
        sharing the store may sweep it at once.

        Args:
            ids: Only these runs (None: any finished run, oldest start first).
            finished_before_ms: Only runs that ended before this time (None:
                whenever they ended).
            limit: At most this many runs.

        Returns:
            The ids deleted.

        Raises:
            StoreError: A read-only or client store, or the write failed.

        Example:
            >>> import asyncio
            >>> from fusee.store.postgres import PostgresStore
            >>> asyncio.run(PostgresStore("postgresql://h/db").delete_runs())
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        wanted = check_delete_args(ids, finished_before_ms, limit)
        if wanted == []:
            return []
        q = self._q
        sql = (
            f"WITH gone AS (DELETE FROM {q}.runs WHERE id IN (SELECT id FROM {q}.runs"
            " WHERE status = ANY($1::text[])"
            " AND ($2::bigint IS NULL OR (started_ms < $2 AND finished_ms < $2))"
            " AND ($3::text[] IS NULL OR id = ANY($3::text[]))"
            " ORDER BY started_ms, id LIMIT $4 FOR UPDATE SKIP LOCKED)"
            " AND status = ANY($1::text[]) RETURNING id, started_ms),"
            f" records AS (DELETE FROM {q}.journal WHERE id IN (SELECT id FROM gone))"
            " SELECT id FROM gone ORDER BY started_ms, id"
        )
        found = await self._query(
            lambda conn: conn.fetch(sql, list(_STATUS_LIST), finished_before_ms, wanted, limit),
            "deleting runs from",
        )
        gone = [str(r[0]) for r in found]
        if wanted is not None:
            # In the order asked, as the other stores answer.
            order = {id: n for n, id in enumerate(wanted)}
            gone.sort(key=order.__getitem__)
        return gone
